"""The live map of a big heap (``live_map`` over ``LiveFollower.arrays``) and the live timeline's
reduction: exact values on constructed heaps, and agreement with the HeapState of a random run."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

import gpuviz
from gpuviz.analysis.live import HeapArrays, LiveFollower, LivePoints
from gpuviz.views.fragmentation import metric_text, zoom_range
from gpuviz.views.livemap import heap_numbers, live_map
from gpuviz.widgets.dashboard import LIVE_EXACT_CHUNKS, Dashboard, _reduce

BASE = 1 << 40


def _heap(segments: list[tuple[int, int]], chunks: list[tuple[int, int, int]]) -> HeapArrays:
    def column(rows: list[tuple[int, ...]], i: int) -> np.ndarray:
        return np.array([row[i] for row in rows], dtype=np.int64)

    return HeapArrays("GPU:0", column(segments, 0), column(segments, 1), column(chunks, 0), column(chunks, 1),
                      column(chunks, 2))  # fmt: skip


def _bars(figure: dict) -> dict[str, list[tuple[str, int, int]]]:
    return {trace["name"]: list(zip(trace["y"], trace["base"], trace["x"], strict=True)) for trace in figure["data"]}


def test_live_map_draws_each_bucket_as_its_used_waste_and_free_bytes() -> None:
    heap = _heap([(BASE, 4096)], [(BASE, 1024, 1000), (BASE + 1024, 1024, 512), (BASE + 3072, 512, 512)])
    assert heap_numbers(heap) == (2560, 4096, 1024, None)  # the hole [2048, 3072) is the largest
    figure = live_map(heap, title="GPU:0 (live)", max_rectangles=6)  # 2 buckets of 2 KiB
    row = "0x10000000000"
    assert _bars(figure) == {
        "free (aggregated)": [(row, 2560, 1536)],
        "waste (aggregated)": [(row, 1512, 536)],
        "used (aggregated)": [(row, 0, 1512), (row, 2048, 512)],
    }
    used = figure["data"][2]
    assert used["hovertext"] == [
        "2 chunks from 0x10000000000<br>used 1.5 KiB<br>waste 536 B<br>free 0 B",
        "1 chunks from 0x10000000800<br>used 512 B<br>waste 0 B<br>free 1.5 KiB",
    ]
    assert figure["layout"]["title"]["text"] == (
        "GPU:0 (live)<br><sub>in use 2.5 KiB · pool 4.0 KiB · largest free 1.0 KiB · fragmentation 33.3%"
        " · 3 chunks in use, drawn in buckets</sub>"
    )
    assert figure["layout"]["uirevision"] == "GPU:0" and figure["layout"]["xaxis"]["range"] == [0, 4096]
    with pytest.raises(ValueError, match="max_rectangles must be >= 3, got 2"):
        live_map(heap, title="x", max_rectangles=2)


def test_live_map_buckets_the_used_range_and_keeps_the_rest_of_each_segment_as_one_bucket() -> None:
    mib = 1 << 20
    heap = _heap([(BASE, mib), (BASE + mib, mib)], [(BASE, 1024, 1024)])
    assert heap_numbers(heap) == (1024, 2 * mib, mib, (0, 1281))  # 1 KiB of 2 MiB: zoomed to 1.25 times 1 KiB
    figure = live_map(heap, title="t", max_rectangles=6)  # one bucket per segment over the used range
    first, second = "0x10000000000", "0x10000100000"
    assert _bars(figure) == {
        "free (aggregated)": [(first, 1024, 257), (first, 1281, mib - 1281), (second, 0, 1281),
                              (second, 1281, mib - 1281)],
        "waste (aggregated)": [],
        "used (aggregated)": [(first, 0, 1024)],
    }  # fmt: skip
    assert figure["layout"]["xaxis"]["range"] == [0, 1281]
    assert [b["label"] for b in figure["layout"]["updatemenus"][0]["buttons"]] == ["used range", "whole pool"]


def test_follower_arrays_and_the_live_map_agree_with_the_heap_state_of_a_random_run() -> None:
    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), growth=True, log=log, device="GPU:0")
    follower = LiveFollower(log)
    rng = random.Random(3)
    live: list[int] = []
    for step in range(4000):
        if live and rng.random() < 0.4:
            alloc.free(live.pop(rng.randrange(len(live))))
        else:
            live.append(alloc.allocate(rng.choice([100, 3000, 70_000, 1 << 20]), tag=f"t{step % 3}"))
        if step % 997 == 0 or step == 3999:
            follower.update()
            state = follower.state("GPU:0")
            heap = follower.arrays("GPU:0")
            chunks = [c for c in state.chunks() if c.in_use]
            assert heap.address.tolist() == [c.address for c in chunks]
            assert heap.size.tolist() == [c.size for c in chunks]
            assert heap.requested.tolist() == [c.requested for c in chunks]
            assert heap.segment_base.tolist() == [s.base for s in state.segments]
            assert heap.segment_size.tolist() == [s.size for s in state.segments]
            numbers = (state.bytes_in_use, state.pool_bytes, state.largest_free_chunk, zoom_range(state))
            assert heap_numbers(heap) == numbers
            figure = json.loads(json.dumps(live_map(heap, title="GPU:0")))
            assert metric_text(state) in figure["layout"]["title"]["text"]
            assert sum(sum(trace["x"]) for trace in figure["data"]) == state.pool_bytes  # nothing dropped
            drawn = {n: sum(t["x"]) for n, t in zip(("free", "waste", "used"), figure["data"], strict=True)}
            assert drawn["used"] == state.bytes_requested
            assert drawn["waste"] == state.bytes_in_use - state.bytes_requested


def test_the_live_dashboard_draws_big_heaps_in_buckets_and_small_ones_chunk_by_chunk() -> None:
    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), growth=True, log=log)
    kept = [alloc.allocate(4096, tag="small") for _ in range(LIVE_EXACT_CHUNKS)]
    board = Dashboard(log)
    board.live_update()
    exact = json.loads(board.map_json)
    assert [t["name"] for t in exact["data"]][:3] == ["free", "waste", "used"]
    assert len(exact["data"][2]["x"]) == LIVE_EXACT_CHUNKS and "<b>small</b>" in exact["data"][2]["hovertext"][0]
    kept.append(alloc.allocate(4096, tag="one more"))
    board._map_due = 0.0
    board.live_update()
    bucketed = json.loads(board.map_json)
    assert [t["name"] for t in bucketed["data"]] == ["free (aggregated)", "waste (aggregated)", "used (aggregated)"]
    assert f"{LIVE_EXACT_CHUNKS + 1} chunks in use, drawn in buckets" in bucketed["layout"]["title"]["text"]
    assert sum(bucketed["data"][2]["x"]) == 4096 * len(kept)
    assert board.slider_label.startswith(f"live · event {len(log) - 1} · ")


def test_the_live_timeline_is_reduced_to_the_peak_and_last_point_of_each_run() -> None:
    in_use = np.array([1, 5, 2, 3, 0, 4, 9, 1, 1, 2], dtype=np.int64)
    points = LivePoints(np.arange(10), np.arange(10) * 100, in_use, in_use // 2, in_use * 0 + 64)
    reduced = _reduce(points, 4)  # two runs of five: [1, 5, 2, 3, 0] and [4, 9, 1, 1, 2]
    assert reduced.index.tolist() == [1, 4, 6, 9] and reduced.bytes_in_use.tolist() == [5, 0, 9, 2]
    assert reduced.time_ns.tolist() == [100, 400, 600, 900] and reduced.bytes_requested.tolist() == [2, 0, 4, 1]
    assert _reduce(points, 10) is points
