"""Views of a distributed run: the ranks x time heatmap, the per-rank table, the run report.

All are pure functions of a ``ClusterSummary`` (``gpuviz.analysis.cluster``).
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.utils import PlotlyJSONEncoder

from gpuviz.analysis.cluster import ClusterSummary, alignment
from gpuviz.base.units import format_size
from gpuviz.views.plotlyjs import bundle_for, check_plotlyjs, plotlyjs_script, trace_types
from gpuviz.views.report import figure_json, plot_div
from gpuviz.views.result import FORMAT, FORMAT_VERSION, result_table

__all__ = ["CLUSTER_CSS", "cluster_heatmap", "cluster_grid", "cluster_table_html", "cluster_report_html"]
__all__ += ["heatmap_values"]
__all__ += ["TIME_AXIS", "cluster_text", "cluster_result"]

HEATMAP_METRICS = ("bytes_in_use", "fragmentation", "pool_bytes")


def cluster_grid(
    summary: ClusterSummary, metric: str = "bytes_in_use", *, columns: int = 200, align: str = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """``(t_ns, z)``: ``columns`` equal time buckets from 0 to the end of the latest rank
    (``t_ns`` holds bucket starts, in ns) and, per table row, the highest ``metric`` in each
    bucket. A bucket without events holds the previous bucket's value; before a row's first
    event and after its last, the value is NaN.

    ``align`` (``gpuviz.analysis.cluster.alignment``): ``"start"``, time 0 is each rank's first
    event; ``"clock"``, time 0 is the run's earliest first event and ranks sit at their
    wall-clock times; ``"auto"`` (default), ``"clock"`` when every rank has a wall-clock anchor.
    """
    if metric not in HEATMAP_METRICS:
        raise ValueError(f"metric must be one of {', '.join(HEATMAP_METRICS)}, not {metric!r}")
    if columns < 1:
        raise ValueError(f"columns must be >= 1, got {columns}")
    _, offsets = alignment(summary, align)
    spans = [int(o) + int(s.time_ns[-1]) for o, s in zip(offsets, summary.series, strict=True) if len(s.time_ns)]
    end = max(spans, default=0) + 1
    width = end / columns
    t_ns = (np.arange(columns) * width).astype(np.int64)
    z = np.full((len(summary.series), columns), np.nan)
    for row, series in enumerate(summary.series):
        if not len(series.time_ns):
            continue
        bucket = np.minimum(((series.time_ns + offsets[row]) / width).astype(np.int64), columns - 1)
        values = series.maximum[metric].astype(np.float64)
        np.fmax.at(z[row], bucket, values)
        first, last = int(bucket[0]), int(bucket[-1])
        for b in range(first + 1, last + 1):  # hold the last value through empty buckets
            if np.isnan(z[row, b]):
                z[row, b] = z[row, b - 1]
    return t_ns, z


def _label(row: dict[Any, Any]) -> str:
    mark = " ⚠" if row["outlier"] else ""
    return f"{row['device']}{mark}"


TIME_AXIS = {
    "start": "time since each rank's first event (s)",
    "clock": "time since the run's first event, ranks aligned by wall clock (s)",
}
"""The heatmap's time axis title, by alignment."""


def heatmap_values(z: np.ndarray, metric: str) -> np.ndarray:
    """What a heatmap draws of ``cluster_grid``'s values: MiB for byte metrics, fractions for
    fragmentation, as float32 (half the bytes of a report's embedded arrays: 1024 ranks x 200
    columns x 2 heatmaps is 1.6 MB instead of 3.3 MB; MiB to ~7 significant digits)."""
    values = z if metric == "fragmentation" else z / (1 << 20)
    return values.astype(np.float32)


def cluster_heatmap(
    summary: ClusterSummary, metric: str = "bytes_in_use", *, columns: int = 200, align: str = "auto"
) -> go.Figure:
    """Ranks x time heatmap of ``metric`` (bytes, or fragmentation 0..1), one row per device of
    every rank (outliers marked ⚠), time in seconds aligned as ``align`` says (``cluster_grid``;
    the x axis title names the alignment used)."""
    mode, _ = alignment(summary, align)
    t_ns, z = cluster_grid(summary, metric, columns=columns, align=mode)
    labels = [_label(row) for row in summary.table.to_dict("records")]
    name = metric.replace("_", " ")
    value = "=%{z:.1%}" if metric == "fragmentation" else "=%{z:.1f} MiB"
    figure = go.Figure(
        go.Heatmap(
            x=t_ns / 1e9,
            y=labels,
            z=heatmap_values(z, metric),
            colorscale="Viridis",
            colorbar={"title": name if metric == "fragmentation" else f"{name} (MiB)"},
            hovertemplate="%{y}<br>t=%{x:.3f} s<br>" + name + value + "<extra></extra>",
        )
    )
    figure.update_layout(
        title=f"{metric.replace('_', ' ')} by rank over time",
        xaxis_title=TIME_AXIS[mode],
        yaxis={"autorange": "reversed", "type": "category"},
        height=max(300, 24 * min(len(labels), 64) + 150),  # past 64 rows, thinner rows: 1024 x 24 px drew ~2x slower
    )
    return figure


_SIZES = ("peak_bytes", "pool_at_peak", "end_bytes", "growth_bytes", "transfer_bytes")


def _cell(column: str, value: object) -> str:
    if column in _SIZES:
        return format_size(int(value))  # type: ignore[call-overload]
    if column == "peak_time_ns":
        return f"{int(value) / 1e9:.3f} s"  # type: ignore[call-overload]
    if column == "fragmentation_at_peak":
        return f"{float(value):.1%}"  # type: ignore[arg-type]
    return html.escape(str(value))


def cluster_table_html(summary: ClusterSummary, *, links: Sequence[str | None] | None = None) -> str:
    """The per-rank table as an HTML table; outlier rows have class ``outlier``; row ``i`` of
    ``summary.table`` carries ``data-row="i"`` (whatever order the rows are shown in).

    ``links``: per table row, the address of that rank's report (or None): such a row
    carries ``data-href`` and its device cell links there.
    """
    if links is not None and len(links) != len(summary.table):
        raise ValueError(f"links must give one address (or None) per table row: {len(links)} for {len(summary.table)}")
    columns = [c for c in summary.table.columns if c != "file"]
    head = "".join(f"<th>{html.escape(c.replace('_', ' '))}</th>" for c in columns)
    rows = []
    for i, row in enumerate(summary.table.to_dict("records")):
        href = links[i] if links is not None else None
        attributes = f' data-row="{i}"' + (' class="outlier"' if row["outlier"] else "")
        cells = []
        for c in columns:
            text = _cell(c, row[c])
            if c == "device" and href:
                text = f'<a href="{html.escape(href)}">{text}</a>'
            cells.append(f"<td>{text}</td>")
        if href:
            attributes += f' data-href="{html.escape(href)}"'
        rows.append(f"<tr{attributes}>" + "".join(cells) + "</tr>")
    return f'<table class="gpuviz-cluster"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def cluster_text(summary: ClusterSummary) -> str:
    """The per-rank table as plain text (what ``gpuviz summary RUN_DIR`` prints)."""
    table = summary.table
    lines = [f"run: {table['rank'].nunique()} ranks on {table['host'].nunique()} hosts, {len(table)} devices"]
    for row in table.to_dict("records"):
        lines.append(
            f"  {row['device']}: peak {format_size(row['peak_bytes'])} at {row['peak_time_ns'] / 1e9:.3f} s, "
            f"pool {format_size(row['pool_at_peak'])}, fragmentation {row['fragmentation_at_peak']:.1%}, "
            f"growth {format_size(row['growth_bytes'])}, {row['ooms']} OOMs, {row['transfers']} transfers"
            + (f"  OUTLIER ({row['outlier']})" if row["outlier"] else "")
        )
    flagged = summary.outliers
    lines.append(
        f"outliers (peak or growth off the median by > {summary.threshold:.0%} of the median peak): "
        + (", ".join(flagged["device"]) if len(flagged) else "none")
    )
    return "\n".join(lines)


CLUSTER_CSS = """
table.gpuviz-cluster { border-collapse: collapse; }
table.gpuviz-cluster td, table.gpuviz-cluster th { border: 1px solid #ddd; padding: 2px 8px; text-align: right; }
table.gpuviz-cluster tr.outlier { background: #fde2e1; }
table.gpuviz-cluster tr[data-href], table.gpuviz-cluster tr[data-row] { cursor: pointer; }
"""
"""The per-rank table's style (outlier rows highlighted; rows that open a rank's views show a hand)."""

_CSS = "body { font: 14px/1.5 system-ui, sans-serif; margin: 24px; color: #222; }" + CLUSTER_CSS


_LINKS = """
function gpuvizRankLinks() {
  // a click on a heatmap row or a table row opens that rank's report (rows with data-href)
  var links = {};
  document.querySelectorAll('table.gpuviz-cluster tr[data-href]').forEach(function (tr) {
    links[tr.dataset.row] = tr.dataset.href;
    tr.addEventListener('click', function (e) {
      if (!e.target.closest('a')) { window.location.href = tr.dataset.href; }
    });
  });
  document.querySelectorAll('.gpuviz-plot[id^="cluster-"]').forEach(function (div) {
    function follow() {
      div.on('plotly_click', function (e) {
        var href = links[e.points[0].pointNumber[0]];
        if (href) { window.location.href = href; }
      });
    }
    if (div.on) { follow(); } else { div.addEventListener('gpuviz-drawn', follow); }  // a lazy one: once drawn
  });
}
gpuvizRankLinks();
"""


def cluster_report_html(
    summary: ClusterSummary,
    *,
    plotlyjs: str = "inline",
    title: str = "gpuviz run",
    links: Sequence[str | None] | None = None,
    align: str = "auto",
) -> str:
    """The run's report as one HTML document: heatmaps of bytes in use and fragmentation (ranks
    aligned as ``align`` says, see ``cluster_grid``), the table.

    ``links``: per table row, the address of that rank's own report, or None: a click on such
    a row of a heatmap or of the table opens it (see ``cluster_table_html``).
    """
    check_plotlyjs(plotlyjs)
    heatmaps = [cluster_heatmap(summary, metric, align=align) for metric in ("bytes_in_use", "fragmentation")]
    script = plotlyjs_script(plotlyjs, bundle_for(trace_types(heatmaps)))
    # the fragmentation heatmap is below the first (1,686 px tall for 64+ rows): drawn when scrolled to
    plots = [plot_div(f"cluster-{i}", heatmap, lazy=i > 0) for i, heatmap in enumerate(heatmaps)]
    text = html.escape(cluster_text(summary).splitlines()[0])
    linked = [link for link in links or [] if link]
    if linked:
        reports = len(set(linked))
        text += (
            f" · {reports} rank report{'s' if reports != 1 else ''}: click a rank's row in a heatmap or in the"
            " table to open its views"
        )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style>{script}</head><body><h1>{html.escape(title)}</h1><p>{text}</p>"
        f"{''.join(plots)}<h2>Per-rank table</h2>{cluster_table_html(summary, links=links)}"
        + (f"<script>{_LINKS}</script>" if linked else "")
        + "</body></html>"
    )


_KINDS = {
    "rank": "count", "host": "text", "local_rank": "count", "device": "text", "peak_bytes": "bytes",
    "peak_time_ns": "ns", "pool_at_peak": "bytes", "fragmentation_at_peak": "share", "end_bytes": "bytes",
    "growth_bytes": "bytes", "ooms": "count", "transfers": "count", "transfer_bytes": "bytes", "file": "text",
    "outlier": "text",
}  # fmt: skip


def cluster_result(
    summary: ClusterSummary,
    *,
    title: str = "gpuviz run",
    links: Sequence[str | None] | None = None,
    align: str = "auto",
) -> dict[str, Any]:
    """The run in the ``gpuviz-result`` layout (``gpuviz.views.result``), what JupyterLab renders:
    the summary lines of ``cluster_text``, the bytes-in-use and fragmentation heatmaps and the
    per-rank table ``ranks`` with its outlier rows highlighted (``align``: see ``cluster_grid``).

    Two optional fields let the extension open a rank: the table's ``links`` (per row, the
    path of that rank's file relative to the Jupyter server's root, or None) and each
    heatmap's ``rows`` (``"ranks"``: heatmap row i is row i of that table).
    """
    if links is not None and len(links) != len(summary.table):
        raise ValueError(f"links must give one path (or None) per table row: {len(links)} for {len(summary.table)}")
    flagged = [i for i, flag in enumerate(summary.table["outlier"]) if flag]
    table = result_table("ranks", "Per-rank table (outliers highlighted)", summary.table, kinds=_KINDS, total=False,
                         highlight=flagged)  # fmt: skip
    if links is not None:
        table["links"] = list(links)
    figures = [
        {"name": f"heatmap:{metric}", "title": metric.replace("_", " ") + " by rank over time",
         "figure": figure_json(cluster_heatmap(summary, metric, align=align)), "rows": "ranks"}
        for metric in ("bytes_in_use", "fragmentation")
    ]  # fmt: skip
    data = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "title": title,
        "summary": cluster_text(summary).splitlines(),
        "figures": figures,
        "tables": [table],
    }
    parsed: dict[str, Any] = json.loads(json.dumps(data, cls=PlotlyJSONEncoder))
    return parsed
