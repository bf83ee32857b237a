"""Following a growing log (LiveFollower) and the dashboard drawn from it, in-process."""

from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest
from waiting import wait_until

import gpuviz
from gpuviz.analysis.live import LiveFollower
from gpuviz.analysis.moments import pinning
from gpuviz.analysis.timeline import timeline_series
from gpuviz.widgets.dashboard import Dashboard


def test_follower_state_and_points_match_replay_and_timeline_at_every_look() -> None:
    log = gpuviz.EventLog()
    gpu = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), growth=True, log=log, device="GPU:0")
    cpu = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB", base=1 << 48), growth=True, log=log, device="CPU:0")
    follower = LiveFollower(log)
    rng = random.Random(7)
    live: list[tuple[gpuviz.BFCAllocator, int]] = []
    seen: dict[str, list[np.ndarray]] = {"GPU:0": [], "CPU:0": []}
    for step in range(3000):
        if live and rng.random() < 0.45:
            owner, address = live.pop(rng.randrange(len(live)))
            owner.free(address)
        else:
            owner = gpu if rng.random() < 0.7 else cpu
            live.append((owner, owner.allocate(rng.choice([100, 3000, 70_000, 1 << 20, 5 << 20]), tag=f"t{step % 5}")))
        if step % 5 == 0:
            gpuviz.mark(f"step {step}", log=log)
        if rng.random() < 0.02 or step == 2999:
            for device, (points, _) in follower.update().items():
                seen[device].append(np.stack([points.index, points.bytes_in_use, points.bytes_requested,
                                              points.pool_bytes]))  # fmt: skip
            replayed = gpuviz.replay(log)
            assert follower.state("GPU:0") == replayed.state_at(-1, device="GPU:0")
            assert follower.state("CPU:0") == replayed.state_at(-1, device="CPU:0")
    assert follower.update() == {}  # nothing new
    for device in ("GPU:0", "CPU:0"):
        series = timeline_series(log, device)
        points = np.concatenate(seen[device], axis=1)
        assert points[0].tolist() == series.index.tolist()  # every allocator event, once
        assert points[1].tolist() == series.bytes_in_use.tolist()
        assert points[2].tolist() == series.bytes_requested.tolist()
        assert points[3].tolist() == series.pool_bytes.tolist()


def _oom_log() -> tuple[gpuviz.EventLog, int]:
    """A fragmented 8 MiB heap and a 3 MiB request that fails; returns the log and the OOM's index."""
    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), memory_limit="8MiB", growth=False, log=log)
    blocks = [alloc.allocate(1 << 20, tag=f"block {i}") for i in range(8)]
    for block in blocks[::2]:
        alloc.free(block)
    gpuviz.mark("before the failure", log=log)
    with pytest.raises(gpuviz.OutOfMemoryError):
        alloc.allocate(3 << 20, tag="big")
    oom = len(log) - 1
    assert log[oom].kind == "oom"
    alloc.free(blocks[1])
    return log, oom


def test_dashboard_opens_at_the_first_oom_with_the_pinning_list_and_labelled_slider() -> None:
    log, oom = _oom_log()
    dashboard = Dashboard(log)
    t = (int(log["time_ns"][oom]) - int(log["time_ns"][0])) / 1e9
    assert dashboard.slider_label == f"event {oom} of {len(log) - 1} · {t:.6f} s · oom · OOM"
    state = gpuviz.replay(log).state_at(oom, device="GPU:0")
    sentence = pinning(state, 3 << 20, log=log, at_index=oom).sentence()
    assert sentence in dashboard.pinning_html and "Out of memory: 3.0 MiB requested" in dashboard.pinning_html
    assert sentence.endswith("freeing this allocation would have made a hole of 3.0 MiB")
    # one row: the block between two free 1 MiB holes (the first such, by address)
    rows = dashboard.pinning_html.count('<tr class="pinning">')
    assert rows == 1 and '<tr class="pinning"><td class="text">block 1</td><td data-value="1048576">1.0 MiB</td>' in (
        dashboard.pinning_html
    )
    labels = [label for label, _ in dashboard.stops]
    assert f"OOM · event {oom}" in labels
    assert any(label.startswith("mark 'before the failure' · event ") for label in labels)
    assert any(label.startswith("peak · event ") for label in labels)
    figure = json.loads(dashboard.map_json)
    assert figure["layout"]["uirevision"] == "GPU:0"  # zoom and pan survive scrubbing
    assert f"after event {oom} (oom)" in figure["layout"]["title"]["text"]
    traces = {trace["name"]: trace for trace in figure["data"]}
    assert traces["failed request"]["x"] == [3 << 20]  # the ghost bar of the request
    assert len(traces["pinning"]["x"]) == 1  # block 1 highlighted

    dashboard.position -= 1  # one allocator event back (what the left arrow key sends)
    previous = int(timeline_series(log, "GPU:0").index[dashboard.position])
    assert dashboard.slider_label.startswith(f"event {previous} of {len(log) - 1} · ")
    assert dashboard.pinning_html == ""
    stepped = json.loads(dashboard.map_json)
    assert stepped["layout"]["uirevision"] == "GPU:0"
    assert "failed request" not in {trace["name"] for trace in stepped["data"]}  # no ghost bar before the OOM


def test_dashboard_opens_at_the_peak_without_an_oom() -> None:
    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), growth=True, log=log)
    a = alloc.allocate(4 << 20)
    b = alloc.allocate(1 << 20)
    alloc.free(a)
    alloc.free(b)
    dashboard = Dashboard(log)
    peak = gpuviz.peak(log).index
    assert dashboard.slider_label.startswith(f"event {peak} of {len(log) - 1} · ")
    assert dashboard.slider_label.endswith(" · alloc · peak")


def test_live_dashboard_follows_a_growing_log_from_its_thread() -> None:
    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), growth=True, log=log)
    dashboard = Dashboard(log, live=True, rate_hz=50, budget=1.0)
    kept = [alloc.allocate((i % 5 + 1) << 16, tag="kept") for i in range(200)]
    wait_until(
        lambda: dashboard.live_updates >= 3 and "(live)" in dashboard.map_json, "three live updates of the dashboard"
    )
    assert "(live)" in dashboard.map_json and dashboard.slider_label.startswith("live · event ")
    dashboard.stop_live()
    assert dashboard.refresh_count == 1 and len(kept) == 200
    assert dashboard.header.startswith("<b>gpuviz</b> · ") and f"{len(log)} events" in dashboard.header


def test_live_map_redraws_stay_within_their_share_of_the_time() -> None:
    """A changed heap is redrawn at once the first time, then not before its drawing cost divided
    by ``MAP_SHARE`` has passed (the timeline and header still update); once due, it is drawn."""
    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), growth=True, log=log)
    kept = [alloc.allocate(1 << 16, tag="first")]
    board = Dashboard(log)
    board.live_update()
    first = board.map_json
    assert "(live)" in first and board._map_due > 0
    board._map_due = time.perf_counter() + 3600  # as if that map had cost a minute: not due for an hour
    kept.append(alloc.allocate(1 << 20, tag="second"))
    board.live_update()
    kept.append(alloc.allocate(1 << 20, tag="third"))
    board.live_update()
    assert board.map_json == first and board.live_updates == 3 and f"{len(log)} events" in board.header
    board._map_due = 0.0  # due: the heap changed meanwhile, so it is drawn though nothing is new
    board.live_update()
    assert board.map_json != first and "third" in board.map_json and len(kept) == 3
