"""EventLog as a log: columns, events, queries, views, pandas, marks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from eventlogs import BASE, small_run

import gpuviz
from gpuviz import EventLog, SimUpstream, mark, span
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.log.schema import ROW_DTYPE, MarkPhase


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
