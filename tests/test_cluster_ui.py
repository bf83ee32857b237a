"""A distributed run in the notebook: ``gpuviz.show_run`` / ``%gpuviz show RUN_DIR`` show the
heatmap, the per-rank table and a selection that opens one rank's full views from its file."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from runs import write_leaky_run, write_rank

import gpuviz
from gpuviz import cluster_summary, load_run
from gpuviz.analysis.cluster import alignment, featured_rows
from gpuviz.analysis.moments import opening_index
from gpuviz.base.units import MiB
from gpuviz.frontends.cli import main
from gpuviz.frontends.run_report import write_run_report
from gpuviz.views.cluster import TIME_AXIS, cluster_grid, cluster_heatmap, cluster_report_html
from gpuviz.views.plotlyjs import bundle_for
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
    _, z = cluster_grid(shown.summary)  # drawn in MiB, as float32
    assert np.array_equal(decoded(figure["data"][0]["z"]), (z / 2**20).astype(np.float32), equal_nan=True)
    assert figure["layout"]["title"]["text"] == "bytes in use by rank over time"
    assert view.table_html.count('class="outlier"') == 1 and '<tr data-row="2" class="outlier">' in view.table_html
    assert "run: 5 ranks on 1 hosts, 5 devices" in view.header and "node0/rank2/GPU:0" in view.header
    assert shown.detail.children == () and shown.rank_dashboard is None  # nothing opened until a selection
    # the switch: fragmentation
    view.metric = "fragmentation"
    figure = json.loads(view.heatmap_json)
    assert figure["layout"]["title"]["text"] == "fragmentation by rank over time"
    _, z = cluster_grid(shown.summary, "fragmentation")
    assert np.array_equal(decoded(figure["data"][0]["z"]), z.astype(np.float32), equal_nan=True)
    bundle, _ = shown._repr_mimebundle_()
    assert bundle["text/html"].count('class="outlier"') == 1 and "application/vnd.jupyter.widget-view+json" in bundle


def test_selecting_a_rank_opens_its_file_only_at_its_peak(leaky_run: Path) -> None:
    shown = gpuviz.show_run(str(leaky_run))
    for rank in (0, 1, 3):  # the summary is made: a selection must read its rank's file and no other
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
    shown.view.selected = 4  # the next rank: the previous rank's widget is closed, its log let go
    assert dashboard.comm is None and shown.rank_dashboard is not None and shown.rank_dashboard.comm is not None
    assert shown.detail.children == (shown.rank_dashboard,) and shown.rank_dashboard.device == "node0/rank4/GPU:0"


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
    (leaky_run / "run.gpuviz-run").write_text("")  # a run manifest shows the same
    with capture_output():
        shell.run_line_magic("gpuviz", f"show {leaky_run / 'run.gpuviz-run'}")
    assert magics.cluster is not cluster and magics.cluster.view.rows == cluster.view.rows
    empty = leaky_run.parent / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match="no log files"):
        shell.run_line_magic("gpuviz", f"show {empty}")


# ------------------------------------------------------------------ the run's HTML report
def test_featured_rows_are_the_outliers_and_the_highest_peak(tmp_path: Path, leaky_run: Path) -> None:
    summary = cluster_summary(load_run(leaky_run))
    assert featured_rows(summary) == [2]  # the outlier is also the highest peak
    assert featured_rows(cluster_summary(load_run(leaky_run), threshold=0.05)) == [2, 3]
    for rank in range(5):  # no outlier: the highest peak alone (rank 1, 6.25 % over the others)
        write_rank(tmp_path, rank, extra=256 * 1024 if rank == 1 else 0)
    calm = cluster_summary(load_run(tmp_path))
    assert calm.outliers.empty and featured_rows(calm) == [1]


def test_run_report_links_the_rows_of_ranks_with_their_own_report(
    leaky_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = leaky_run.parent / "out"
    out.mkdir()
    assert main(["report", str(leaky_run), "-o", str(out / "run.html")]) == 0
    assert capsys.readouterr().out == f"report written to {out / 'run.html'} (1 rank report in run-ranks/)\n"
    bundle = bundle_for({"bar", "scatter", "heatmap"})  # the cartesian one at plotly.py's plotly.js version
    written = sorted(p.name for p in (out / "run-ranks").iterdir())
    assert written == sorted(["node0-rank2.arrow.html", bundle.file_name])
    page = (out / "run.html").read_text(encoding="utf-8")
    summary = cluster_summary(load_run(leaky_run))
    link = "run-ranks/node0-rank2.arrow.html"
    assert page == cluster_report_html(summary, title="gpuviz run: run", links=[None, None, link, None, None])
    assert page.count("data-href=") == 1 and f'<tr data-row="2" class="outlier" data-href="{link}">' in page
    assert "1 rank report: click a rank's row in a heatmap or in the table to open its views" in page
    rank = (out / "run-ranks" / "node0-rank2.arrow.html").read_text(encoding="utf-8")
    assert f'<script src="{bundle.file_name}"></script>' in rank and "gpuviz report: node0/rank2" in rank
    assert "<h2>node0/rank2/GPU:0: peak 14 MiB</h2>" in rank
    assert (out / "run-ranks" / bundle.file_name).read_text(encoding="utf-8") == bundle.source()

    written = write_run_report(load_run(leaky_run), out / "all.html", rank_reports="all", cdn=True)
    assert sorted(written.rank_reports) == [f"node0-rank{r}.arrow" for r in range(5)]
    assert sorted(p.name for p in (out / "all-ranks").iterdir()) == [f"node0-rank{r}.arrow.html" for r in range(5)]
    cdn = f'<script src="{bundle.cdn_url()}">'
    assert cdn in written.rank_reports["node0-rank0.arrow"].read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="rank reports must be one of outliers, all, none, not 'some'"):
        write_run_report(load_run(leaky_run), out / "some.html", rank_reports="some")
    assert not (out / "some.html").exists() and not (out / "some-ranks").exists()
    with pytest.raises(ValueError, match="links must give one address"):
        cluster_report_html(summary, links=[None])


def test_the_report_of_a_log_whose_events_have_no_tag(leaky_run: Path) -> None:
    """(Its scrubber labels used to read the string table at tag -1, and fail on an empty one.)"""
    output = leaky_run.parent / "rank0.html"
    assert main(["report", str(leaky_run / "node0-rank0.arrow"), "-o", str(output), "--cdn"]) == 0
    assert '"label":"event 2 \\u00b7 t = 0.000000 s \\u00b7 peak \\u00b7 in use 4.0 MiB' in output.read_text(
        encoding="utf-8"
    )


# ------------------------------------------------------------------ clock alignment
EPOCH = 1_790_000_000_000_000_000  # ns since the Unix epoch


def anchored_run(folder: Path, *, anchored: tuple[int, ...] = (0, 1, 2)) -> Path:
    """Three ranks whose event clocks start at unrelated values (rank r: r x 5 ms) but which
    started by wall clock 2 ms apart (rank r at EPOCH + r x 2 ms); ranks not in ``anchored``
    have no wall-clock anchor."""
    folder.mkdir()
    for rank in range(3):
        start = 5_000_000 * rank
        run = {"clock_offset_ns": EPOCH + 2_000_000 * rank - start} if rank in anchored else {}
        write_rank(folder, rank, run=run, start_ns=start, leak=MiB if rank == 2 else 0)
    return folder


def first_column(row: np.ndarray) -> int:
    return int(np.flatnonzero(~np.isnan(row))[0])


def test_ranks_with_wall_clock_anchors_line_up_by_wall_clock(tmp_path: Path) -> None:
    summary = cluster_summary(load_run(anchored_run(tmp_path / "run")))
    assert summary.start_epoch_ns == [EPOCH, EPOCH + 2_000_000, EPOCH + 4_000_000]
    mode, offsets = alignment(summary)
    assert mode == "clock" and offsets.tolist() == [0, 2_000_000, 4_000_000]
    assert alignment(summary, "start")[1].tolist() == [0, 0, 0]
    assert summary.table["peak_time_ns"].tolist()[2] == 9_000_000 + 3  # the table stays per rank
    t_ns, z = cluster_grid(summary, columns=130)
    last = int(summary.series[2].time_ns[-1])  # rank 2 ends last: 4 ms after rank 0 starts, plus its span
    assert t_ns[1] == (4_000_000 + last + 1) // 130
    for rank in range(3):
        column = first_column(z[rank])
        assert 0 <= 2_000_000 * rank - t_ns[column] <= t_ns[1] + 1  # its wall-clock start lies in that bucket
        assert np.nanmax(z[rank]) == summary.table["peak_bytes"].iloc[rank] == (4 + 10 * (rank == 2)) * MiB
    _, by_start = cluster_grid(summary, columns=130, align="start")
    assert [first_column(row) for row in by_start] == [0, 0, 0]
    assert cluster_heatmap(summary).layout.xaxis.title.text == TIME_AXIS["clock"]
    assert cluster_heatmap(summary, align="start").layout.xaxis.title.text == TIME_AXIS["start"]
    assert TIME_AXIS == {"start": "time since each rank's first event (s)",
                         "clock": "time since the run's first event, ranks aligned by wall clock (s)"}  # fmt: skip


def test_without_every_anchor_ranks_line_up_by_their_first_events(tmp_path: Path) -> None:
    summary = cluster_summary(load_run(anchored_run(tmp_path / "run", anchored=(0, 2))))
    assert summary.start_epoch_ns == [EPOCH, None, EPOCH + 4_000_000]
    mode, offsets = alignment(summary)
    assert mode == "start" and offsets.tolist() == [0, 0, 0]
    assert cluster_heatmap(summary).layout.xaxis.title.text == TIME_AXIS["start"]
    with pytest.raises(ValueError, match=r"align='clock' needs every rank's wall-clock anchor .*: node0-rank1\.arrow$"):
        cluster_grid(summary, align="clock")
    with pytest.raises(ValueError, match="align must be one of auto, clock, start, not 'wall'"):
        alignment(summary, "wall")


def test_every_front_end_takes_the_alignment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = anchored_run(tmp_path / "run", anchored=(0, 2))
    shown = gpuviz.show_run(str(run), align="start")
    assert json.loads(shown.view.heatmap_json)["layout"]["xaxis"]["title"]["text"] == TIME_AXIS["start"]
    with pytest.raises(ValueError, match=r"align='clock' needs .*: node0-rank1\.arrow$"):
        gpuviz.show_run(str(run), align="clock")
    assert main(["report", str(run), "-o", str(tmp_path / "run.html"), "--align", "clock", "--cdn"]) == 2
    assert capsys.readouterr().err.endswith("without one: node0-rank1.arrow\n")
    assert not (tmp_path / "run.html").exists() and not (tmp_path / "run-ranks").exists()
    (run / "node0-rank1.arrow").unlink()  # the other two have anchors
    assert main(["report", str(run), "-o", str(tmp_path / "run.gpuviz.json"), "--align", "start"]) == 0
    saved = json.loads((tmp_path / "run.gpuviz.json").read_text())
    assert saved["figures"][0]["figure"]["layout"]["xaxis"]["title"]["text"] == TIME_AXIS["start"]
    summary = cluster_summary(load_run(run))
    page = cluster_report_html(summary, plotlyjs="cdn")
    assert TIME_AXIS["clock"] in page and TIME_AXIS["start"] not in page


def test_the_magic_shows_a_run_lined_up_as_asked(tmp_path: Path) -> None:
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    run = anchored_run(tmp_path / "run", anchored=(0, 1, 2))
    shell = InteractiveShell.instance()
    if "GpuvizMagics" not in shell.magics_manager.registry:
        shell.run_line_magic("load_ext", "gpuviz")
    magics = shell.magics_manager.registry["GpuvizMagics"]
    for align, axis in (("start", TIME_AXIS["start"]), ("clock", TIME_AXIS["clock"]), (None, TIME_AXIS["clock"])):
        with capture_output():
            shell.run_line_magic("gpuviz", f"show {run}" + (f" --align {align}" if align else ""))
        assert json.loads(magics.cluster.view.heatmap_json)["layout"]["xaxis"]["title"]["text"] == axis
    shown = magics.cluster
    log = tmp_path / "one.arrow"
    (run / "node0-rank0.arrow").rename(log)
    with pytest.raises(UsageError, match=r"%gpuviz show --align: .*one\.arrow is not a run"):
        shell.run_line_magic("gpuviz", f"show {log} --align start")
    with pytest.raises(UsageError, match=r"only for %gpuviz show RUN_DIR"):
        shell.run_line_magic("gpuviz", "report out.html --align start")
    with pytest.raises(UsageError, match="invalid choice"):
        shell.run_line_magic("gpuviz", f"show {run} --align wall")
    assert magics.cluster is shown  # nothing replaced it
