"""EventLog: columnar storage, filtering, pandas, files, marks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import gpuviz
from gpuviz import BFCAllocator, EventLog, LogFormatError, SimUpstream, load, mark, span
from gpuviz.log.fileio import ARROW_SCHEMA
from gpuviz.log.schema import MarkPhase

BASE = 1 << 40


def small_run(log: EventLog | None = None) -> BFCAllocator:
    alloc = BFCAllocator(SimUpstream("1GiB"), growth=False, log=log)
    a = alloc.allocate(1000, tag="weights")
    b = alloc.allocate(2000, tag="grads")
    alloc.free(a)
    alloc.free(b)
    return alloc


def test_events_of_a_small_run_in_order() -> None:
    alloc = small_run()
    rows = [(e.seq, e.kind, e.address, e.size, e.requested, e.tag) for e in alloc.log]
    assert rows == [
        (0, "segment_alloc", BASE, 1 << 30, 0, None),
        (1, "split", BASE, 1024, 0, None),
        (2, "alloc", BASE, 1024, 1000, "weights"),
        (3, "split", BASE + 1024, 2048, 0, None),
        (4, "alloc", BASE + 1024, 2048, 2000, "grads"),
        (5, "free", BASE, 1024, 1000, "weights"),
        (6, "free", BASE + 1024, 2048, 2000, "grads"),
        (7, "merge", BASE + 1024, (1 << 30) - 1024, 0, None),
        (8, "merge", BASE, 1 << 30, 0, None),
    ]
    assert all(e.device == "GPU:0" and e.segment == BASE for e in alloc.log)
    times = alloc.log["time_ns"]
    assert (np.diff(times) >= 0).all()
    assert alloc.log[-1].largest_free == 1 << 30


def test_columns_are_numpy_arrays_not_objects() -> None:
    log = small_run().log
    assert log["size"].dtype == np.int64
    assert log["kind"].dtype == np.uint8
    assert len(log) == 9
    with pytest.raises(KeyError, match="no column 'bogus'"):
        log["bogus"]
    with pytest.raises(IndexError):
        log[99]


def test_staged_rows_are_flushed_in_batches() -> None:
    log = EventLog(flush_rows=3)
    small_run(log)
    assert len(log._blocks) == 3 and not log._staged  # 9 events flushed in blocks of 3, nothing staged
    assert len(log) == 9 and log["seq"].tolist() == list(range(9))


def test_reading_a_growing_log_copies_only_the_new_rows() -> None:
    """A live view reads the log again and again: earlier rows are not copied each time,
    and a snapshot taken earlier never changes."""
    log = EventLog(flush_rows=5)
    alloc = small_run(log)
    first = log.columns
    snapshot = {name: column.copy() for name, column in first.items()}
    for _ in range(20):
        alloc.free(alloc.allocate(512))
    second = log.columns
    assert len(second["seq"]) == len(log) == len(first["seq"]) + 80  # split, alloc, free, merge each
    assert np.shares_memory(first["address"], second["address"])
    for name, column in snapshot.items():
        np.testing.assert_array_equal(first[name], column)
    assert second["seq"].tolist() == list(range(len(log)))
    assert [e.kind for e in log][-4:] == ["split", "alloc", "free", "merge"]


def test_filter_by_kind_device_time_and_tag() -> None:
    log = EventLog()
    small_run(log)
    other = BFCAllocator(SimUpstream("1GiB"), device="GPU:1", log=log)
    other.allocate(10, tag="weights")
    allocs = log.filter(kind="alloc")
    assert allocs["seq"].tolist() == [2, 4, 11]
    assert log.filter(kind=["alloc", "free"], device="GPU:0")["seq"].tolist() == [2, 4, 5, 6]
    assert log.filter(tag="weights")["seq"].tolist() == [2, 5, 11]
    assert len(log.filter(tag="no such tag")) == 0
    t = log["time_ns"]
    assert log.filter(start_ns=int(t[3]), end_ns=int(t[5]))["seq"].tolist() == [
        i for i in range(len(log)) if t[3] <= t[i] < t[5]
    ]
    assert log[2:4]["seq"].tolist() == [2, 3]
    with pytest.raises(ValueError, match="unknown event kind 'allocc'"):
        log.filter(kind="allocc")
    with pytest.raises(ValueError, match="device 'TPU:0' is not in this log"):
        log.filter(device="TPU:0")
    with pytest.raises(TypeError, match="read-only view"):
        allocs.mark("x")


def test_to_pandas() -> None:
    frame = small_run().log.to_pandas()
    assert list(frame["kind"]) == [
        "segment_alloc",
        "split",
        "alloc",
        "split",
        "alloc",
        "free",
        "free",
        "merge",
        "merge",
    ]
    assert frame["tag"][:2].isna().all() and frame["tag"][2] == "weights"
    assert set(frame["device"]) == {"GPU:0"}
    assert frame["size"].dtype == np.int64


def test_marks_and_spans() -> None:
    log = EventLog()
    mark("step 3", log=log)
    with span("forward", log=log):
        pass
    with gpuviz.activate(log):
        mark("inside")
    events = [(e.kind, e.flags, e.tag, e.device) for e in log]
    assert events == [
        ("mark", MarkPhase.POINT, "step 3", None),
        ("mark", MarkPhase.BEGIN, "forward", None),
        ("mark", MarkPhase.END, "forward", None),
        ("mark", MarkPhase.POINT, "inside", None),
    ]
    before = len(gpuviz.default_log())
    mark("default")
    assert len(gpuviz.default_log()) == before + 1


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    log = EventLog(meta={"run": "test"})
    alloc = small_run(log)
    mark("done", log=log)
    path = tmp_path / "run.arrow"
    log.save(path)
    loaded = load(path)
    assert list(loaded) == list(log)
    assert loaded.truncated is False
    assert loaded.meta["run"] == "test"
    assert loaded.devices[0].name == "GPU:0"
    assert loaded.devices[0].options["memory_limit"] == alloc.memory_limit
    assert loaded.devices[0].options["growth"] is False
    header = loaded.header
    assert header["units"]["time"] == "ns" and header["units"]["size"] == "bytes"
    schema = ipc.open_stream(path.read_bytes()).schema
    assert schema.metadata[b"gpuviz.magic"] == b"gpuviz-eventlog"
    assert schema.metadata[b"gpuviz.format_version"] == b"1"


def test_empty_log_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "empty.arrow"
    EventLog().save(path)
    assert len(load(path)) == 0


def test_to_parquet(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "run.parquet"
    small_run().log.to_parquet(path)
    table = pq.read_table(path)
    assert table.num_rows == 9
    assert table.column("kind").to_pylist()[0] == "segment_alloc"
    assert table.schema.metadata[b"gpuviz.format_version"] == b"1"


def test_other_format_version_is_rejected_clearly(tmp_path: Path) -> None:
    path = tmp_path / "v99.arrow"
    schema = ARROW_SCHEMA.with_metadata(
        {"gpuviz.magic": "gpuviz-eventlog", "gpuviz.format_version": "99", "gpuviz.header": "{}"}
    )
    with open(path, "wb") as f, ipc.new_stream(f, schema):
        pass
    with pytest.raises(LogFormatError, match="format version 99; this gpuviz reads version 1"):
        load(path)


def test_files_that_are_not_gpuviz_logs(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.arrow"
    garbage.write_bytes(b"this is not arrow at all" * 10)
    with pytest.raises(LogFormatError, match="not a gpuviz event log"):
        load(garbage)
    empty = tmp_path / "empty.arrow"
    empty.write_bytes(b"")
    with pytest.raises(LogFormatError, match="empty, truncated before its header"):
        load(empty)
    other = tmp_path / "other.arrow"
    table = pa.table({"x": [1, 2]})
    with open(other, "wb") as f, ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    with pytest.raises(LogFormatError, match="no gpuviz magic"):
        load(other)


def test_truncated_file_loads_its_complete_batches(tmp_path: Path) -> None:
    log = EventLog(flush_rows=4)
    small_run(log)
    mark("end", log=log)  # 10 events -> batches of 4, 4, 2
    path = tmp_path / "full.arrow"
    log.record_to(path)
    log.close()
    data = path.read_bytes()
    cut = tmp_path / "cut.arrow"
    cut.write_bytes(data[: len(data) - 200])
    loaded = load(cut)
    assert loaded.truncated is True
    assert len(loaded) in (4, 8)
    assert list(loaded) == list(log)[: len(loaded)]


def test_recording_to_a_file_writes_incrementally(tmp_path: Path) -> None:
    path = tmp_path / "live.arrow"
    log = EventLog(path, flush_interval_s=0.05)
    alloc = BFCAllocator(SimUpstream("1GiB"), log=log)
    alloc.allocate(100)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(load(path)) < 3:
        time.sleep(0.02)
    assert [e.kind for e in load(path)] == ["segment_alloc", "split", "alloc"]
    alloc.allocate(200)
    log.close()
    assert len(load(path)) == 5
    with pytest.raises(RuntimeError, match="already records"):
        log2 = EventLog(tmp_path / "a.arrow")
        log2.record_to(tmp_path / "b.arrow")


CHILD = textwrap.dedent(
    """
    import os, sys, time
    from gpuviz import BFCAllocator, EventLog, SimUpstream
    log = EventLog(sys.argv[1], flush_rows=1000, flush_interval_s=0.05)
    alloc = BFCAllocator(SimUpstream("1GiB"), log=log)
    live = []
    for i in range(5000):
        live.append(alloc.allocate(1000 + i))
        if len(live) > 20:
            alloc.free(live.pop(0))
    log.flush()
    print(len(log), flush=True)
    for i in range(10):              # these stay staged: fewer than flush_rows, no time to flush
        alloc.allocate(10)
    os.kill(os.getpid(), 9)
    """
)


def test_a_killed_recorder_leaves_a_loadable_file(tmp_path: Path) -> None:
    path = tmp_path / "crash.arrow"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    flushed = int(proc.stdout.strip())
    loaded = load(path)
    assert len(loaded) == flushed
    assert loaded["seq"].tolist() == list(range(flushed))
    assert [e.kind for e in loaded][:3] == ["segment_alloc", "split", "alloc"]
    assert os.path.getsize(path) > 0
    json.dumps(loaded.devices[0].options)
