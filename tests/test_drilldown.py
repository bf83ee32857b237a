"""The fragmentation map's overview and drill-down built in Python (what the dashboard and the
JupyterLab result draw): the groups and their totals on a snapshot whose answer is known, a
group's map holding exactly its segments, one segment's map naming each allocation and its
call site, and a level that no longer exists falling back."""

from __future__ import annotations

import pytest
from manysegments import GROUPS, SITES, segments, write_snapshot

import gpuviz
from gpuviz.analysis.profile import profile
from gpuviz.base.heapstate import HeapState
from gpuviz.base.units import MiB
from gpuviz.views.drilldown import GROUP, MAP, OVERVIEW, SEGMENT, MapView, resolve_view, view_spec
from gpuviz.views.overview import OVERVIEW_ABOVE


@pytest.fixture(scope="module")
def heap(tmp_path_factory: pytest.TempPathFactory) -> tuple[HeapState, object]:
    log = gpuviz.load(str(write_snapshot(tmp_path_factory.mktemp("many") / "many.pickle")), progress=False)
    p = profile(log)
    dp = p.devices["GPU:0"]
    return dp.state_at(dp.opening), log.stacks


def test_the_overview_has_one_row_per_size_class_with_its_totals(heap) -> None:  # type: ignore[no-untyped-def]
    state, _ = heap
    assert len(state.segments) == 101 > OVERVIEW_ABOVE
    spec, shown = view_spec(state, MapView())
    assert shown == MapView(OVERVIEW)
    layout = spec["layout"]
    assert layout["meta"] == {"view": "overview", "groups": [g[0] for g in GROUPS]}
    assert layout["yaxis"]["ticktext"] == ["≤ 2.0 MiB · 70 segments", "16 MiB–32 MiB · 30 segments",  # noqa: RUF001
                                           "64 MiB–128 MiB · 1 segment"]  # noqa: RUF001  # fmt: skip
    used, unused = spec["data"]
    assert (used["name"], unused["name"]) == ("in use", "reserved, unused")
    assert used["x"] == [in_use for *_, in_use in GROUPS]
    assert [u + f for u, f in zip(used["x"], unused["x"], strict=True)] == [g[2] for g in GROUPS]
    assert used["hovertext"][0] == (
        "<b>70 segments of ≤ 2.0 MiB</b><br>reserved 140 MiB<br>in use 35 MiB<br>unused 105 MiB<br>click: its segments"
    )


def test_a_group_draws_exactly_its_segments_and_a_segment_names_its_allocation(heap) -> None:  # type: ignore[no-untyped-def]
    state, stacks = heap
    spec, shown = view_spec(state, MapView(GROUP, "16 MiB–32 MiB"), title="GPU:0", stacks=stacks)  # noqa: RUF001
    assert shown == MapView(GROUP, "16 MiB–32 MiB")  # noqa: RUF001
    twenty = [base for base, size, *_ in segments() if size == 20 * MiB]
    assert spec["layout"]["meta"]["bases"] == twenty and len(twenty) == 30
    assert spec["layout"]["meta"]["sizes"] == [20 * MiB] * 30
    drawn = {y for t in spec["data"] for y in t["y"]}
    assert drawn == {f"{b:#x}" for b in twenty}
    assert spec["layout"]["title"]["text"].startswith("GPU:0 · 30 segments of 16 MiB–32 MiB<br>")  # noqa: RUF001

    base = segments()[-1][0]
    spec, shown = view_spec(state, MapView(SEGMENT, "64 MiB–128 MiB", base), stacks=stacks)  # noqa: RUF001
    assert shown.level == SEGMENT and spec["layout"]["meta"]["bases"] == [base]
    used = next(t for t in spec["data"] if t["name"] == "used")
    assert used["y"] == [f"{base:#x}"] and used["x"] == [60 * MiB]
    hover = used["hovertext"][0]
    assert f"address {base:#x}" in hover and f"call site {SITES['64 MiB–128 MiB']}" in hover  # noqa: RUF001
    assert "requested 60 MiB · chunk 60 MiB" in hover


def test_a_level_that_is_gone_falls_back(heap) -> None:  # type: ignore[no-untyped-def]
    state, _ = heap
    assert resolve_view(state, MapView(SEGMENT, "≤ 2.0 MiB", 12345)) == MapView(GROUP, "≤ 2.0 MiB")
    assert resolve_view(state, MapView(GROUP, "no such group")) == MapView(OVERVIEW)
    few = HeapState(state.device, state.segments[:3])
    spec, shown = view_spec(few, MapView(GROUP, "≤ 2.0 MiB"))
    assert shown == MapView(MAP) and spec["layout"]["meta"]["bases"] == [s.base for s in few.segments]
