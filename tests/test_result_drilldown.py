"""A saved result (what the JupyterLab extension renders without a kernel) of a heap of many
segments: its map is the overview by size class with the groups and totals of
``overview.segment_groups``, and it carries each group's map, whose hovers name the allocation
and its call site; a heap of few segments keeps its whole map."""

from __future__ import annotations

import pytest
from manysegments import GROUPS, SITES, segments, write_snapshot

import gpuviz
from gpuviz.analysis.profile import profile
from gpuviz.base.units import MiB
from gpuviz.views.result import result


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    path = write_snapshot(tmp_path_factory.mktemp("many") / "many.pickle")
    return result(profile(gpuviz.load(str(path), progress=False)), title="many.pickle")


def test_the_map_of_many_segments_is_the_overview_with_every_groups_map(saved: dict) -> None:  # type: ignore[type-arg]
    figure = next(f for f in saved["figures"] if f["name"] == "map:GPU:0")
    overview = figure["figure"]
    assert overview["layout"]["meta"] == {"view": "overview", "groups": [g[0] for g in GROUPS]}
    assert overview["data"][0]["x"] == [g[3] for g in GROUPS]
    assert overview["layout"]["yaxis"]["ticktext"] == [f"{g[0]} · {g[1]} segment{'s' if g[1] > 1 else ''}"
                                                       for g in GROUPS]  # fmt: skip
    groups = figure["drill"]["groups"]
    assert [g["name"] for g in groups] == [g[0] for g in GROUPS]
    for (name, count, _, _), group in zip(GROUPS, groups, strict=True):
        meta = group["figure"]["layout"]["meta"]
        expected = [(base, size) for base, size, _, site in segments() if site == SITES[name]]
        assert meta["view"] == "group" and meta["group"] == name
        assert list(zip(meta["bases"], meta["sizes"], strict=True)) == expected and len(expected) == count
        used = next(t for t in group["figure"]["data"] if t["name"] == "used")
        assert sorted(used["y"]) == sorted(f"{b:#x}" for b, _ in expected)
        assert all(f"call site {SITES[name]}" in text for text in used["hovertext"])
    big = groups[2]["figure"]
    assert next(t for t in big["data"] if t["name"] == "used")["x"] == [60 * MiB]


def test_a_few_segments_keep_the_whole_map() -> None:
    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), growth=True, log=log)
    for i in range(5):
        alloc.allocate((i + 1) << 20)
    figure = next(f for f in result(profile(log))["figures"] if f["name"] == "map:GPU:0")
    assert "drill" not in figure
    assert figure["figure"]["layout"]["yaxis"]["title"]["text"] == "segment"
