"""Views of a distributed run: the ranks x time heatmap, the per-rank table, the run report.

All are pure functions of a ``ClusterSummary`` (``gpuviz.analysis.cluster``).
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import plotly.graph_objects as go

from gpuviz.analysis.cluster import ClusterSummary
from gpuviz.base.units import format_size
from gpuviz.views.report import plot_div, plotlyjs_script

__all__ = ["cluster_heatmap", "cluster_grid", "cluster_table_html", "cluster_report_html", "cluster_text"]

HEATMAP_METRICS = ("bytes_in_use", "fragmentation", "pool_bytes")


def cluster_grid(
    summary: ClusterSummary, metric: str = "bytes_in_use", *, columns: int = 200
) -> tuple[np.ndarray, np.ndarray]:
    """``(t_ns, z)``: ``columns`` equal time buckets from 0 to the longest rank's span (ns since
    each log's first event; ``t_ns`` holds bucket starts) and, per table row, the highest
    ``metric`` in each bucket. A bucket without events holds the previous bucket's value;
    before a row's first event and after its last, the value is NaN."""
    if metric not in HEATMAP_METRICS:
        raise ValueError(f"metric must be one of {', '.join(HEATMAP_METRICS)}, not {metric!r}")
    if columns < 1:
        raise ValueError(f"columns must be >= 1, got {columns}")
    spans = [int(s.time_ns[-1]) for s in summary.series if len(s.time_ns)]
    end = max(spans, default=0) + 1
    width = end / columns
    t_ns = (np.arange(columns) * width).astype(np.int64)
    z = np.full((len(summary.series), columns), np.nan)
    for row, series in enumerate(summary.series):
        if not len(series.time_ns):
            continue
        bucket = np.minimum((series.time_ns / width).astype(np.int64), columns - 1)
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


def cluster_heatmap(summary: ClusterSummary, metric: str = "bytes_in_use", *, columns: int = 200) -> go.Figure:
    """Ranks x time heatmap of ``metric`` (bytes, or fragmentation 0..1), one row per device of
    every rank (outliers marked ⚠), time in seconds since each log's first event."""
    t_ns, z = cluster_grid(summary, metric, columns=columns)
    labels = [_label(row) for row in summary.table.to_dict("records")]
    unit = "" if metric == "fragmentation" else " bytes"
    figure = go.Figure(
        go.Heatmap(
            x=t_ns / 1e9,
            y=labels,
            z=z,
            colorscale="Viridis",
            colorbar={"title": metric.replace("_", " ")},
            hovertemplate="%{y}<br>t=%{x:.3f} s<br>" + metric.replace("_", " ") + "=%{z}" + unit + "<extra></extra>",
        )
    )
    figure.update_layout(
        title=f"{metric.replace('_', ' ')} by rank over time",
        xaxis_title="time since the rank's first event (s)",
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


def cluster_table_html(summary: ClusterSummary) -> str:
    """The per-rank table as an HTML table; outlier rows have class ``outlier``."""
    columns = [c for c in summary.table.columns if c != "file"]
    head = "".join(f"<th>{html.escape(c.replace('_', ' '))}</th>" for c in columns)
    rows = []
    for row in summary.table.to_dict("records"):
        cls = ' class="outlier"' if row["outlier"] else ""
        rows.append(f"<tr{cls}>" + "".join(f"<td>{_cell(c, row[c])}</td>" for c in columns) + "</tr>")
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


_CSS = """
body { font: 14px/1.5 system-ui, sans-serif; margin: 24px; color: #222; }
table.gpuviz-cluster { border-collapse: collapse; }
table.gpuviz-cluster td, table.gpuviz-cluster th { border: 1px solid #ddd; padding: 2px 8px; text-align: right; }
table.gpuviz-cluster tr.outlier { background: #fde2e1; }
"""


def cluster_report_html(summary: ClusterSummary, *, plotlyjs: str = "inline", title: str = "gpuviz run") -> str:
    """The run's report as one HTML document: heatmaps of bytes in use and fragmentation, the table."""
    script = plotlyjs_script(plotlyjs)
    plots = []
    for i, metric in enumerate(("bytes_in_use", "fragmentation")):
        plots.append(plot_div(f"cluster-{i}", cluster_heatmap(summary, metric)))
    text = html.escape(cluster_text(summary).splitlines()[0])
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style>{script}</head><body><h1>{html.escape(title)}</h1><p>{text}</p>"
        f"{''.join(plots)}<h2>Per-rank table</h2>{cluster_table_html(summary)}</body></html>"
    )
