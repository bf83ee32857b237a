"""The report's scrubber frames built from arrays (``gpuviz.views.frames``) are the maps the
per-HeapState path draws: on constructed heaps with exact addresses, on random heaps, and at every
stop of a report, after packing into the page's typed columns and unpacking again."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest
from test_views import aggregated_by_chunk

import gpuviz
from gpuviz.analysis.heapcolumns import HeapColumns
from gpuviz.analysis.profile import profile
from gpuviz.analysis.replay import replay
from gpuviz.base.heapstate import ChunkState, HeapState, SegmentState
from gpuviz.capture.bfc import ReferenceBFCAllocator
from gpuviz.capture.upstream import SimUpstream
from gpuviz.views import fragmentation
from gpuviz.views.eventstream import decode_columns
from gpuviz.views.fragmentation import COLORS, LEAN_AGGREGATED, map_layout, metric_text, zoom_range
from gpuviz.views.frames import columns_zoom, lean_aggregated_spec, pack_bars, scrubber_frames, unpack_bars
from gpuviz.views.report import FRAME_RECTANGLES, _frame_label, report_html, scrub_positions

BASE = 1 << 40  # SimUpstream's first address


def definition_frame(state: HeapState, title: str, max_rectangles: int) -> dict[str, Any]:
    """The lean aggregated map as the per-HeapState path drew it: the chunk-by-chunk buckets
    (``aggregated_by_chunk``), rows numbered, bars rounded as ``trace_specs(lean=True)`` rounded
    them, and ``map_layout(lean=True)``."""
    traces = aggregated_by_chunk(state, max_rectangles, texts=False)
    rows = {f"{seg.base:#x}": i for i, seg in enumerate(state.segments)}
    data = []
    for name in ("free", "waste", "used"):
        t = traces[name]
        data.append({
            "type": "bar", "orientation": "h", "name": f"{name} (aggregated)",
            "marker": {"color": COLORS[name], "line": {"width": 0.5, "color": "white"}},
            "y": [rows[y] for y in t["y"]], "base": [int(b) for b in t["base"]], "x": [round(x) for x in t["x"]],
            "customdata": [list(c) for c in t["custom"]], "hovertemplate": LEAN_AGGREGATED,
        })  # fmt: skip
    return {"data": data, "layout": map_layout(state, title=title, lean=True)}


def random_heap(seed: int) -> HeapState:
    """A BFC heap of several segments, chunks in use with waste, free holes (exact addresses)."""
    rng = np.random.default_rng(seed)
    alloc = ReferenceBFCAllocator(SimUpstream("8GiB"), growth=True)
    live = []
    for _ in range(int(rng.integers(300, 1500))):
        if live and rng.random() < 0.45:
            alloc.free(live.pop(int(rng.integers(len(live)))))
        else:
            live.append(alloc.allocate(int(2 ** rng.uniform(4, 26)), tag=f"t{int(rng.integers(3))}"))
    return alloc.state()


def test_a_constructed_heap_is_drawn_to_the_byte() -> None:
    """One 8 KiB segment, two buckets of 4 KiB: A [0, 1 KiB) asks 1000 B, a 2 KiB hole, C [3 KiB,
    5 KiB) asks 2000 B, a 3 KiB hole. Each bucket: used, then waste, then free from its left edge."""
    state = HeapState("GPU:0", (SegmentState(BASE, 8192, (
        ChunkState(BASE, 1024, 1000, True, "a"), ChunkState(BASE + 1024, 2048, 0, False),
        ChunkState(BASE + 3072, 2048, 2000, True, "c"), ChunkState(BASE + 5120, 3072, 0, False),
    )),))  # fmt: skip
    state.check()
    heap = HeapColumns.from_state(state)
    assert (heap.pool_bytes, heap.bytes_in_use, heap.largest_free_chunk) == (8192, 3072, 3072)
    frame = lean_aggregated_spec(heap, "GPU:0 after event 7", max_rectangles=6)  # 4 chunks > 6 / 2: aggregated
    data = unpack_bars(frame.spec)["data"]
    assert [t["name"] for t in data] == ["free (aggregated)", "waste (aggregated)", "used (aggregated)"]
    free, waste, used = data
    assert used["base"] == [0, 4096] and used["x"] == [2024, 976]  # 1000 + 1024 of C; C's other 976
    assert waste["base"] == [2024, 5072] and waste["x"] == [24, 48]
    assert free["base"] == [2048, 5120] and free["x"] == [2048, 3072]
    assert used["customdata"] == [[BASE, 3, 2024], [BASE + 4096, 1, 976]]  # 3 chunks start in the first bucket
    assert free["y"] == waste["y"] == used["y"] == [0, 0]
    assert frame.metric == "in use 3.0 KiB · pool 8.0 KiB · largest free 3.0 KiB · fragmentation 40.0%"
    assert frame.spec["layout"]["xaxis"]["range"] == [0, 8192]
    assert frame.spec["layout"]["yaxis"]["ticktext"] == [f"{BASE:#x}"]
    assert unpack_bars(frame.spec) == definition_frame(state, "GPU:0 after event 7", 6)


def test_a_chunk_at_a_fractional_edge_counts_in_the_bucket_it_starts_in() -> None:
    """A 1000 B segment in three buckets (edges at 333.3 and 666.7 B): the chunks at offsets 333
    and 666 start before those edges, so they count in the first and second bucket."""
    state = HeapState("GPU:0", (SegmentState(BASE, 1000, (
        ChunkState(BASE, 100, 50, True, "a"), ChunkState(BASE + 100, 233, 0, False),
        ChunkState(BASE + 333, 167, 167, True, "b"), ChunkState(BASE + 500, 166, 0, False),
        ChunkState(BASE + 666, 334, 300, True, "c"),
    )),))  # fmt: skip
    state.check()
    frame = unpack_bars(lean_aggregated_spec(HeapColumns.from_state(state), "t", max_rectangles=9).spec)
    assert frame == definition_frame(state, "t", 9)
    used = frame["data"][2]
    assert [c[:2] for c in used["customdata"]] == [[BASE, 3], [BASE + 333, 2], [BASE + 666, 0]]
    assert used["x"] == [50, 167, 299]  # 50 + 1/3; 166 2/3 + 2/3; 300 - 2/3 (rounded to whole bytes)


@pytest.mark.parametrize("seed", range(5))
def test_array_frames_are_the_per_heapstate_maps(seed: int) -> None:
    """Random heaps, every bucket count from one per segment to more buckets than chunks: the
    frame from arrays is the per-HeapState map, bar for bar, and opens at the same zoom."""
    state = random_heap(seed)
    heap = HeapColumns.from_state(state)
    assert len(state.segments) > 1 and heap.to_state() == state
    assert columns_zoom(heap) == zoom_range(state)
    assert metric_text(state) == lean_aggregated_spec(heap, "x", 20).metric
    for max_rectangles in (1, 3 * len(state.segments), 200, 1500):
        if len(heap.address) * 2 <= max_rectangles:
            continue
        frame = lean_aggregated_spec(heap, "GPU:0 after event 3", max_rectangles)
        assert unpack_bars(frame.spec) == definition_frame(state, "GPU:0 after event 3", max_rectangles)
        lean = fragmentation.trace_specs(state, lean=True, max_rectangles=max_rectangles)
        assert unpack_bars({"data": frame.spec["data"]})["data"] == lean  # the views' own lean map too


def test_a_little_used_heap_opens_zoomed() -> None:
    """Bytes in use below a tenth of the pool: both paths open at the same used range."""
    alloc = ReferenceBFCAllocator(SimUpstream("8GiB"), growth=True)
    ptrs = [alloc.allocate(4096) for _ in range(900)]
    for p in ptrs[::2]:
        alloc.free(p)
    alloc.free(alloc.allocate(1 << 30))  # a segment of over 1 GiB, free again
    state = alloc.state()
    heap = HeapColumns.from_state(state)
    zoom = columns_zoom(heap)
    assert zoom is not None and zoom == zoom_range(state)
    frame = lean_aggregated_spec(heap, "t", FRAME_RECTANGLES)
    assert frame.spec["layout"]["xaxis"]["range"] == [0, zoom[1]]
    assert unpack_bars(frame.spec) == definition_frame(state, "t", FRAME_RECTANGLES)


def test_replay_columns_are_the_replayed_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """``columns_at`` at every few events is ``state_at`` (compiled pass and Python twin alike),
    and at the end the allocator's own state."""
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), growth=True)
    live = [alloc.allocate((i % 7 + 1) * 5000, tag=f"t{i % 3}") for i in range(300)]
    for p in live[::3]:
        alloc.free(p)
    log = alloc.log
    compiled = replay(log, checkpoint_every=64)
    assert compiled.columns_at(-1).to_state() == alloc.state()
    monkeypatch.setenv("GPUVIZ_NATIVE", "0")
    python = replay(log, checkpoint_every=64)
    for index in range(0, len(log), 37):
        a, b = compiled.columns_at(index), python.columns_at(index)
        for name in ("bases", "sizes", "address", "size", "requested", "in_use", "tag", "stack", "owner"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), (index, name)
        assert a.to_state() == python.state_at(index)
    with pytest.raises(IndexError, match="out of range"):
        compiled.columns_at(len(log))


def training_log() -> gpuviz.EventLog:
    """~900 live chunks (aggregated maps) with marks (scrubber stops), after a small start (exact maps)."""
    log = gpuviz.EventLog()
    alloc = ReferenceBFCAllocator(SimUpstream("2GiB"), growth=True, log=log)
    keep = [alloc.allocate((i % 5 + 1) * 3000, tag=f"t{i % 3}") for i in range(40)]
    gpuviz.mark("small", log=log)
    for step in range(6):
        keep += [alloc.allocate((i % 5 + 1) * 3000, tag=f"t{i % 3}") for i in range(300)]
        for p in keep[step::4]:
            alloc.free(p)
        keep = [p for i, p in enumerate(keep) if (i - step) % 4]
        gpuviz.mark(f"step {step}", log=log)
    return log


def test_every_report_stop_is_the_per_heapstate_map() -> None:
    """The report's frames, as the page gets them (packed, then unpacked as ``gpuvizUnpack``
    does): at every stop the map the per-HeapState path draws, with its label."""
    log = training_log()
    p = profile(log)
    dp = p.devices["GPU:0"]
    positions = scrub_positions(dp)
    document = report_html(p)
    packed = json.loads(re.search(r'id="map0-frames">(.*?)</script>', document).group(1))  # type: ignore[union-attr]
    bars = json.loads(re.search(r'id="map0-bars">(.*?)</script>', document).group(1))  # type: ignore[union-attr]
    assert {c["type"] for c in bars.values()} == {"Int32Array", "Float64Array"}
    assert bars["address"]["type"] == "Float64Array" and bars["y"]["type"] == "Int32Array"  # addresses above 2**31
    assert len(packed) == len(positions) > 5
    aggregated = 0
    for position, page_frame in zip(positions, packed, strict=True):
        state = dp.state_at(position)
        got = unpack_bars(page_frame, bars)
        assert got["label"] == _frame_label(p, dp, position, metric_text(state))
        if len(state.chunks()) * 2 > FRAME_RECTANGLES:
            aggregated += 1
            title = f"GPU:0 after event {position}" + (" (peak)" if position == dp.peak.index else "")
            expected = definition_frame(state, title, FRAME_RECTANGLES)
        else:  # drawn chunk by chunk, by map_spec_and_state
            expected = fragmentation.map_spec(p, "GPU:0", position, lean=True, max_rectangles=FRAME_RECTANGLES)
            assert all("bars" not in t for t in page_frame["data"])
        assert {"data": got["data"], "layout": got["layout"]} == json.loads(json.dumps(expected)), position
    assert 0 < aggregated < len(positions)
    frames = scrubber_frames(p, "GPU:0", positions, max_rectangles=FRAME_RECTANGLES)
    repacked, columns = pack_bars([f.spec for f in frames])
    assert [unpack_bars(f, columns) for f in repacked] == [unpack_bars(f.spec) for f in frames]
    rows = [t["bars"] for f in repacked for t in f["data"] if "bars" in t]
    assert sum(end - first for first, end in rows) == len(decode_columns(columns)["y"]) > 0


def test_allocation_times_early_in_the_log_without_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """``allocated`` for a heap early in the log (at most ``_PREFIX_ROWS`` allocations made) looks
    among those allocations only; it answers what the index of every allocation answers."""
    from gpuviz.analysis import profile as profile_module

    monkeypatch.setattr(profile_module, "_PREFIX_ROWS", 500)
    log = training_log()
    early, indexed = profile(log).devices["GPU:0"], profile(log).devices["GPU:0"]
    indexed._address_index()
    made = early.allocations["alloc_index"].to_numpy()
    assert len(made) > 1000
    for at in [0, 5, *made[[10, 39, 100, 498]].tolist(), *(made[[499]] + 1).tolist(), *made[[499, 500, 1000]].tolist()]:
        state = early.state_at(at)
        addresses = [c.address for c in state.chunks()]  # free chunks too: none of them is live
        got = early.allocated(at, 7, addresses=addresses)
        assert (early._by_address is None) == (at < made[500]), at  # the index only once it is needed
        assert got == indexed.allocated(at, 7, addresses=addresses) == early.allocated(at, 7)
        assert len(got) == sum(c.in_use for c in state.chunks()) > 0 or at == 0
