"""A drill-down group of more than ``overview.DENSE_ROWS`` segments, in a saved result
(JupyterLab) and in the notebook dashboard: drawn as an image of at most
``densegroup.IMAGE_ROWS`` rows (runs of consecutive segments), so what is sent follows what is
drawn, not the number of segments; each row's hover names its run and largest allocation with
its call site, and the overview and the groups of few segments stay as they were."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from manysegments import GROUPS, SITES, dense_groups, segments, write_snapshot

import gpuviz
from gpuviz.analysis.heapcolumns import HeapColumns
from gpuviz.analysis.profile import profile
from gpuviz.base.units import KiB, MiB
from gpuviz.views.densegroup import IMAGE_ROWS, dense_group_spec, run_length
from gpuviz.views.overview import DENSE_COLUMNS, DENSE_ROWS
from gpuviz.views.result import result
from gpuviz.widgets.dashboard import Dashboard

SMALL = 2400  # segments of 2 MiB: 6 a row of the image
SMALL_NAME = GROUPS[0][0]


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    folder = tmp_path_factory.mktemp("dense")
    return {n: write_snapshot(folder / f"dense{n}.pickle", dense_groups(n)) for n in (SMALL, 2 * SMALL)}


def map_figure(path: Path) -> dict[str, Any]:
    saved = result(profile(gpuviz.load(str(path), progress=False)))
    figure: dict[str, Any] = next(f for f in saved["figures"] if f["name"] == "map:GPU:0")
    return figure


def test_a_result_draws_a_group_of_many_segments_as_an_image_of_runs(snapshots: dict[int, Path]) -> None:
    figure = map_figure(snapshots[SMALL])
    overview = figure["figure"]
    assert overview["layout"]["meta"]["groups"] == [g[0] for g in GROUPS]
    assert overview["data"][0]["x"] == [SMALL * 512 * KiB, *[g[3] for g in GROUPS[1:]]]
    dense = figure["drill"]["groups"][0]["figure"]
    bases = [base for base, size, *_ in segments(dense_groups(SMALL)) if size == 2 * MiB]
    meta = dense["layout"]["meta"]
    assert meta == {"dense": True, "firsts": bases[::6], "counts": [6] * 400, "view": "group", "group": SMALL_NAME}
    image, rows = dense["data"]
    assert image["type"] == "heatmap" and len(image["z"]) == IMAGE_ROWS
    # 512 KiB in use at the start of each 2 MiB segment: the first quarter of the 48 cells in use
    assert image["z"][0] == [1.0] * 12 + [0.0] * 36 and all(z == image["z"][0] for z in image["z"])
    assert rows["hovertext"][1] == (
        f"<b>6 segments {bases[6]:#x} to {bases[11]:#x}</b><br>reserved 12 MiB · in use 3.0 MiB"
        f"<br>largest allocation <b>(untagged)</b> 512 KiB at {bases[6]:#x}<br>call site {SITES[SMALL_NAME]}"
    )
    assert len(rows["hovertext"]) == IMAGE_ROWS
    # the groups of few segments are drawn segment by segment, as before
    mid = figure["drill"]["groups"][1]["figure"]["layout"]["meta"]
    assert mid["view"] == "group" and len(mid["bases"]) == GROUPS[1][1]


def test_a_results_size_follows_what_is_drawn_not_the_segments(snapshots: dict[int, Path]) -> None:
    one, two = (map_figure(snapshots[n]) for n in (SMALL, 2 * SMALL))
    dense_one, dense_two = (f["drill"]["groups"][0]["figure"] for f in (one, two))
    assert dense_two["layout"]["meta"]["counts"] == [12] * 400  # twice the segments a row, as many rows
    assert len(dense_two["data"][0]["z"]) == len(dense_one["data"][0]["z"]) == IMAGE_ROWS
    size_one, size_two = len(json.dumps(one)), len(json.dumps(two))
    assert size_two < 1.02 * size_one  # twice the segments: the same drawing (longer numbers in words only)
    assert "bases" not in dense_two["layout"]["meta"]


def test_the_dashboard_draws_a_dense_group_and_opens_a_rows_first_segment(snapshots: dict[int, Path]) -> None:
    dashboard = Dashboard(gpuviz.load(str(snapshots[SMALL]), progress=False))
    overview = json.loads(dashboard.map_json)
    assert overview["layout"]["meta"]["view"] == "overview"
    dashboard.map_view = {"level": "group", "group": SMALL_NAME, "base": -1}
    dense = json.loads(dashboard.map_json)
    assert [t["type"] for t in dense["data"]] == ["heatmap", "bar"]
    assert dense["layout"]["meta"]["counts"] == [6] * 400
    bases = [base for base, size, *_ in segments(dense_groups(SMALL)) if size == 2 * MiB]
    dashboard.map_view = {"level": "segment", "group": SMALL_NAME, "base": dense["layout"]["meta"]["firsts"][3]}
    alone = json.loads(dashboard.map_json)
    assert alone["layout"]["meta"]["bases"] == [bases[18]]
    used = next(t for t in alone["data"] if t["name"] == "used")
    assert used["x"] == [512 * KiB] and f"call site {SITES[SMALL_NAME]}" in used["hovertext"][0]
    dashboard.close()


def _heap(rng: np.random.Generator, count: int) -> HeapColumns:
    """``count`` segments of 1 to 5 chunks of random sizes (4 KiB multiples), each in use or free."""
    bases, sizes, address, size, in_use = [], [], [], [], []
    base = 1 << 40
    for _ in range(count):
        parts = (rng.integers(1, 50, int(rng.integers(1, 6))) * 4096).tolist()
        bases.append(base)
        sizes.append(sum(parts))
        for offset, part in zip(np.cumsum([0, *parts[:-1]]).tolist(), parts, strict=True):
            address.append(base + offset)
            size.append(part)
            in_use.append(bool(rng.integers(0, 2)))
        base += sum(parts) + (1 << 20)
    n = len(address)
    return HeapColumns.build("GPU:0", np.array(bases), np.array(sizes), np.array(address), np.array(size),
                             np.array(size), np.array(in_use), -np.ones(n), -np.ones(n), [])  # fmt: skip


@pytest.mark.parametrize("count", [DENSE_ROWS // 10, 2 * IMAGE_ROWS + 50])
def test_each_cell_is_the_share_of_its_runs_bytes_in_use(count: int) -> None:
    heap = _heap(np.random.default_rng(count), count)
    per = run_length(count)
    z = dense_group_spec(heap, heading="h", site_of=lambda stack: None)["data"][0]["z"]
    edges = np.linspace(0, int(heap.sizes.max()), DENSE_COLUMNS + 1)
    offsets = (heap.address - heap.bases[heap.owner]).tolist()
    assert len(z) == -(-count // per) and per == (1 if count < IMAGE_ROWS else 3)
    for run, first in enumerate(range(0, count, per)):
        for j in range(DENSE_COLUMNS):
            held = span = 0.0
            for row in range(first, min(first + per, count)):
                lo, hi = edges[j], min(edges[j + 1], float(heap.sizes[row]))
                span += max(0.0, hi - lo)
                for k in np.flatnonzero((heap.owner == row) & heap.in_use).tolist():
                    held += max(0.0, min(hi, offsets[k] + heap.size[k]) - max(lo, offsets[k]))
            if span == 0:
                assert z[run][j] is None
            else:
                assert z[run][j] == pytest.approx(held / span, abs=1e-3)


def test_subset_keeps_the_segments_at_rows_and_their_chunks() -> None:
    heap = _heap(np.random.default_rng(3), 9)
    part = heap.subset([7, 2])
    whole = heap.to_state()
    assert part.to_state().segments == (whole.segments[2], whole.segments[7])


def test_the_dashboards_map_follows_what_is_drawn_not_the_segments(snapshots: dict[int, Path]) -> None:
    sizes = []
    for n in (SMALL, 2 * SMALL):
        dashboard = Dashboard(gpuviz.load(str(snapshots[n]), progress=False))
        overview = len(dashboard.map_json)
        dashboard.map_view = {"level": "group", "group": SMALL_NAME, "base": -1}
        sizes.append((overview, len(dashboard.map_json), len(json.loads(dashboard.map_json)["data"][0]["z"])))
        dashboard.close()
    (overview_one, group_one, rows_one), (overview_two, group_two, rows_two) = sizes
    assert rows_one == rows_two == IMAGE_ROWS
    assert overview_two < 1.02 * overview_one and group_two < 1.02 * group_one
