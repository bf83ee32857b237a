"""Writing a distributed run's report (``gpuviz report RUN_DIR -o run.html``): the run's page
(heatmaps, per-rank table) and, in a folder beside it, the full report of chosen ranks, linked
from their rows so that a click on a rank's heatmap row or table row opens its views.

The rank reports go to ``<name>-ranks/`` beside the run's page (``run.html`` ->
``run-ranks/node0-rank2.arrow.html``) and share one plotly.js file there (the cartesian bundle,
``plotly-cartesian.min.js``, unless a page needs the full one), or load it from the CDN with
``cdn``, so many of them cost little more than their figures. Each is the report
``gpuviz report FILE`` writes for that rank's log (every device, maps opened at the first
OOM, else the peak), with the run's device names (``node0/rank2/GPU:0``). Only the chosen
ranks' files are opened again, one at a time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from gpuviz.analysis.cluster import ClusterSummary, alignment, cluster_summary, featured_rows
from gpuviz.analysis.profile import ViewOptions, profile
from gpuviz.analysis.run import Run
from gpuviz.views.cluster import cluster_report_html, cluster_result
from gpuviz.views.plotlyjs import Bundle
from gpuviz.views.report import report_document
from gpuviz.views.result import FILE_EXTENSION

__all__ = ["RANK_REPORTS", "RunReport", "rank_report_rows", "write_run_report"]

RANK_REPORTS = ("outliers", "all", "none")
"""Which ranks get their own report: the outliers and the rank with the highest peak, every rank, none."""


@dataclass(frozen=True)
class RunReport:
    """What ``write_run_report`` wrote: the run's page and, per rank file, its report."""

    path: Path
    rank_reports: dict[str, Path] = field(default_factory=dict)


def rank_report_rows(summary: ClusterSummary, which: str) -> list[int]:
    """The table rows whose ranks get a report (``which``: one of ``RANK_REPORTS``)."""
    if which == "outliers":
        return featured_rows(summary)
    if which == "all":
        return list(range(len(summary.table)))
    if which == "none":
        return []
    raise ValueError(f"rank reports must be one of {', '.join(RANK_REPORTS)}, not {which!r}")


def write_run_report(
    run: Run,
    output: str | Path,
    *,
    summary: ClusterSummary | None = None,
    rank_reports: str = "outliers",
    options: ViewOptions | None = None,
    cdn: bool = False,
    title: str | None = None,
    align: str = "auto",
) -> RunReport:
    """Write the run's page to ``output`` and the chosen ranks' reports beside it (module doc);
    an ``output`` ending in ``.gpuviz.json`` gets the run's result (``cluster_result``) instead.

    ``options``: how the rank reports are drawn (their ``device`` is ignored: every device of a
    rank is shown); ``align``: how the heatmaps line ranks up (``cluster_grid``). Raises
    ``ValueError`` for an unknown ``rank_reports`` or ``align`` before writing anything.
    """
    if rank_reports not in RANK_REPORTS:
        raise ValueError(f"rank reports must be one of {', '.join(RANK_REPORTS)}, not {rank_reports!r}")
    target = Path(output)
    summary = summary if summary is not None else cluster_summary(run)
    alignment(summary, align)  # a bad value, or "clock" without every anchor, before anything is written
    if target.name.endswith(FILE_EXTENSION):  # the result, for JupyterLab; no rank reports
        result = cluster_result(summary, title=title or f"gpuviz run: {target.name}", align=align)
        target.write_text(json.dumps(result, separators=(",", ":")), encoding="utf-8")
        return RunReport(target)
    rows = rank_report_rows(summary, rank_reports)
    table = summary.table
    positions = {path.name: position for position, path in enumerate(run.paths)}
    files = sorted({str(table["file"].iloc[row]) for row in rows}, key=lambda name: positions[name])
    folder = target.with_name(target.name.split(".")[0] + "-ranks")
    written: dict[str, Path] = {}
    if files:
        folder.mkdir(exist_ok=True)
    bundles: set[Bundle] = set()
    drawn = (options or ViewOptions()).with_(device=None)
    for file in files:
        rank_log = run.open(positions[file])
        page = folder / f"{file}.html"
        document = report_document(
            profile(rank_log.log, drawn),
            plotlyjs="cdn" if cdn else "directory",
            title=f"gpuviz report: {rank_log.prefix.rstrip('/')}",
            source=file,
        )
        page.write_text(document.html, encoding="utf-8")
        written[file] = page
        if not cdn and document.bundle not in bundles:  # the plotly.js file the page loads, once per folder
            (folder / document.bundle.file_name).write_text(document.bundle.source(), encoding="utf-8")
            bundles.add(document.bundle)
    links = [f"{quote(folder.name)}/{quote(written[name].name)}" if name in written else None for name in table["file"]]
    page_html = cluster_report_html(
        summary, plotlyjs="cdn" if cdn else "inline", title=title or f"gpuviz run: {target.stem}", links=links,
        align=align,
    )  # fmt: skip
    target.write_text(page_html, encoding="utf-8")
    return RunReport(target, written)
