"""Moments (where views open, scrub stops) and the pinning analysis at an OOM, on constructed heaps."""

from __future__ import annotations

import numpy as np
import pytest

import gpuviz
from gpuviz import EventLog, SimUpstream
from gpuviz.analysis.moments import oom_indices, opening_index, pinning, scrub_stops
from gpuviz.analysis.replay import replay
from gpuviz.analysis.timeline import operation_ends, timeline_series
from gpuviz.base.heapstate import HeapState
from gpuviz.base.units import KiB, MiB, format_size
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.capture.marks import mark
from gpuviz.log.schema import Kind

BASE = 1 << 40


def fragmented() -> tuple[ReferenceBFCAllocator, dict[str, int]]:
    """One 16 MiB segment: free 3 MiB | A 1 MiB | free 3 MiB | B 2 MiB | free 1 MiB | C 512 KiB | D 5.5 MiB."""
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), memory_limit="16MiB", growth=False)
    sizes = {"x0": 3 * MiB, "A": MiB, "x1": 3 * MiB, "B": 2 * MiB, "x2": MiB, "C": 512 * KiB, "D": 5 * MiB + 512 * KiB}
    addresses = {name: alloc.allocate(size, tag=name) for name, size in sizes.items()}
    for name in ("x0", "x1", "x2"):
        alloc.free(addresses[name])
    return alloc, addresses


def test_pinning_picks_the_cheapest_run_of_live_chunks() -> None:
    alloc, at = fragmented()
    with pytest.raises(gpuviz.OutOfMemoryError):
        alloc.allocate(6 * MiB, tag="big")
    log = alloc.log
    oom = int(oom_indices(log)[0])
    state = replay(log).state_at(oom)
    result = pinning(state, 6 * MiB - 100, log=log, at_index=oom)
    assert (result.rounded, result.free_bytes, result.holes, result.largest_hole) == (6 * MiB, 7 * MiB, 3, 3 * MiB)
    assert result.largest_hole_address == BASE
    # A alone joins 3 + 1 + 3 MiB; B alone 3 + 2 + 1 MiB (more bytes released); C needs D too
    assert [([c.tag for c in w.chunks], w.start - BASE, w.hole_bytes) for w in result.windows] == [
        (["A"], 0, 7 * MiB),
        (["B"], 4 * MiB, 6 * MiB),
        (["C", "D"], 9 * MiB, 7 * MiB),
    ]
    best = result.windows[0].chunks[0]
    a_event = int(np.flatnonzero((log["kind"] == Kind.ALLOC) & (log["address"] == at["A"]))[0])
    assert (best.address, best.size, best.requested, best.alloc_index) == (at["A"], MiB, MiB, a_event)
    assert best.alloc_ns == int(log["time_ns"][a_event])
    assert best.age_ns == int(log["time_ns"][oom]) - best.alloc_ns > 0
    assert result.sentence() == (
        "free 7.0 MiB in 3 holes, largest 3.0 MiB; freeing this allocation would have made a hole of 7.0 MiB"
    )
    # releasing what it names really makes the request fit
    alloc.free(at["A"])
    alloc.allocate(6 * MiB)


def test_pinning_when_a_hole_fits_or_nothing_can() -> None:
    alloc, _ = fragmented()
    state = alloc.state()
    fits = pinning(state, 3 * MiB)
    assert fits.fits and fits.windows == () and fits.sentence().endswith("a hole was large enough for 3.0 MiB")
    never = pinning(state, 32 * MiB)
    assert never.windows == () and never.sentence() == (
        "free 7.0 MiB in 3 holes, largest 3.0 MiB; no segment can hold 32 MiB, whatever is released"
    )
    with pytest.raises(ValueError, match="request_bytes"):
        pinning(state, -1)
    empty = pinning(HeapState("GPU:0", ()), 256)
    assert (empty.holes, empty.largest_hole, empty.largest_hole_address, empty.windows) == (0, 0, -1, ())


def test_pinning_of_the_demos_oom(runtime_log: EventLog) -> None:
    from gpuviz.demo import run_demo

    run_demo(runtime_log)
    log = runtime_log
    oom = int(oom_indices(log, "GPU:0")[0])
    state = replay(log).state_at(oom, device="GPU:0")
    requested = int(log["requested"][oom])
    result = pinning(state, requested, log=log, at_index=oom)
    assert not result.fits and result.best is not None
    best = result.best
    assert best.hole_bytes >= result.rounded
    # no shorter run of consecutive live chunks in any segment would have been enough
    for seg in state.segments:
        live = [k for k, c in enumerate(seg.chunks) if c.in_use]
        bounds = [c.address for c in seg.chunks] + [seg.end]
        for i in range(len(live)):
            j = i + len(best.chunks) - 2
            if j < i or j >= len(live):
                continue
            start = bounds[live[i - 1] + 1] if i else seg.base
            stop = bounds[live[j + 1]] if j + 1 < len(live) else seg.end
            assert stop - start < result.rounded
    assert [(c.tag, c.size) for c in best.chunks] == EXPECTED_DEMO_PINNING
    assert result.sentence() == EXPECTED_DEMO_SENTENCE
    assert all(c.alloc_index >= 0 and c.age_ns > 0 for c in best.chunks)


# the last small buffer kept per step sits between the step's scratch space and the 702 MiB hole
EXPECTED_DEMO_PINNING = [("Empty:float32[262144]", MiB)]
EXPECTED_DEMO_SENTENCE = (
    "free 788 MiB in 3 holes, largest 702 MiB; freeing this allocation would have made a hole of 704 MiB"
)


def test_opening_index_is_the_first_oom_else_the_peak() -> None:
    alloc, _ = fragmented()
    log = alloc.log
    peak = int(np.argmax(timeline_series(log).bytes_in_use))
    assert opening_index(log) == int(timeline_series(log).index[peak])
    for size in (6 * MiB, 7 * MiB):
        with pytest.raises(gpuviz.OutOfMemoryError):
            alloc.allocate(size)
    ooms = oom_indices(log)
    assert len(ooms) == 2 and opening_index(log) == int(ooms[0])
    assert opening_index(EventLog()) == -1


def test_scrub_stops_hold_every_oom_the_peak_and_every_mark() -> None:
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), memory_limit="64MiB", growth=True)
    log = alloc.log
    live = []
    for i in range(200):
        live.append(alloc.allocate((i % 7 + 1) * 64 * KiB))
        if i % 3 == 0:
            alloc.free(live.pop(0))
        if i % 50 == 0:
            mark(f"step {i}", log=log)
    with pytest.raises(gpuviz.OutOfMemoryError):
        alloc.allocate(128 * MiB)
    series = timeline_series(log)
    stops = scrub_stops(log, count=10, series=series)
    marks = np.flatnonzero(log["kind"] == Kind.MARK)
    ooms = oom_indices(log)
    peak = int(series.index[int(np.argmax(series.bytes_in_use))])
    assert len(marks) == 4 and len(ooms) == 1
    assert set(marks) <= set(stops) and set(ooms) <= set(stops) and peak in stops
    assert list(stops) == sorted(set(stops.tolist()))
    # the evenly spaced ones are settled events: never between a split and its alloc
    kinds = log["kind"][stops]
    assert not np.any(kinds == Kind.SPLIT) and np.count_nonzero(kinds == Kind.ALLOC) >= 5
    assert len(stops) <= 10 + len(marks) + len(ooms) + 1
    with pytest.raises(ValueError, match="count"):
        scrub_stops(log, count=0)
    # more marks than max_marks: that many, evenly spaced, the first and the last among them
    fewer = scrub_stops(log, count=10, series=series, max_marks=2)
    assert set(fewer) & set(marks) == {marks[0], marks[-1]} and set(ooms) <= set(fewer) and peak in fewer
    assert not set(scrub_stops(log, count=10, series=series, max_marks=0)) & set(marks)
    with pytest.raises(ValueError, match="max_marks"):
        scrub_stops(log, max_marks=-1)


def test_operation_ends() -> None:
    k = Kind
    sequence = [k.SEGMENT_ALLOC, k.SPLIT, k.ALLOC, k.SPLIT, k.ALLOC, k.ALLOC, k.FREE, k.MERGE, k.MERGE, k.FREE]
    sequence += [k.OOM, k.SEGMENT_FREE, k.SEGMENT_FREE, k.SEGMENT_ALLOC, k.ALLOC]
    ends = [False, False, True, False, True, True, False, False, True, True]
    ends += [True, False, False, False, True]
    assert operation_ends(np.array(sequence)).tolist() == ends


def test_format_size() -> None:
    sizes = (0, 256, 1023, 1536, 10 * KiB + 400, 702 * MiB, int(3.2 * (1 << 30)))
    assert [format_size(n) for n in sizes] == ["0 B", "256 B", "1023 B", "1.5 KiB", "10 KiB", "702 MiB", "3.2 GiB"]
    assert format_size(1024 * MiB - 1) == "1.0 GiB" and format_size(-2 * MiB) == "-2.0 MiB"
    assert format_size(9.96 * MiB) == "10 MiB"


def test_the_map_at_an_oom_draws_ghost_holes_and_pinning() -> None:
    from gpuviz.analysis.profile import profile
    from gpuviz.views.fragmentation import OOM_COLORS, device_map

    alloc, at = fragmented()
    with pytest.raises(gpuviz.OutOfMemoryError):
        alloc.allocate(6 * MiB, tag="big")
    p = profile(alloc.log)
    dp = p.devices["GPU:0"]
    assert dp.opening == int(oom_indices(alloc.log)[0])
    figure = device_map(p, "GPU:0")  # opens at the OOM
    traces = {t.name: t for t in figure.data}
    assert [t.name for t in figure.data] == ["free hole", "waste", "used", "pinning", "failed request"]
    y = f"{BASE:#x}"
    # the three holes, highlighted; A pinned; the 6 MiB request below the largest (first) hole
    assert list(zip(traces["free hole"].base, traces["free hole"].x, strict=True)) == [
        (0, 3 * MiB), (4 * MiB, 3 * MiB), (9 * MiB, MiB)
    ]  # fmt: skip
    assert traces["free hole"].marker.color == OOM_COLORS["free hole"]
    assert (list(traces["pinning"].base), list(traces["pinning"].x), list(traces["pinning"].y)) == (
        [3 * MiB], [MiB], [y]
    )  # fmt: skip
    ghost = traces["failed request"]
    assert (list(ghost.base), list(ghost.x), list(ghost.y), ghost.offset) == ([0], [6 * MiB], [y], 0.36)
    assert "failed request</b> 6.0 MiB" in ghost.hovertext[0]
    assert (
        "pinning</b>: releasing it makes room<br><b>A</b><br>requested 1.0 MiB · chunk 1.0 MiB"
        in (traces["pinning"].hovertext[0])
    )
    a_event = int(np.flatnonzero((alloc.log["kind"] == Kind.ALLOC) & (alloc.log["address"] == at["A"]))[0])
    assert f"address {at['A']:#x}<br>allocated at event {a_event}, t = " in traces["pinning"].hovertext[0]
    assert "free 7.0 MiB in 3 holes" in figure.layout.title.text and "(out of memory)" in figure.layout.title.text
    # hover on free space names the hole's own size and address
    assert traces["free hole"].hovertext[2] == f"<b>free hole</b> 1.0 MiB<br>address {BASE + 9 * MiB:#x}"


def test_the_map_zooms_to_the_used_range_of_a_large_pool() -> None:
    from gpuviz.views.fragmentation import MIN_WIDTH, ZOOM_BELOW, fragmentation_map, zoom_range

    alloc = ReferenceBFCAllocator(SimUpstream("16GiB"), memory_limit="1GiB", growth=False)
    alloc.allocate(256, tag="tiny")
    alloc.allocate(3 * MiB, tag="small")
    state = alloc.state()
    assert state.bytes_in_use < ZOOM_BELOW * state.pool_bytes
    end = 3 * MiB + 256
    assert zoom_range(state) == (0, int(end * 1.25) + 1)
    figure = fragmentation_map(state)
    assert list(figure.layout.xaxis.range) == [0, int(end * 1.25) + 1]
    labels = [b.label for b in figure.layout.updatemenus[0].buttons]
    assert labels == ["used range", "whole pool"]
    assert figure.layout.updatemenus[0].buttons[1].args[0] == {"xaxis.range": [0, 1 << 30]}
    # a 256-byte chunk is drawn MIN_WIDTH of the visible range wide; its hover keeps its real size
    used = next(t for t in figure.data if t.name == "used")
    assert used.x[0] == pytest.approx(MIN_WIDTH * (int(end * 1.25) + 1)) and used.x[1] == 3 * MiB
    assert "requested 256 B · chunk 256 B" in used.hovertext[0]
    # binary ticks on the whole pool
    assert list(figure.layout.xaxis.ticktext[:3]) == ["0 B", "128 MiB", "256 MiB"]
    # most of the pool in use: no zoom
    alloc.allocate(512 * MiB)
    assert zoom_range(alloc.state()) is None
    assert not fragmentation_map(alloc.state()).layout.updatemenus


def test_report_tables_sort_by_value_not_text(runtime_log: EventLog) -> None:
    import re

    from gpuviz.views.oom import live_html
    from gpuviz.views.tables import placement_html

    gpuviz.config.set_simulated_gpus(1, "1GiB")
    small = gpuviz.asarray(np.ones(100, dtype=np.float32))  # 512 B chunk
    big = gpuviz.asarray(np.ones(300_000, dtype=np.float32))  # 1.1 MiB
    mid = gpuviz.asarray(np.ones(2_000, dtype=np.float32))  # 7.8 KiB
    from gpuviz.analysis.profile import profile

    p = profile(runtime_log)
    html = placement_html(p.placements)
    # every numeric cell carries its raw value: "1.1 MiB" sorts after "7.8 KiB"
    from gpuviz.base.units import format_duration

    values = re.findall(r'<td data-value="(\d+)">([^<]+)</td>', html)
    assert len(values) == 6 * len(p.placements) and ("1208832", "1.2 MiB") in values
    assert all(text in (format_size(int(v)), format_duration(int(v)), v) for v, text in values)
    live = p.diagnosis.devices[0].live
    assert live["size"].tolist() == sorted(live["size"].tolist(), reverse=True)
    table = live_html(live)
    sizes = re.findall(r'<td data-value="(\d+)">[^<]+ (?:B|KiB|MiB)</td><td class="text">', table)
    assert [int(s) for s in sizes] == live["size"].tolist()
    assert small is not None and big is not None and mid is not None
