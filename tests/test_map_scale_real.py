"""The report of a run ten times the largest real snapshot (the cs336 full step repeated side by
side: 10,100 segments) holds what it draws: the opening stop's segments and those of the stops
nearest it within ``DETAIL_ROWS`` rows, the overview's totals elsewhere, and at load an overview
of a few labelled rows; it is smaller than the snapshot PyTorch's viewer embeds. Real traces are
optional test data (``GPUVIZ_TEST_TRACES``); a set-but-missing trace fails."""

from __future__ import annotations

import base64
import json
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
from traces import trace_path

import gpuviz
from gpuviz.analysis.profile import profile
from gpuviz.views.overview import DETAIL_ROWS, MAX_LABELS, OVERVIEW_ABOVE, segment_groups
from gpuviz.views.report import report_html
from gpuviz.views.timeline import MAX_SEGMENT_MARKERS

pytestmark = pytest.mark.slow
CS336 = "pt_snapshot_cs336_ctx128_fullstep_2025.pickle"
COPIES = 10


def repeated(pattern: dict[str, Any], copies: int) -> dict[str, Any]:
    """``copies`` of a snapshot's heap side by side, each in its own address range, their traces
    one after the other in time."""
    trace = pattern["device_traces"][0]
    ends = [s["address"] + s["total_size"] for s in pattern["segments"]] + [e["addr"] + e["size"] for e in trace]
    offset = 1 << max(max(ends).bit_length(), 30)
    times = [e["time_us"] for e in trace if "time_us" in e]
    duration = times[-1] - times[0] + 1 if times else 0
    segments: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for copy in range(copies):
        shift = copy * offset
        for s in pattern["segments"]:
            blocks = [{**b, "address": b["address"] + shift} for b in s["blocks"]]
            segments.append({**s, "address": s["address"] + shift, "blocks": blocks})
        for e in trace:
            moved = {**e, "addr": e["addr"] + shift}
            if "time_us" in e:
                moved["time_us"] = e["time_us"] + copy * duration
            out.append(moved)
    return {**pattern, "segments": segments, "device_traces": [out]}


def test_ten_times_the_largest_snapshot_embeds_what_it_draws(tmp_path: Path) -> None:
    with open(trace_path(CS336), "rb") as file:
        pattern = pickle.load(file)
    path = tmp_path / "ten.pickle"
    path.write_bytes(pickle.dumps(repeated(pattern, COPIES), protocol=4))
    p = profile(gpuviz.load(str(path), progress=False))
    dp = p.devices["GPU:0"]
    state = dp.state_at(dp.opening)
    assert len(state.segments) == 1010 * COPIES
    document = report_html(p)
    assert len(document.encode()) < path.stat().st_size  # PyTorch's page embeds the whole pickle (in base64)
    packed = json.loads(re.search(r'id="map0-frames">(.*?)</script>', document).group(1))  # type: ignore[union-attr]
    aggregated = [len(f["layout"]["meta"]["bases"]) for f in packed if any("bars" in t for t in f["data"])]
    assert len(state.segments) in aggregated  # the opening stop's segments (drawn on drill-down)
    assert sum(aggregated) <= DETAIL_ROWS + len(state.segments)
    totals = [f for f in packed if "groups" in f["layout"].get("meta", {})]
    assert len(totals) >= len(packed) // 2
    bars = json.loads(re.search(r'id="map0-bars">(.*?)</script>', document).group(1))  # type: ignore[union-attr]
    assert len(base64.b64decode(bars["y"]["data"])) // 4 <= 3 * sum(aggregated)  # at most 3 bars a segment
    # drawn at load: the opening's overview, a few rows labelled, its totals exact
    first = json.loads(re.search(r"gpuvizScrubber\('map0', (\{.*?\}), \[", document).group(1))  # type: ignore[union-attr]
    assert first["data"] == []
    in_use = [sum(c.size for c in s.chunks if c.in_use) for s in state.segments]
    expected = [
        [g.name, g.rows, g.reserved, g.in_use] for g in segment_groups([s.size for s in state.segments], in_use)
    ]
    groups = first["layout"]["meta"]["groups"]
    assert [[g["name"], g["rows"], g["reserved"], g["inUse"]] for g in groups] == expected
    assert len(groups) <= MAX_LABELS and len(state.segments) > OVERVIEW_ABOVE
    # the timeline: one marker per span of its axis beyond MAX_SEGMENT_MARKERS segments
    figure = json.loads(re.search(r"var s=(\{.*?\});Plotly.newPlot\('timeline0'", document).group(1))  # type: ignore[union-attr]
    markers = next(t for t in figure["data"] if t.get("name") == "segment reserved")
    assert 0 < len(markers["x"]) <= MAX_SEGMENT_MARKERS
