"""The largest real PyTorch snapshot (cs336 full step: 1,010 segments) in the notebook dashboard
and in the saved result the JupyterLab extension draws: both open its map as the overview by
size class, with the groups of ``overview.segment_groups`` (the HTML report's), and a group's
map labels at most ``MAX_LABELS`` rows. Real traces are optional test data (``GPUVIZ_TEST_TRACES``)."""

from __future__ import annotations

# ruff: noqa: RUF001  (the size classes are named with an en dash)
import json
from typing import Any

import pytest
from traces import needs_traces, trace_path

import gpuviz
from gpuviz.analysis.profile import profile
from gpuviz.views.drilldown import heap_groups
from gpuviz.views.overview import MAX_LABELS
from gpuviz.views.result import result
from gpuviz.widgets.dashboard import Dashboard

pytestmark = [pytest.mark.slow, needs_traces]
CS336 = "pt_snapshot_cs336_ctx128_fullstep_2025.pickle"
EXPECTED = [("≤ 2.0 MiB", 10), ("16 MiB–32 MiB", 542), ("64 MiB–128 MiB", 457), ("128 MiB–256 MiB", 1)]


@pytest.fixture(scope="module")
def log() -> gpuviz.EventLog:
    return gpuviz.load(str(trace_path(CS336)), progress=False)


def test_the_dashboard_opens_the_1010_segments_as_the_overview(log: gpuviz.EventLog) -> None:
    dashboard = Dashboard(log)
    figure: dict[str, Any] = json.loads(dashboard.map_json)
    p = dashboard.profile
    assert p is not None
    state = p.devices["GPU:0"].state_at(int(p.devices["GPU:0"].series.index[dashboard.position]))
    assert len(state.segments) == 1010
    groups = heap_groups(state)
    assert [(g.name, len(g.rows)) for g in groups] == EXPECTED
    assert figure["layout"]["meta"]["groups"] == [name for name, _ in EXPECTED]
    assert figure["data"][0]["x"] == [g.in_use for g in groups]
    dashboard.map_view = {"level": "group", "group": "16 MiB–32 MiB", "base": -1}
    figure = json.loads(dashboard.map_json)
    assert len(figure["layout"]["meta"]["bases"]) == 542
    assert 0 < len(figure["layout"]["yaxis"]["tickvals"]) <= MAX_LABELS


def test_the_saved_result_opens_the_1010_segments_as_the_overview(log: gpuviz.EventLog) -> None:
    saved = result(profile(log), title=CS336)
    figure = next(f for f in saved["figures"] if f["name"] == "map:GPU:0")
    assert figure["figure"]["layout"]["meta"]["groups"] == [name for name, _ in EXPECTED]
    assert [(g["name"], len(g["figure"]["layout"]["meta"]["bases"])) for g in figure["drill"]["groups"]] == EXPECTED
    for group in figure["drill"]["groups"]:
        assert len(group["figure"]["layout"]["yaxis"]["tickvals"]) <= MAX_LABELS
        # every chunk drawn on its own (none aggregated): each block's hover names its allocation
        assert [t["name"] for t in group["figure"]["data"]] == ["free", "waste", "used"]
        assert all(text.startswith("<b>") and "requested " in text
                   for text in group["figure"]["data"][2]["hovertext"])  # fmt: skip
