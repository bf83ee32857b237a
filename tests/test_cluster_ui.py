"""A distributed run in the notebook: ``gpuviz.show_run`` / ``%gpuviz show RUN_DIR`` show the
heatmap, the per-rank table and a selection that opens one rank's full views from its file."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from runs import write_leaky_run

import gpuviz
from gpuviz.analysis.moments import opening_index
from gpuviz.views.cluster import cluster_grid
from gpuviz.widgets.cluster import ClusterDashboard
from gpuviz.widgets.dashboard import Dashboard


def decoded(array: object) -> np.ndarray:
    """A plotly typed array (``{"dtype", "bdata", "shape"}``, as plotly.py writes NumPy arrays) as NumPy."""
    assert isinstance(array, dict)
    values = np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"])
    return values.reshape([int(n) for n in array["shape"].split(",")]) if "shape" in array else values


@pytest.fixture
def leaky_run(tmp_path: Path) -> Path:
    return write_leaky_run(tmp_path / "run")


def test_show_run_draws_the_heatmap_table_and_rank_choices(leaky_run: Path) -> None:
    shown = gpuviz.show_run(str(leaky_run))
    assert isinstance(shown, ClusterDashboard)
    view = shown.view
    assert view.rows == [f"node0/rank{r}/GPU:0" for r in (0, 1)] + ["node0/rank2/GPU:0  ⚠ peak,growth"] + [
        f"node0/rank{r}/GPU:0" for r in (3, 4)
    ]
    figure = json.loads(view.heatmap_json)
    _, z = cluster_grid(shown.summary)
    assert np.array_equal(decoded(figure["data"][0]["z"]), z, equal_nan=True)
    assert figure["layout"]["title"]["text"] == "bytes in use by rank over time"
    assert view.table_html.count('class="outlier"') == 1 and '<tr data-row="2" class="outlier">' in view.table_html
    assert "run: 5 ranks on 1 hosts, 5 devices" in view.header and "node0/rank2/GPU:0" in view.header
    assert shown.detail.children == () and shown.rank_dashboard is None  # nothing opened until a selection
    # the switch: fragmentation
    view.metric = "fragmentation"
    figure = json.loads(view.heatmap_json)
    assert figure["layout"]["title"]["text"] == "fragmentation by rank over time"
    _, z = cluster_grid(shown.summary, "fragmentation")
    assert np.array_equal(decoded(figure["data"][0]["z"]), z, equal_nan=True)
    bundle, _ = shown._repr_mimebundle_()
    assert bundle["text/html"].count('class="outlier"') == 1 and "application/vnd.jupyter.widget-view+json" in bundle


def test_selecting_a_rank_opens_its_file_only_at_its_peak(leaky_run: Path) -> None:
    shown = gpuviz.show_run(str(leaky_run))
    for rank in (0, 1, 3, 4):  # the summary is made: a selection must read rank 2's file and no other
        (leaky_run / f"node0-rank{rank}.arrow").unlink()
    shown.view.selected = 2  # what the dropdown, a heatmap click and a table click set
    dashboard = shown.rank_dashboard
    assert isinstance(dashboard, Dashboard) and shown.detail.children == (dashboard,)
    assert shown.rank_log is not None and shown.rank_log.path == leaky_run / "node0-rank2.arrow"
    assert dashboard.device == "node0/rank2/GPU:0" and dashboard.devices == ["node0/rank2/GPU:0"]
    log = dashboard.event_log
    peak = gpuviz.peak(log, "node0/rank2/GPU:0")
    assert peak.bytes == 14 << 20
    assert opening_index(log, "node0/rank2/GPU:0") == peak.index
    assert dashboard.slider_label.startswith(f"event {peak.index} of {len(log) - 1} · ")
    assert dashboard.slider_label.endswith("· peak")
    assert "node0/rank2/GPU:0 (node0-rank2.arrow)" in dashboard.header


def test_a_rank_file_that_cannot_be_read_is_named_and_the_shown_rank_stays(leaky_run: Path) -> None:
    shown = gpuviz.show_run(str(leaky_run))
    first = shown.select(1)
    (leaky_run / "node0-rank3.arrow").write_bytes(b"not a log")
    with pytest.raises(gpuviz.GpuvizError):
        shown.select(3)
    assert shown.rank_dashboard is first and shown.detail.children == (first,) and shown.view.selected == 1
    assert "cannot open node0-rank3.arrow" in shown.view.header
    with pytest.raises(IndexError, match=r"row 5 is not a row of the run's table \(0..4\)"):
        shown.select(5)


def test_magic_show_of_a_run_directory_shows_the_cluster_view(leaky_run: Path) -> None:
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    if "GpuvizMagics" not in shell.magics_manager.registry:
        shell.run_line_magic("load_ext", "gpuviz")
    magics = shell.magics_manager.registry["GpuvizMagics"]
    with capture_output() as shown:
        shell.run_line_magic("gpuviz", f"show {leaky_run}")
    cluster = magics.cluster
    assert isinstance(cluster, ClusterDashboard) and len(cluster.view.rows) == 5
    assert shown.outputs and "application/vnd.jupyter.widget-view+json" in shown.outputs[0].data
    assert cluster.view.header.startswith(f"<b>gpuviz run: {leaky_run.name}</b>")
    cluster.view.selected = 4
    assert cluster.rank_dashboard is not None and cluster.rank_dashboard.device == "node0/rank4/GPU:0"
    empty = leaky_run.parent / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match="no log files"):
        shell.run_line_magic("gpuviz", f"show {empty}")
