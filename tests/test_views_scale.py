"""Views at real scale, on small constructed logs with known answers: the map's label cap, its
overview groups and the lane of inferred preexisting memory, the failed request drawn whole,
the timeline's opening range, inferred times as event positions, device order, and the
active-memory view's groups with its "other" band."""

from __future__ import annotations

# ruff: noqa: RUF001  (the size classes are named with an en dash)
import numpy as np
import pytest

import gpuviz
from gpuviz import BFCAllocator, SimUpstream
from gpuviz.analysis.moments import oom_indices
from gpuviz.analysis.profile import profile
from gpuviz.analysis.timeline import devices_by_peak, timeline_series, times_inferred
from gpuviz.base.heapstate import ChunkState, HeapState, SegmentState
from gpuviz.base.units import GiB, KiB, MiB
from gpuviz.views.active import OTHER, active_memory, active_series
from gpuviz.views.fragmentation import device_map, map_layout, map_spec, segment_rows
from gpuviz.views.overview import MAX_LABELS, labelled_rows, segment_groups, size_class, state_lanes
from gpuviz.views.timeline import activity_range, timeline

BASE = 1 << 40


def segments_of(sizes: list[int], *, preexisting: int = 0) -> HeapState:
    """Segments of ``sizes`` bytes, each half used by one chunk tagged ``t<i>``, then (when
    ``preexisting``) a segment of that many bytes filled by one ``PREEXISTING`` chunk."""
    segments, base = [], BASE
    for i, size in enumerate(sizes):
        half = size // 2
        chunks = (ChunkState(base, half, half, True, f"t{i}"), ChunkState(base + half, size - half, 0, False))
        segments.append(SegmentState(base, size, chunks))
        base += 1 << 32
    if preexisting:
        segments.append(
            SegmentState(base, preexisting, (ChunkState(base, preexisting, preexisting, True, "PREEXISTING"),))
        )
    return HeapState("GPU:0", tuple(segments))


def test_a_map_labels_at_most_max_labels_rows_every_lane_among_them() -> None:
    assert MAX_LABELS == 40
    assert labelled_rows(1010) == list(range(0, 1010, 26))  # ceil(1010 / 40) = 26: 39 labels
    assert labelled_rows(40) == list(range(40))
    assert labelled_rows(100, lanes=[98]) == [*range(0, 99, 3), 98, 99]
    state = segments_of([2 * MiB] * 100)
    rows = segment_rows(state)
    assert rows["tickvals"] == list(range(0, 100, 3))
    assert rows["ticktext"][:2] == [f"{BASE:#x}", f"{BASE + 3 * (1 << 32):#x}"]
    category = map_layout(state)["yaxis"]  # the notebook's map: category rows, the same labels
    assert len(category["categoryarray"]) == 100
    assert category["tickvals"] == rows["ticktext"] and category["ticktext"] == rows["ticktext"]


def test_segments_group_by_size_class_with_their_totals() -> None:
    assert size_class(2 * MiB) == (0, "≤ 2.0 MiB")
    assert size_class(512 * KiB) == (0, "≤ 2.0 MiB")
    assert size_class(2 * MiB + 1) == (22, "2.0 MiB–4.0 MiB")
    assert size_class(20 * MiB) == (25, "16 MiB–32 MiB")
    groups = segment_groups([2 * MiB, 20 * MiB, 24 * MiB, 2 * MiB, GiB], [MiB, 20 * MiB, 0, 2 * MiB, GiB], lanes=[4])
    assert [tuple(g) for g in groups] == [
        ("PREEXISTING (inferred)", [4], GiB, GiB),
        ("≤ 2.0 MiB", [0, 3], 4 * MiB, 3 * MiB),
        ("16 MiB–32 MiB", [1, 2], 44 * MiB, 20 * MiB),
    ]


def test_inferred_preexisting_memory_gets_its_own_lane_off_the_x_scale() -> None:
    state = segments_of([2 * MiB, 4 * MiB], preexisting=3 * GiB)
    assert state_lanes(state) == [2]
    layout = map_layout(state, lean=True)
    assert layout["xaxis"]["range"] == [0, 4 * MiB]  # the widest traced segment, not the 3 GiB one
    assert layout["yaxis"]["ticktext"] == [f"{BASE:#x}", f"{BASE + (1 << 32):#x}", "PREEXISTING (inferred) 3.0 GiB"]
    assert layout["meta"] == {
        "bases": [s.base for s in state.segments], "sizes": [2 * MiB, 4 * MiB, 3 * GiB],
        "inUse": [MiB, 2 * MiB, 3 * GiB], "lanes": [2],
    }  # fmt: skip
    assert state_lanes(segments_of([], preexisting=GiB)) == []  # alone, it is the heap: no lane


def test_the_failed_request_is_drawn_whole_past_its_segment_and_says_what_it_misses_by() -> None:
    # one 16 MiB segment: free 5.5 MiB | B 4 MiB | free 6.5 MiB (the largest hole, at the end)
    alloc = BFCAllocator(SimUpstream("1GiB"), memory_limit="16MiB", growth=False)
    a = alloc.allocate(5 * MiB + 512 * KiB, tag="A")
    alloc.allocate(4 * MiB, tag="B")
    c = alloc.allocate(6 * MiB + 512 * KiB, tag="C")
    alloc.free(a)
    alloc.free(c)
    with pytest.raises(gpuviz.OutOfMemoryError):
        alloc.allocate(8 * MiB, tag="big")
    p = profile(alloc.log)
    assert p.devices["GPU:0"].opening == int(oom_indices(alloc.log)[0])
    figure = device_map(p, "GPU:0")
    ghost = next(t for t in figure.data if t.name == "failed request")
    assert (list(ghost.base), list(ghost.x)) == ([9 * MiB + 512 * KiB], [8 * MiB])  # ends at 17.5 MiB > 16 MiB
    assert list(ghost.text) == ["failed request 8.0 MiB: misses by 1.5 MiB"]
    assert "(misses by 1.5 MiB)" in ghost.hovertext[0]
    assert list(figure.layout.xaxis.range) == [0, int((17 * MiB + 512 * KiB) * 1.02)]


def test_the_timeline_opens_where_the_events_are() -> None:
    x = np.array([0.0] + [1.7 + 0.001 * i for i in range(100)])
    assert activity_range(x) == pytest.approx((1.704 - 0.05 * 0.095, 1.799 + 0.05 * 0.095))
    assert activity_range(x, peak_x=1.65) == pytest.approx((1.65 - 0.05 * 0.149, 1.799 + 0.05 * 0.149))
    assert activity_range(np.linspace(0, 1, 100)) is None  # activity over the whole run: no zoom
    assert activity_range(np.array([1.0])) is None


def small_log() -> tuple[gpuviz.EventLog, dict[str, int]]:
    """a 1 MiB, b 4 MiB, c 2 MiB (the peak, 7 MiB), a freed, then d (tag a) 1 MiB."""
    alloc = BFCAllocator(SimUpstream("1GiB"), memory_limit="64MiB", growth=False)
    a = alloc.allocate(MiB, tag="a")
    alloc.allocate(4 * MiB, tag="b")
    alloc.allocate(2 * MiB, tag="c")
    alloc.free(a)
    alloc.allocate(MiB, tag="a")
    return alloc.log, {}


def test_inferred_times_are_drawn_as_event_positions_never_seconds() -> None:
    log, _ = small_log()
    assert not times_inferred(log)
    log.meta["columns"] = {"time_ns": "inferred"}
    assert times_inferred(log)
    series = timeline_series(log, "GPU:0")
    figure = timeline(series, times_inferred=True)
    line = next(t for t in figure.data if t.name == "bytes in use")
    assert list(line.x) == series.index[series.settled].tolist()
    assert figure.layout.xaxis.title.text == "event (log position)"
    assert "inferred" in figure.layout.title.text and "event %{x:.0f}" in line.hovertemplate
    measured = timeline(series)
    assert measured.layout.xaxis.title.text == "time (s)"
    # the map's hovers name the allocating event, without a time
    spec = map_spec(profile(log), "GPU:0")
    hover = next(t for t in spec["data"] if t["name"] == "used")["hovertext"][0]
    assert "allocated at event" in hover and "t = " not in hover


def test_devices_are_ordered_gpus_first_then_by_peak() -> None:
    peaks = {"CPU:0": 10, "GPU:1": 5, "GPU:0": 5, "GPU:2": 100}
    assert devices_by_peak(peaks) == ["GPU:2", "GPU:0", "GPU:1", "CPU:0"]


def test_active_memory_stacks_the_top_groups_and_other() -> None:
    log, _ = small_log()
    p = profile(log)
    data = active_series(p, "GPU:0", group_by="tag", top=2)
    assert data.groups == ["b", "c", OTHER]  # by bytes alive at the peak: b 4, c 2, the rest (a) 1 MiB
    assert data.at_peak == [4 * MiB, 2 * MiB, MiB]
    assert p.devices["GPU:0"].peak.index in data.positions.tolist()
    assert data.bytes[:, 0].tolist() == [0, 0, MiB]  # right after the first allocation (a)
    assert data.bytes[:, -1].tolist() == [4 * MiB, 2 * MiB, MiB]  # a freed, d (tag a) alive: "other"
    peak = data.positions.tolist().index(p.devices["GPU:0"].peak.index)
    assert int(data.bytes[:, peak].sum()) == p.devices["GPU:0"].peak.bytes == 7 * MiB
    everything = active_series(p, "GPU:0", group_by="tag", top=10)
    assert everything.groups == ["b", "c", "a"]  # no rest, no "other"
    by_size = active_series(p, "GPU:0", group_by=lambda t: ["big" if s >= 2 * MiB else "small" for s in t["size"]])
    assert (by_size.groups, by_size.at_peak) == (["big", "small"], [6 * MiB, MiB])
    figure = active_memory(p, "GPU:0", group_by="tag", top=2)
    assert [t.name for t in figure.data] == ["b", "c", OTHER]
    assert {t.stackgroup for t in figure.data} == {"alive"}
    assert list(figure.data[0].customdata) == data.positions.tolist()  # a click names a log position
    with pytest.raises(ValueError, match="group_by"):
        active_series(p, "GPU:0", group_by="colour")


def test_the_active_view_follows_the_profiles_grouping() -> None:
    from gpuviz.views.active import active_grouping

    assert [active_grouping(g, has_stacks=True) for g in ("call site", "category", "tag", "dtype", "auto")] == [
        "call site", "category", "tag", "dtype", "call site",
    ]  # fmt: skip
    assert active_grouping("auto", has_stacks=False) == "tag"
