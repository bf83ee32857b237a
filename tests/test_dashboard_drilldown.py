"""The notebook dashboard's map at scale, in the kernel: a heap of many segments opens as the
overview (the groups and totals of ``overview.segment_groups``), a click (``map_view``) draws a
group's segments or one segment naming its allocation and call site, the level survives the
slider, and a click on the active-memory view moves the map to that moment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from manysegments import GROUPS, SITES, segments, write_snapshot

import gpuviz
from gpuviz.base.units import MiB
from gpuviz.widgets.dashboard import Dashboard


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_snapshot(tmp_path_factory.mktemp("many") / "many.pickle")


def shown(dashboard: Dashboard) -> dict[str, Any]:
    figure: dict[str, Any] = json.loads(dashboard.map_json)
    return figure


def test_many_segments_open_as_the_overview_and_drill_down(snapshot: Path) -> None:
    dashboard = Dashboard(gpuviz.load(str(snapshot), progress=False))
    figure = shown(dashboard)
    assert figure["layout"]["meta"] == {"view": "overview", "groups": [g[0] for g in GROUPS]}
    assert dashboard.map_view == {"level": "overview", "group": "", "base": -1}
    assert figure["data"][0]["x"] == [g[3] for g in GROUPS]  # bytes in use per group
    assert figure["layout"]["yaxis"]["ticktext"][1] == "16 MiB–32 MiB · 30 segments"  # noqa: RUF001

    dashboard.map_view = {"level": "group", "group": "≤ 2.0 MiB", "base": -1}  # what a click on row 0 sets
    figure = shown(dashboard)
    small = [base for base, size, *_ in segments() if size == 2 * MiB]
    assert figure["layout"]["meta"] == {"view": "group", "group": "≤ 2.0 MiB", "bases": small, "sizes": [2 * MiB] * 70}
    assert {y for t in figure["data"] for y in t["y"]} == {f"{b:#x}" for b in small}

    base = small[7]
    dashboard.map_view = {"level": "segment", "group": "≤ 2.0 MiB", "base": base}
    figure = shown(dashboard)
    assert figure["layout"]["meta"]["bases"] == [base]
    used = next(t for t in figure["data"] if t["name"] == "used")
    assert used["y"] == [f"{base:#x}"] and used["x"] == [512 << 10]
    assert f"address {base:#x}" in used["hovertext"][0]
    assert f"call site {SITES['≤ 2.0 MiB']}" in used["hovertext"][0]

    dashboard.position = dashboard.max_position - 1  # the slider keeps the level where the segment exists
    assert dashboard.map_view == {"level": "segment", "group": "≤ 2.0 MiB", "base": base}
    assert shown(dashboard)["layout"]["meta"]["bases"] == [base]
    dashboard.position = 0  # one segment then: the map drawn whole
    assert dashboard.map_view == {"level": "map", "group": "", "base": -1}
    assert shown(dashboard)["layout"]["meta"]["view"] == "map"
    dashboard.position = dashboard.max_position
    assert dashboard.map_view == {"level": "overview", "group": "", "base": -1}
    dashboard.map_view = {"level": "group", "group": "no such group", "base": -1}
    assert dashboard.map_view == {"level": "overview", "group": "", "base": -1}


def test_a_few_segments_are_drawn_whole() -> None:
    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), growth=True, log=log)
    for i in range(20):
        alloc.allocate((i + 1) << 20, tag=f"t{i}")
    dashboard = Dashboard(log)
    assert dashboard.map_view["level"] == "map"
    meta = shown(dashboard)["layout"]["meta"]
    assert meta["view"] == "map" and len(meta["bases"]) == len(alloc.state().segments)


def test_a_click_on_the_active_memory_view_moves_the_map_to_that_moment() -> None:
    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), growth=True, log=log)
    kept = [alloc.allocate((i + 1) << 20, tag="kept") for i in range(10)]
    for p in kept:
        alloc.free(p)
    dashboard = Dashboard(log)
    active = json.loads(dashboard.active_json)
    moments = sorted({int(c) for t in active["data"] for c in np.ravel(t.get("customdata") or [])})
    assert moments  # every point of the view carries its log position
    series = dashboard.profile.devices[dashboard.device].series.index  # type: ignore[union-attr]
    target = int(series[len(series) // 2])
    dashboard.clicked = target  # what a click on that point sets
    assert int(series[dashboard.position]) == target
    assert dashboard.slider_label.startswith(f"event {target} of ")
    assert shown(dashboard)["layout"]["title"]["text"].startswith(f"{dashboard.device} after event {target} ")
    assert dashboard.clicked == -1  # ready for the next click
