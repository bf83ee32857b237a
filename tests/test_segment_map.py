"""Segments that grow and shrink: ``segment_map`` / ``segment_unmap`` in the heap builders (Python
and C), replay (Python and C, with checkpoints), the timeline's reserved bytes, the log file,
and the live follower -- hand-computed cases at the simulated base, and random ones."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuviz import EventLog
from gpuviz.analysis.live import LiveFollower
from gpuviz.analysis.replay import replay
from gpuviz.analysis.timeline import operation_ends, timeline_series
from gpuviz.base.units import MiB
from gpuviz.log.files import load, save
from gpuviz.log.heapbuilder import HeapConflict, NativeHeapBuilder, PythonHeapBuilder, native_heap_available
from gpuviz.log.schema import KIND_NAMES, Kind

BASE = 1 << 40
BUILDERS = [PythonHeapBuilder] + ([NativeHeapBuilder] if native_heap_available() else [])


def _events(log: EventLog) -> list[tuple[str, int, int, int]]:
    """(kind, address - BASE, size, segment - BASE) of every event."""
    log.flush()
    c = log.columns
    return [
        (KIND_NAMES[k], a - BASE, s, g - BASE)
        for k, a, s, g in zip(
            c["kind"].tolist(), c["address"].tolist(), c["size"].tolist(), c["segment"].tolist(), strict=True
        )
    ]


def _layout(heap: Any) -> list[tuple[int, int, list[tuple[int, int, bool]]]]:
    return [
        (s.base - BASE, s.size, [(ch.address - BASE, ch.size, ch.in_use) for ch in s.chunks])
        for s in heap.state().segments
    ]


@pytest.fixture(params=BUILDERS, ids=lambda b: b.__name__)
def builder(request: pytest.FixtureRequest) -> Any:
    log = EventLog()
    return request.param(log, log.add_device("GPU:0"))


def test_kind_codes_are_appended_so_old_logs_read_unchanged() -> None:
    assert [int(k) for k in Kind][:10] == list(range(10))
    assert (int(Kind.SEGMENT_MAP), int(Kind.SEGMENT_UNMAP)) == (10, 11)
    assert KIND_NAMES[10:] == ("segment_map", "segment_unmap")


def test_a_mapping_grows_the_segment_below_and_coalesces_the_free_seam(builder: Any) -> None:
    builder.segment_map(0, BASE, 2 * MiB)
    builder.alloc(1, BASE, MiB, MiB)
    builder.segment_map(2, BASE + 2 * MiB, 2 * MiB)
    assert _layout(builder) == [(0, 4 * MiB, [(0, MiB, True), (MiB, 3 * MiB, False)])]
    assert _events(builder.log)[-2:] == [
        ("segment_map", 2 * MiB, 2 * MiB, 0),  # joins the segment at BASE
        ("merge", MiB, 3 * MiB, 0),  # the free tail [1, 2) MiB and the new range
    ]
    assert builder.log.columns["largest_free"].tolist()[-2:] == [2 * MiB, 3 * MiB]
    builder.check()


def test_a_mapping_between_two_segments_joins_all_three(builder: Any) -> None:
    builder.segment_map(0, BASE, 2 * MiB)
    builder.alloc(1, BASE, MiB, MiB)
    builder.segment_map(2, BASE + 4 * MiB, 2 * MiB)
    builder.alloc(3, BASE + 5 * MiB, MiB, MiB)
    builder.segment_map(4, BASE + 2 * MiB, 2 * MiB)
    assert builder.segments == {BASE: 6 * MiB}
    assert _layout(builder) == [(0, 6 * MiB, [(0, MiB, True), (MiB, 4 * MiB, False), (5 * MiB, MiB, True)])]
    assert _events(builder.log)[-3:] == [
        ("segment_map", 2 * MiB, 2 * MiB, 0),
        ("merge", 2 * MiB, 3 * MiB, 0),  # with the next segment's free head first (as a free does)
        ("merge", MiB, 4 * MiB, 0),  # then with the previous free chunk
    ]
    builder.alloc(5, BASE + 5 * MiB - 256, 256, 1)  # the joined segment is one: chunks carry its base
    assert _events(builder.log)[-1] == ("alloc", 5 * MiB - 256, 256, 0)
    builder.check()


def test_a_mapping_below_a_segment_takes_over_its_base(builder: Any) -> None:
    builder.segment_map(0, BASE + 2 * MiB, 2 * MiB)
    builder.alloc(1, BASE + 2 * MiB, MiB, MiB)
    builder.segment_map(2, BASE, 2 * MiB)
    assert builder.segments == {BASE: 4 * MiB}
    assert _events(builder.log)[-1] == ("segment_map", 0, 2 * MiB, 0)
    builder.free(3, BASE + 2 * MiB)
    assert _layout(builder) == [(0, 4 * MiB, [(0, 4 * MiB, False)])]
    assert [e[0] for e in _events(builder.log)[-3:]] == ["free", "merge", "merge"]
    builder.check()


def test_an_unmapping_splits_the_free_chunk_and_the_segment(builder: Any) -> None:
    builder.segment_map(0, BASE, 8 * MiB)
    builder.alloc(1, BASE, MiB, MiB)
    builder.alloc(2, BASE + 7 * MiB, MiB, MiB)
    builder.segment_unmap(3, BASE + 2 * MiB, 4 * MiB)  # inside the free chunk [1, 7) MiB
    assert _events(builder.log)[-3:] == [
        ("split", MiB, MiB, 0),
        ("split", 2 * MiB, 4 * MiB, 0),
        ("segment_unmap", 2 * MiB, 4 * MiB, 0),
    ]
    assert _layout(builder) == [
        (0, 2 * MiB, [(0, MiB, True), (MiB, MiB, False)]),
        (6 * MiB, 2 * MiB, [(6 * MiB, MiB, False), (7 * MiB, MiB, True)]),
    ]
    builder.free(4, BASE + 7 * MiB)  # the upper part is a segment of its own now
    assert _events(builder.log)[-2:] == [("free", 7 * MiB, MiB, 6 * MiB), ("merge", 6 * MiB, 2 * MiB, 6 * MiB)]
    builder.segment_unmap(5, BASE + 6 * MiB, 2 * MiB)  # the whole segment: gone
    assert builder.segments == {BASE: 2 * MiB}
    builder.check()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (("segment_map", BASE + MiB, MiB), r"^mapping \[0x10000100000, \+1048576\) overlaps the segment at 0x1000000"),
        (("segment_map", BASE + 3 * MiB, 2 * MiB), r"overlaps the segment at 0x10000400000$"),
        (("segment_map", BASE + 8 * MiB, 0), r"^mapping at 0x10000800000 has size 0$"),
        (("segment_unmap", BASE, MiB), r"^unmapping at 0x10000000000 overlaps the live allocation at 0x1000000"),
        (("segment_unmap", BASE + MiB, 2 * MiB), r"^unmapping \[0x10000100000, \+2097152\) runs past the free chunk"),
        (("segment_unmap", BASE + 2 * MiB, MiB), r"^unmapping \[0x10000200000, \+1048576\) lies outside every"),
        (("segment_unmap", BASE + MiB, -1), r"^unmapping at 0x10000100000 has size -1$"),
    ],
)
def test_contradictions_name_the_problem_and_change_nothing(
    builder: Any, call: tuple[str, int, int], message: str
) -> None:
    builder.segment_map(0, BASE, 2 * MiB)
    builder.alloc(1, BASE, MiB, MiB)
    builder.segment_map(2, BASE + 4 * MiB, 2 * MiB)
    before, rows = _layout(builder), len(builder.log)
    name, address, size = call
    with pytest.raises(HeapConflict, match=message):
        getattr(builder, name)(9, address, size)
    assert _layout(builder) == before and len(builder.log) == rows
    builder.check()


def _grown_log() -> tuple[EventLog, Any]:
    log = EventLog()
    heap = PythonHeapBuilder(log, log.add_device("GPU:0"))
    heap.segment_map(0, BASE, 2 * MiB)
    heap.alloc(1, BASE, MiB, MiB)
    heap.segment_map(2, BASE + 2 * MiB, 2 * MiB)
    heap.alloc(3, BASE + MiB, 2 * MiB, 2 * MiB)
    heap.free(4, BASE)
    heap.segment_unmap(5, BASE, MiB)
    heap.segment_alloc(6, BASE + 8 * MiB, 2 * MiB)
    log.flush()
    return log, heap


@pytest.mark.parametrize("native", ["1", "0"])
def test_replay_and_the_timeline_follow_mapped_bytes(monkeypatch: pytest.MonkeyPatch, native: str) -> None:
    monkeypatch.setenv("GPUVIZ_NATIVE", native)
    log, heap = _grown_log()
    assert replay(log).state_at(-1) == heap.state()
    kinds = [KIND_NAMES[k] for k in log.columns["kind"].tolist()]
    # after each event: reserved (pool) bytes follow maps and unmaps
    series = timeline_series(log)
    expected_pool = {"segment_map": [2 * MiB, 4 * MiB], "segment_unmap": [3 * MiB], "segment_alloc": [5 * MiB]}
    for kind, pools in expected_pool.items():
        assert [int(series.pool_bytes[i]) for i, k in enumerate(kinds) if k == kind] == pools
    assert int(series.bytes_in_use[-1]) == 2 * MiB
    # every intermediate state, from checkpoints every 2 events, equals the one replayed from the start
    stepwise = replay(log, checkpoint_every=2)
    whole = replay(log, checkpoint_every=1 << 20)
    for i in range(len(log)):
        assert stepwise.state_at(i) == whole.state_at(i)
    assert [(s.base - BASE, s.size) for s in whole.state_at(-1).segments] == [(MiB, 3 * MiB), (8 * MiB, 2 * MiB)]


def test_the_log_file_keeps_the_new_kinds(tmp_path: Any) -> None:
    log, heap = _grown_log()
    save(log, tmp_path / "grown.gpuviz")
    loaded = load(tmp_path / "grown.gpuviz")
    assert np.array_equal(loaded.columns["kind"], log.columns["kind"])
    assert replay(loaded).state_at(-1) == heap.state()


def test_the_live_follower_applies_maps_and_unmaps_in_order() -> None:
    log, heap = _grown_log()
    follower = LiveFollower(log)
    points = follower.update()["GPU:0"][0]
    assert points.pool_bytes.tolist()[-1] == 5 * MiB
    assert follower.state("GPU:0") == heap.state()


def test_operation_ends_keep_a_mapping_with_its_carving() -> None:
    kinds = np.array([Kind.SEGMENT_MAP, Kind.MERGE, Kind.SEGMENT_MAP, Kind.ALLOC, Kind.SPLIT, Kind.SEGMENT_UNMAP,
                      Kind.SEGMENT_UNMAP], dtype=np.uint8)  # fmt: skip
    assert operation_ends(kinds).tolist() == [False, True, False, True, False, False, True]


_ops = st.lists(
    st.tuples(
        st.sampled_from(["map", "map", "unmap", "alloc", "alloc", "free", "segment_alloc"]),
        st.integers(0, 63),
        st.integers(1, 8),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(_ops)
def test_replay_of_random_growth_ends_in_the_builders_state(ops: list[tuple[str, int, int]]) -> None:
    unit = 64 * 1024
    log = EventLog(flush_rows=16)
    heap = PythonHeapBuilder(log, log.add_device("GPU:0"))
    states = []
    for time, (name, a, b) in enumerate(ops):
        try:
            if name == "map":
                heap.segment_map(time, BASE + a * unit, b * unit)
            elif name == "segment_alloc":
                heap.segment_alloc(time, BASE + a * unit, b * unit)
            elif name == "unmap":
                free = [ch for s in heap.state().segments for ch in s.chunks if not ch.in_use]
                if free:
                    chunk = free[a % len(free)]
                    heap.segment_unmap(time, chunk.address + (chunk.size // 4 if b % 2 else 0), chunk.size // 2)
            elif name == "alloc":
                heap.alloc(time, BASE + a * unit, b * unit // 2, b)
            else:
                live = [ch.address for s in heap.state().segments for ch in s.chunks if ch.in_use]
                if live:
                    heap.free(time, live[a % len(live)])
        except HeapConflict:
            pass
        heap.check()
        states.append((len(log) - 1, heap.state()))
    log.flush()
    for every in (1, 3, 1 << 20):
        replayed = replay(log, checkpoint_every=every)
        for index, state in states:
            if index >= 0:
                assert replayed.state_at(index) == state
