"""EventLog: columnar storage, filtering, pandas, files, marks."""

from __future__ import annotations

import json
import os
import re
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
from waiting import wait_until

import gpuviz
from gpuviz import EventLog, LogFormatError, SimUpstream, load, mark, span
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.capture.recorder import native_available
from gpuviz.log.arrowfile import ARROW_SCHEMA
from gpuviz.log.schema import ROW_DTYPE, MarkPhase

BASE = 1 << 40


def small_run(log: EventLog | None = None) -> ReferenceBFCAllocator:
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), growth=False, log=log)
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
    small_run(log)
    if log._recorder.arena is not None and native_available():
        assert not log._blocks and len(log._recorder.staged) == 9 * ROW_DTYPE.itemsize  # no flush: nothing to bound
        assert log._recorder.arena.due() == (512 << 10) - 128 * ROW_DTYPE.itemsize  # near the first chunk's end
    assert len(log) == 9 and log["seq"].tolist() == list(range(9))  # a read flushes first


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


def test_rows_since_reads_the_new_rows_from_columns_blocks_and_staging_alike(tmp_path: Path) -> None:
    """``rows_since(start)`` gives exactly rows ``start..`` whether they were split into columns
    already, still sit in flushed blocks or are staged; the blocks stay unsplit."""
    log = EventLog(tmp_path / "run.arrow", flush_rows=9, flush_interval_s=3600)  # to a file: blocks of 3
    alloc = small_run(log)  # 9 events: 3 blocks of 3
    before = {name: log[name].tolist() for name in ("time_ns", "kind", "address", "size", "tag")}  # splits them
    for _ in range(3):
        alloc.free(alloc.allocate(512))  # 12 more: 4 blocks of 3, none split
    log.append((7, 9, 0, 0, -1, 1, 4096, 5, 6, -1, -1, 0, -1, -1))  # one staged row
    rows = log.rows_since(4)
    assert log._n_columns == 9 and len(log._blocks) == 5 and not log._recorder.staged  # nothing split, staged flushed
    assert len(rows) == len(log) - 4 == 18 and rows.dtype == ROW_DTYPE and not rows.flags.writeable
    assert rows["address"][:5].tolist() == before["address"][4:]  # from the columns
    assert rows["size"][-1] == 5 and rows["address"][-1] == 4096  # the staged row
    every = log.columns
    for name in ("time_ns", "kind", "device", "address", "size", "requested", "tag", "stack"):
        assert rows[name].tolist() == every[name][4:].tolist()
    assert len(log.rows_since(len(log))) == 0 and len(log.rows_since(0)) == 22
    with pytest.raises(ValueError, match="start must be a row position >= 0, got -1"):
        log.rows_since(-1)
    log.close()


def test_filter_by_kind_device_time_and_tag() -> None:
    log = EventLog()
    small_run(log)
    other = ReferenceBFCAllocator(SimUpstream("1GiB"), device="GPU:1", log=log)
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
    assert (header["format_version"], header["checksums"]) == (2, True)
    assert (loaded.corrupt, loaded.problems) == (False, [])
    # the random-access form: an Arrow IPC file, all events in one batch, then the end marker
    with pa.memory_map(str(path)) as source:
        reader = ipc.open_file(source)
        assert reader.schema.metadata[b"gpuviz.magic"] == b"gpuviz-eventlog"
        assert reader.schema.metadata[b"gpuviz.format_version"] == b"2"
        assert len(reader.schema.metadata[b"gpuviz.header_checksum"]) == 16
        assert [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)] == [10, 0]
        assert json.loads(reader.get_batch_with_custom_metadata(1)[1][b"gpuviz.end"]) == {"events": 10, "batches": 1}


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
    assert table.schema.metadata[b"gpuviz.format_version"] == b"2"


def test_other_format_version_is_rejected_clearly(tmp_path: Path) -> None:
    path = tmp_path / "v99.arrow"
    schema = ARROW_SCHEMA.with_metadata(
        {"gpuviz.magic": "gpuviz-eventlog", "gpuviz.format_version": "99", "gpuviz.header": "{}"}
    )
    with open(path, "wb") as f, ipc.new_stream(f, schema):
        pass
    with pytest.raises(LogFormatError, match="format version 99; this gpuviz reads versions 1, 2"):
        load(path)


def test_files_that_are_not_gpuviz_logs(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.arrow"
    garbage.write_bytes(b"this is not arrow at all" * 10)
    with pytest.raises(LogFormatError, match="not a gpuviz event log"):
        load(garbage)
    empty = tmp_path / "empty.arrow"
    empty.write_bytes(b"")
    with pytest.raises(LogFormatError, match="it is empty"):
        load(empty)
    other = tmp_path / "other.arrow"
    table = pa.table({"x": [1, 2]})
    with open(other, "wb") as f, ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    with pytest.raises(LogFormatError, match="no gpuviz magic"):
        load(other)


def recorded_stream(tmp_path: Path) -> tuple[EventLog, bytes]:
    """A log of 10 events recorded to a file in batches of 4, 4 and 2 (``flush_rows=12``), and
    the file's bytes before ``close``: the stream form, every batch on disk, no end marker."""
    log = EventLog(flush_rows=12)
    small_run(log)
    mark("end", log=log)
    path = tmp_path / "recording.arrow"
    log.record_to(path)
    stream = path.read_bytes()
    log.close()
    return log, stream


def test_truncated_file_loads_its_complete_batches(tmp_path: Path) -> None:
    log, stream = recorded_stream(tmp_path)
    cut = tmp_path / "cut.arrow"
    cut.write_bytes(stream[: len(stream) - 200])
    loaded = load(cut)
    assert loaded.truncated is True and loaded.corrupt is False
    assert len(loaded) == 8
    assert list(loaded) == list(log)[:8]
    assert loaded.problems[0].startswith("batch 3 is cut short or unreadable")


def test_a_file_cut_at_a_batch_boundary_is_flagged_truncated(tmp_path: Path) -> None:
    """Every batch is complete, but the end-of-log marker written by close is missing."""
    log, stream = recorded_stream(tmp_path)
    whole = tmp_path / "whole.arrow"
    whole.write_bytes(stream)
    loaded = load(whole)
    assert list(loaded) == list(log)
    assert (loaded.truncated, loaded.corrupt) == (True, False)
    assert loaded.problems == [
        "the file ends after batch 3 without its end-of-log marker (cut short)",
        "loaded the first 10 events",
    ]


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


def flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0x10]) + data[offset + 1 :]


def test_a_damaged_batch_ends_the_readable_prefix(tmp_path: Path) -> None:
    log, stream = recorded_stream(tmp_path)
    # the second batch holds the alloc of 2048 bytes at BASE + 1024 (event 4): damage its size
    value = np.int64(2000).tobytes()  # requested bytes of event 4, only there and in event 6
    offset = stream.index(value)
    damaged = tmp_path / "damaged.arrow"
    damaged.write_bytes(flip(stream, offset))
    loaded = load(damaged)
    assert (loaded.truncated, loaded.corrupt) == (True, True)
    assert list(loaded) == list(log)[:4]
    assert loaded.problems == [
        "batch 2 (events from 4) is damaged: rows 0-3 of it do not match their checksum",
        "loaded the first 4 events",
    ]


def test_a_damaged_chunk_of_a_saved_log_keeps_the_chunks_before_it(tmp_path: Path) -> None:
    log = EventLog()
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), log=log)
    for size in range(1, 40_000):
        alloc.free(alloc.allocate(size * 256))
    path = tmp_path / "run.arrow"
    log.save(path)
    data = path.read_bytes()
    # the requested bytes of the alloc and free of 30001 * 256 bytes: in the second chunk of 65536 events
    event = int(np.flatnonzero(log["requested"] == 30_001 * 256)[0])
    assert 65536 <= event < 2 * 65536 and len(log) == 88194
    offset = data.index(np.array([30_001 * 256, 30_001 * 256], dtype=np.int64).tobytes())
    path.write_bytes(flip(data, offset))
    loaded = load(path)
    assert (len(loaded), loaded.truncated, loaded.corrupt) == (65536, True, True)
    assert loaded["size"].tolist() == log["size"][:65536].tolist()
    assert (
        loaded.problems[0] == "batch 0 (events from 0) is damaged: rows 65536-88193 of it do not match their checksum"
    )


def test_a_damaged_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.arrow"
    small_run().log.save(path)
    data = path.read_bytes()
    offset = data.index(b'"units"')
    path.write_bytes(data[:offset] + b"'" + data[offset + 1 :])
    with pytest.raises(LogFormatError, match="the header is damaged"):
        load(path)


def write_v1(path: Path, log: EventLog, *, delta: bytes | None = None, header: bytes | None = None) -> None:
    """Write ``log`` as format version 1 wrote it (no checksums, no end marker)."""
    header = header or json.dumps({"clock": "c", "units": {}, "devices": [{"name": d.name, "options": d.options}
                                   for d in log.devices], "meta": log.meta}).encode()  # fmt: skip
    schema = ARROW_SCHEMA.with_metadata(
        {"gpuviz.magic": "gpuviz-eventlog", "gpuviz.format_version": "1", "gpuviz.header": header}
    )
    delta = delta or json.dumps({"strings": list(log.strings), "stacks": []}).encode()
    columns = log.columns
    with open(path, "wb") as f, ipc.new_stream(f, schema) as writer:
        batch = pa.RecordBatch.from_arrays([pa.array(columns[n]) for n in ARROW_SCHEMA.names], schema=ARROW_SCHEMA)
        writer.write_batch(batch, custom_metadata={"gpuviz.delta": delta})


def test_version_1_files_still_load_flagged_without_checksums(tmp_path: Path) -> None:
    log = small_run().log
    path = tmp_path / "v1.arrow"
    write_v1(path, log)
    loaded = load(path)
    assert list(loaded) == list(log)
    assert (loaded.header["format_version"], loaded.header["checksums"]) == (1, False)
    assert (loaded.truncated, loaded.corrupt) == (False, False)


def test_indices_outside_the_side_tables_are_refused(tmp_path: Path) -> None:
    log = small_run().log  # two strings: weights, grads
    columns = {name: column.copy() for name, column in log.columns.items()}
    columns["tag"][5] = 2
    bad = EventLog()
    bad.devices, bad.strings = log.devices, log.strings
    bad._set_columns(columns)
    bad.save(tmp_path / "v2.arrow")
    with pytest.raises(LogFormatError, match="event 5 has tag 2, outside the 2 strings of the log"):
        load(tmp_path / "v2.arrow")
    for name, value, message in [
        ("device", 1, "event 3 has device 1, outside the 1 devices"),
        ("kind", 12, "event 3 has kind 12, outside the 12 kinds"),
        ("stack", 0, "event 3 has stack 0, outside the 0 stacks"),
        ("seq", 7, "event 3 has sequence number 7 (expected 3)"),
    ]:
        columns = {n: column.copy() for n, column in log.columns.items()}
        columns[name][3] = value
        bad._set_columns(columns)
        write_v1(tmp_path / "v1.arrow", bad)
        with pytest.raises(LogFormatError, match=re.escape(message)):
            load(tmp_path / "v1.arrow")
    columns = {n: column.copy() for n, column in log.columns.items()}
    columns["kind"][3], columns["flags"][3] = 9, 5  # a mark with phase 5
    bad._set_columns(columns)
    write_v1(tmp_path / "v1.arrow", bad)
    message = "event 3 (mark) has flags 5; a mark's flags are one of [0, 1, 2]"
    with pytest.raises(LogFormatError, match=re.escape(message)):
        load(tmp_path / "v1.arrow")


def test_raw_decoding_errors_become_log_format_errors(tmp_path: Path) -> None:
    log = small_run().log
    path = tmp_path / "v1.arrow"
    write_v1(path, log, header=b'{"devices": [{"nom": "GPU:0"}]}')
    with pytest.raises(LogFormatError, match="KeyError"):
        load(path)
    write_v1(path, log, header=b"\xff{")
    with pytest.raises(LogFormatError, match="the header cannot be read"):
        load(path)
    write_v1(path, log, header=b"[1, 2]")
    with pytest.raises(LogFormatError, match=r"the header cannot be read \(TypeError: the header is a list"):
        load(path)
    write_v1(path, log, delta=b'{"strings": [1, 2]}')  # a damaged delta ends the prefix: nothing left
    loaded = load(path)
    assert (len(loaded), loaded.truncated, loaded.corrupt) == (0, True, True)
    assert "strings are not a list of strings" in loaded.problems[0]


def test_a_loaded_log_survives_its_file_being_replaced(tmp_path: Path) -> None:
    """Loaded columns are views of the file's memory mapping: writers never rewrite in place."""
    path = tmp_path / "run.arrow"
    log = small_run().log
    log.save(path)
    loaded = load(path)
    assert not loaded["address"].flags.writeable and not loaded["address"].flags.owndata
    EventLog().save(path)  # replaced by an empty log
    recording = EventLog(path)  # and again by a recording
    recording.close()
    assert loaded["address"].tolist() == log["address"].tolist()
    assert len(load(path)) == 0
    link = tmp_path / "link.arrow"
    link.symlink_to(path)
    log.save(link)  # writing through a symlink replaces its target; the link stays
    assert link.is_symlink() and len(load(path)) == len(log)


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
    """30 recorders killed at random moments (fast with the C row writer, fast with the Python
    recorder, slow): each file loads flagged truncated, its events in order, and the events lost
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


def test_extended_appends_rows_given_as_columns_sharing_the_tables() -> None:
    from gpuviz.log.schema import DTYPES, ROW_COLUMNS

    log = EventLog()
    log.intern_string("first")
    log.append((5, 2, 0, 0, -1, 0, 4096, 256, 100, 4096, 0, 0, 0, -1))
    rows = {name: np.array([7, 8], dtype=DTYPES[name]) for name in ROW_COLUMNS}
    extended = log.extended(rows)
    assert len(extended) == 3 and len(log) == 1
    assert extended.columns["seq"].tolist() == [0, 1, 2]
    assert extended.columns["time_ns"].tolist() == [5, 7, 8] and extended.columns["tag"].tolist() == [0, 7, 8]
    assert extended.strings is log.strings
    empty = EventLog().extended(rows)
    assert np.shares_memory(empty.columns["size"], rows["size"])  # a log without rows: the arrays, uncopied
    with pytest.raises(ValueError, match="column 'tag': 2 values of int64, expected 2 of int32"):
        log.extended({**rows, "tag": np.array([1, 2], dtype=np.int64)})
    assert len(log) == 1
