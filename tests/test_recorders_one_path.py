"""Nothing recorded is lost without a word: two recorders aimed at one path never overwrite each
other (the second is refused at open), ``save`` over a live recording is refused, temporary
files of a crashed writer are cleaned up by the next writer, and device lookup stays indexed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gpuviz
from gpuviz.log.eventlog import MAX_DEVICES, DeviceInfo, EventLog
from gpuviz.log.pathlock import PathInUse


def _record(log: EventLog, pairs: int) -> None:
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), log=log)
    for _ in range(pairs):
        alloc.free(alloc.allocate(4096))


def test_a_second_recorder_on_the_same_path_is_refused_and_the_first_keeps_its_events(tmp_path: Path) -> None:
    path = tmp_path / "run.arrow"
    first = EventLog(path)
    _record(first, 100)
    with pytest.raises(PathInUse, match=r"run\.arrow is being recorded by another recorder"):
        EventLog(path)
    other = EventLog()
    _record(other, 3)
    with pytest.raises(PathInUse):
        other.save(path)
    with pytest.raises(PathInUse):
        other.record_to(path)
    _record(first, 100)
    expected = len(first)
    first.close()
    assert len(gpuviz.load(path)) == expected and not gpuviz.load(path).truncated
    again = EventLog(path)  # a finished file is replaced, as before
    _record(again, 1)
    again.close()
    assert len(gpuviz.load(path)) == len(again)
    assert [p.name for p in tmp_path.iterdir()] == ["run.arrow"]


RECORDER = textwrap.dedent(
    """
    import sys, gpuviz
    log = gpuviz.EventLog(sys.argv[1])
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), log=log)
    for _ in range(1000):
        alloc.free(alloc.allocate(4096))
    print(len(log), flush=True)
    sys.stdin.readline()  # recording until told to stop
    log.close()
    print(len(log), flush=True)
    """
)


def test_a_recorder_in_another_process_is_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "run.arrow"
    child = subprocess.Popen(
        [sys.executable, "-c", RECORDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdin is not None
    child.stdout.readline()  # the file is open and holds events
    here = EventLog()
    with pytest.raises(PathInUse):
        here.record_to(path)
    with pytest.raises(PathInUse):
        here.save(path)
    child.stdin.write("\n")
    child.stdin.flush()
    events = int(child.stdout.readline())
    assert child.wait() == 0
    assert len(gpuviz.load(path)) == events == 1000 * 2 * 2 + 1  # alloc+split, free+merge each; segment_alloc


def test_temporaries_of_a_crashed_writer_are_removed_by_the_next_one(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    stale = tmp_path / f".run.arrow.{dead_pid}.140000.tmp"
    stale.write_bytes(b"half a log")
    live = tmp_path / f".run.arrow.{os.getpid()}.1.tmp"  # a live process's: perhaps still writing
    live.write_bytes(b"in progress")
    log = EventLog(tmp_path / "run.arrow")
    log.close()
    assert not stale.exists() and live.exists()
    stale.write_bytes(b"half a log")
    EventLog().save(tmp_path / "run.arrow")
    assert not stale.exists()


def test_devices_are_found_by_name_in_constant_time_and_capped_by_the_column() -> None:
    log = EventLog()
    for i in range(MAX_DEVICES):
        assert log.add_device(f"GPU:{i}") == i
    assert log.add_device("GPU:17", allocator="bfc") == 17 and log.devices[17].options == {"allocator": "bfc"}
    with pytest.raises(ValueError, match="a log holds at most 32,767 devices; 'GPU:32767' would be one more"):
        log.add_device(f"GPU:{MAX_DEVICES}")
    assert len(log.devices) == MAX_DEVICES
    log.devices = [DeviceInfo("node1/GPU:0", {})]  # replaced as a whole, as a run does
    assert log.add_device("node1/GPU:0") == 0 and log.add_device("GPU:0") == 1


def test_a_view_of_a_log_has_the_logs_flags_and_its_device_index() -> None:
    from gpuviz.analysis.integrity import integrity_lines

    log = EventLog()
    _record(log, 3)
    view = log[0:2]
    assert integrity_lines(view) == [] and view.file_error is None
    assert view.add_device("GPU:0") == 0
