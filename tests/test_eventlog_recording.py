"""EventLog recording: staging and flushes, recording to a file, closing it, the crash bound."""

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
import pytest
from eventlogs import recorded_stream, small_run
from waiting import wait_until

from gpuviz import EventLog, SimUpstream, load
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.capture.native import NativeBFCAllocator, native_core_available
from gpuviz.log.schema import ROW_DTYPE


def test_staged_rows_are_flushed_in_batches_when_recording_to_a_file(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "run.arrow", flush_rows=9)  # flushed at a third of flush_rows (the crash bound)
    small_run(log)
    assert len(log._blocks) == 3 and not log._recorder.staged  # 9 events flushed in blocks of 3, nothing staged
    assert len(log) == 9 and log["seq"].tolist() == list(range(9))
    log.close()


def test_flush_rows_below_three_is_refused() -> None:
    """A third of flush_rows is flushed at a time (two blocks in flight to a file, one staged)."""
    for bad in (2, 0, "4096", 4096.0):
        with pytest.raises(ValueError, match=f"flush_rows must be an int >= 3, got {bad!r}"):
            EventLog(flush_rows=bad)  # type: ignore[arg-type]
    assert len(EventLog(flush_rows=3)) == 0


def test_in_memory_the_c_recorders_leave_rows_staged_until_the_chunk_is_nearly_full() -> None:
    log = EventLog(flush_rows=6)
    if not native_core_available():
        pytest.skip("the native allocator, the recorder in C, is not built (no C compiler)")
    alloc = NativeBFCAllocator(SimUpstream("1GiB"), growth=False, log=log)  # small_run's operations
    a, b = alloc.allocate(1000, tag="weights"), alloc.allocate(2000, tag="grads")
    alloc.free(a)
    alloc.free(b)
    if log._recorder.arena is not None:
        assert not log._blocks and len(log._recorder.staged) == 9 * ROW_DTYPE.itemsize  # no flush: nothing to bound
        assert log._recorder.arena.due() == (512 << 10) - 128 * ROW_DTYPE.itemsize  # near the first chunk's end
    assert len(log) == 9 and log["seq"].tolist() == list(range(9))  # a read flushes first


def test_close_writes_the_end_marker_and_the_random_access_form(tmp_path: Path) -> None:
    log, _ = recorded_stream(tmp_path)
    loaded = load(tmp_path / "recording.arrow")
    assert list(loaded) == list(log)
    assert (loaded.truncated, loaded.corrupt) == (False, False)
    assert (tmp_path / "recording.arrow").read_bytes()[:6] == b"ARROW1"
    assert not list(tmp_path.glob(".*.tmp"))  # the temporary file was renamed over the stream


def test_a_log_still_recording_at_exit_is_finished(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        from gpuviz import EventLog, SimUpstream
        from gpuviz.capture import ReferenceBFCAllocator
        log = EventLog(sys.argv[1])
        ReferenceBFCAllocator(SimUpstream("1GiB"), log=log).allocate(100)
        """
    )  # never closed: the interpreter's exit closes it
    path = tmp_path / "exit.arrow"
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, timeout=120)
    loaded = load(path)
    assert [e.kind for e in loaded] == ["segment_alloc", "split", "alloc"]
    assert (loaded.truncated, path.read_bytes()[:6]) == (False, b"ARROW1")


def test_recording_to_a_file_writes_incrementally(tmp_path: Path) -> None:
    path = tmp_path / "live.arrow"
    log = EventLog(path, flush_interval_s=0.05)
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), log=log)
    alloc.allocate(100)
    wait_until(lambda: len(load(path)) >= 3, "the interval flush writes the first events", poll_s=0.02)
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
    from gpuviz import EventLog, SimUpstream
    from gpuviz.capture import ReferenceBFCAllocator
    log = EventLog(sys.argv[1], flush_rows=1000, flush_interval_s=0.05)
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), log=log)
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
    assert len(loaded) == flushed and loaded.truncated is True
    assert loaded["seq"].tolist() == list(range(flushed))
    assert [e.kind for e in loaded][:3] == ["segment_alloc", "split", "alloc"]
    assert os.path.getsize(path) > 0
    json.dumps(loaded.devices[0].options)


# Forks one recording child per request (a single-threaded parent forks safely), so that
# each kill costs a fork, not an interpreter start. A child records with the defaults
# (flush_rows=4096, flush_interval_s=0.1) until it is killed and, after every operation,
# writes the log's length and the time into the shared progress file: [operations done,
# start time, then (events, time) per operation].
ZYGOTE = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    from gpuviz import EventLog, SimUpstream
    from gpuviz.capture import ReferenceBFCAllocator
    for line in sys.stdin:
        path, progress_path, mode = line.split()
        pid = os.fork()
        if pid:
            print(pid, flush=True)
            print(os.waitpid(pid, 0)[1], flush=True)
            continue
        os.environ["GPUVIZ_NATIVE"] = "0" if mode == "python" else "1"
        progress = np.memmap(progress_path, dtype=np.int64, mode="r+")
        slots = (len(progress) - 2) // 2
        log = EventLog(path)
        alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), log=log)
        live, i = [], 0
        progress[1] = time.perf_counter_ns()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            live.append(alloc.allocate(1000 + i % 5000))
            if len(live) > 20:
                alloc.free(live.pop(0))
            if i < slots:
                progress[2 + 2 * i], progress[3 + 2 * i] = len(log), time.perf_counter_ns()
                progress[0] = i + 1
            if mode == "slow":
                time.sleep(0.0002)
            i += 1
        os._exit(0)
    """
)


@pytest.mark.slow
def test_a_recorder_killed_at_any_moment_loses_at_most_4096_events(tmp_path: Path) -> None:
    """30 recorders killed at random moments (fast with the native allocator, fast with the Python
    one, slow): each file loads flagged truncated, its events in order, and the events lost
    are at most 4096 (a recorder never runs more than two blocks ahead of the file). How recent
    the lost events were (within the flush interval, 100 ms, where the file's writer thread gets
    a core) depends on the machine's load: benchmarks/bench_crash.py measures it."""
    zygote = subprocess.Popen(
        [sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
    )
    assert zygote.stdin is not None and zygote.stdout is not None
    rng = np.random.default_rng(11)
    slots = 1 << 20
    try:
        for case in range(30):
            mode = ("native", "python", "slow")[case % 3]
            path, progress_path = tmp_path / f"kill{case}.arrow", tmp_path / f"progress{case}"
            progress_path.write_bytes(bytes(8 * (2 + 2 * slots)))
            zygote.stdin.write(f"{path} {progress_path} {mode}\n")
            pid = int(zygote.stdout.readline())
            progress = np.memmap(progress_path, dtype=np.int64, mode="r")
            wait_until(lambda p=progress: p[0] > 0, "the child records its first operation", poll_s=0.001)
            time.sleep(float(rng.uniform(0, 0.3)))  # a random moment to kill it at (not a synchronisation)
            os.kill(pid, signal.SIGKILL)
            assert int(zygote.stdout.readline()) == signal.SIGKILL  # the wait status of a killed child
            loaded = load(path)
            assert loaded.truncated is True, (case, mode)
            steps = int(progress[0])
            counts = progress[2 : 2 + 2 * steps : 2]
            # lost events: counted after the last whole operation (an operation cut by the kill
            # adds at most 4 more, not counted here)
            lost = int(counts[-1]) - len(loaded)
            assert lost <= 4096, (case, mode, lost)
            np.testing.assert_array_equal(loaded["seq"], np.arange(len(loaded)))
            del progress
            path.unlink()
            progress_path.unlink()
    finally:
        zygote.stdin.close()
        zygote.wait(timeout=30)


def test_a_dropped_log_is_freed_at_once_its_recorder_holding_no_reference_to_it(tmp_path: Path) -> None:
    import gc
    import weakref

    gc.disable()
    try:
        for path in (None, tmp_path / "dropped.arrow"):
            log = EventLog(path)
            small_run(log)
            log.close()  # a log that recorded to a file, finished
            dropped = weakref.ref(log)
            del log
            assert dropped() is None  # no cycle: freed without the garbage collector
    finally:
        gc.enable()
