"""Moments (where views open, scrub stops) and the pinning analysis at an OOM, on constructed heaps."""

from __future__ import annotations

import numpy as np
import pytest

import gpuviz
from gpuviz import BFCAllocator, EventLog, SimUpstream
from gpuviz.analysis.moments import oom_indices, opening_index, pinning, scrub_stops
from gpuviz.analysis.replay import replay
from gpuviz.analysis.timeline import operation_ends, timeline_series
from gpuviz.base.heapstate import HeapState
from gpuviz.base.units import KiB, MiB, format_size
from gpuviz.capture.marks import mark
from gpuviz.log.schema import Kind

BASE = 1 << 40


def fragmented() -> tuple[BFCAllocator, dict[str, int]]:
    """One 16 MiB segment: free 3 MiB | A 1 MiB | free 3 MiB | B 2 MiB | free 1 MiB | C 512 KiB | D 5.5 MiB."""
    alloc = BFCAllocator(SimUpstream("1GiB"), memory_limit="16MiB", growth=False)
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
    alloc = BFCAllocator(SimUpstream("1GiB"), memory_limit="64MiB", growth=True)
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
    assert not np.any(kinds == Kind.SPLIT)
    assert len(stops) <= 10 + len(marks) + len(ooms) + 1
    with pytest.raises(ValueError, match="count"):
        scrub_stops(log, count=0)


def test_operation_ends() -> None:
    k = Kind
    sequence = [k.SEGMENT_ALLOC, k.SPLIT, k.ALLOC, k.ALLOC, k.FREE, k.MERGE, k.MERGE, k.FREE, k.OOM]
    sequence += [k.SEGMENT_FREE, k.SEGMENT_FREE, k.SEGMENT_ALLOC, k.ALLOC]
    ends = [False, False, True, True, False, False, True, True, True, False, False, False, True]
    assert operation_ends(np.array(sequence)).tolist() == ends


def test_format_size() -> None:
    sizes = (0, 256, 1023, 1536, 10 * KiB + 400, 702 * MiB, int(3.2 * (1 << 30)))
    assert [format_size(n) for n in sizes] == ["0 B", "256 B", "1023 B", "1.5 KiB", "10 KiB", "702 MiB", "3.2 GiB"]
    assert format_size(1024 * MiB - 1) == "1.0 GiB" and format_size(-2 * MiB) == "-2.0 MiB"
    assert format_size(9.96 * MiB) == "10 MiB"
