"""Drawing a what-if comparison: policies side by side.

comparison_bars(c)       peak reserved / in use / requested per policy, OOMs marked
comparison_timeline(c)   bytes reserved over time per policy on one time axis, fragmentation
                         on a second axis, each policy's OOM marked
worst_maps(c)            each policy's fragmentation map at its own worst moment
comparison_result(c)     all of it in the ``gpuviz-result`` layout (JupyterLab, notebooks)
comparison_html(c)       a self-contained HTML report
comparison_static_html   a script-free fallback (table + sparklines)
"""

from __future__ import annotations

import html
import json
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from plotly.utils import PlotlyJSONEncoder

from gpuviz.analysis.comparison import RECORDED, Comparison, PolicyOutcome, set_renderer
from gpuviz.analysis.replay import replay
from gpuviz.analysis.timeline import resample
from gpuviz.base.units import binary_unit, format_bytes
from gpuviz.views.fragmentation import fragmentation_map
from gpuviz.views.plotlyjs import bundle_for, check_plotlyjs, plotlyjs_script, trace_types
from gpuviz.views.report import FRAME_RECTANGLES, figure_json
from gpuviz.views.result import FORMAT, FORMAT_VERSION, MIME_TYPE
from gpuviz.views.static import sparkline_svg
from gpuviz.views.tables import TABLE_CSS

__all__ = [
    "comparison_bars",
    "comparison_timeline",
    "worst_maps",
    "comparison_result",
    "comparison_html",
    "comparison_static_html",
]

_COLORS = ("#444444", "#3b6fb6", "#e67e22", "#27ae60", "#8e44ad", "#c0392b", "#16a085", "#7f8c8d")


def _color(i: int) -> str:
    return _COLORS[i % len(_COLORS)]


def comparison_bars(c: Comparison) -> go.Figure:
    """Grouped bars per policy: peak reserved, peak in use, peak requested (bytes); policies that ran
    out of memory are labelled so."""
    names = [o.name + (" (OOM)" if o.oom is not None else "") for o in c.outcomes]
    factor, unit = binary_unit(max([o.peak_reserved for o in c.outcomes] + [c.capacity or 0, 1]))
    figure = go.Figure()
    for metric, label, color in (
        ("peak_reserved", "peak reserved", "#3b6fb6"),
        ("peak_in_use", "peak in use", "#e67e22"),
        ("peak_requested", "peak requested", "#27ae60"),
    ):
        values = [getattr(o, metric) for o in c.outcomes]
        figure.add_trace(
            go.Bar(
                x=names, y=[v / factor for v in values], name=label, marker_color=color,
                text=[format_bytes(v) for v in values], textposition="outside",
                hovertemplate="%{x}<br>" + label + ": %{text}<extra></extra>",
            )
        )  # fmt: skip
    if c.capacity is not None:
        figure.add_hline(y=c.capacity / factor, line_dash="dash", line_color="#c0392b", annotation_text="capacity")
    figure.update_layout(
        barmode="group", title=f"{c.device}: peak memory per policy", yaxis={"title": f"memory ({unit})"},
        legend={"orientation": "h", "y": -0.2}, margin={"t": 60, "b": 80},
    )  # fmt: skip
    return figure


def _seconds(time_ns: np.ndarray, t0: int) -> np.ndarray:
    return (time_ns - t0) / 1e9


def comparison_timeline(c: Comparison, *, points: int = 1500) -> go.Figure:
    """Bytes reserved by each policy over the source's time, fragmentation (0 to 1) on the right axis,
    and an x where a policy ran out of memory."""
    figure = make_subplots(specs=[[{"secondary_y": True}]])
    factor, unit = binary_unit(max([o.peak_reserved for o in c.outcomes] + [c.capacity or 0, 1]))
    starts = [int(o.series.time_ns[0]) for o in c.outcomes if len(o.series)]
    t0 = min(starts) if starts else 0
    for i, o in enumerate(c.outcomes):
        if not len(o.series):
            continue
        reduced = resample(o.series, points)
        x = _seconds(reduced.time_ns, t0)
        figure.add_trace(
            go.Scatter(x=x, y=reduced.maximum["pool_bytes"] / factor, name=f"{o.name}: reserved", mode="lines",
                       line={"color": _color(i), "shape": "hv"}, legendgroup=o.name),
            secondary_y=False,
        )  # fmt: skip
        figure.add_trace(
            go.Scatter(x=x, y=reduced.maximum["fragmentation"], name=f"{o.name}: fragmentation", mode="lines",
                       line={"color": _color(i), "dash": "dot", "width": 1, "shape": "hv"}, legendgroup=o.name,
                       visible="legendonly"),
            secondary_y=True,
        )  # fmt: skip
        if o.oom is not None:
            figure.add_trace(
                go.Scatter(x=[(o.oom.time_ns - t0) / 1e9], y=[int(o.series.pool_bytes[-1]) / factor], mode="markers",
                           marker={"symbol": "x", "size": 12, "color": _color(i)}, name=f"{o.name}: out of memory",
                           legendgroup=o.name, hovertext=[o.oom.cause()], hoverinfo="text"),
                secondary_y=False,
            )  # fmt: skip
    if c.capacity is not None:
        figure.add_hline(y=c.capacity / factor, line_dash="dash", line_color="#c0392b", annotation_text="capacity")
    figure.update_layout(title=f"{c.device}: memory reserved over time", legend={"orientation": "h", "y": -0.25},
                         margin={"t": 60, "b": 90})  # fmt: skip
    figure.update_xaxes(title_text="time (s)")
    figure.update_yaxes(title_text=f"reserved ({unit})", secondary_y=False)
    figure.update_yaxes(title_text="fragmentation", secondary_y=True, range=[0, 1], tickformat=".0%")
    return figure


def worst_moment(o: PolicyOutcome) -> str:
    """Where a policy's map is shown, in words."""
    return (
        f"{o.name}: at its out-of-memory error"
        if o.oom is not None
        else f"{o.name}: where the most reserved memory sat unused"
    )


def worst_maps(c: Comparison, *, lean: bool = False) -> list[tuple[PolicyOutcome, go.Figure]]:
    """Each policy's fragmentation map at its worst moment (its OOM, else the most reserved bytes unused)."""
    maps = []
    for o in c.outcomes:
        if o.worst_index < 0:
            continue
        state = replay(o.log).state_at(o.worst_index, device=o.device)
        figure = fragmentation_map(
            state, title=worst_moment(o), max_rectangles=FRAME_RECTANGLES if lean else 20_000, lean=lean,
            stacks=o.log.stacks,
        )  # fmt: skip
        maps.append((o, figure))
    return maps


def _table_rows(c: Comparison) -> tuple[list[str], list[list[Any]]]:
    columns = ["policy", "fits", "peak reserved", "peak in use", "peak requested", "unused at peak", "served", "OOM"]
    rows = [
        [r["policy"], "(as run)" if r["policy"] == RECORDED else "yes" if r["fits"] else "no",
         format_bytes(r["peak_reserved"]), format_bytes(r["peak_in_use"]),
         format_bytes(r["peak_requested"]), format_bytes(r["waste_at_peak"]), f"{r['served']} / {r['requests']}",
         r["oom"] or ""]
        for r in c.table()
    ]  # fmt: skip
    failed = [r["source_ooms_served"] for r in c.table()]
    if any(failed):  # the run failed requests: does each policy serve them?
        columns.append("run's failed requests served")
        for row, served in zip(rows, failed, strict=True):
            row.append(f"{sum(served)} / {len(served)}")
    return columns, rows


def _summary_lines(c: Comparison) -> list[str]:
    where = f" on {format_bytes(c.capacity)}" if c.capacity is not None else " (capacity unbounded)"
    return [f"what if: {c.device}{where}", *c.headline().rstrip(".").split("; "), *c.notes]


def comparison_result(c: Comparison, *, title: str = "gpuviz what-if") -> dict[str, Any]:
    """The comparison in the ``gpuviz-result`` layout: summary lines, figures, one table."""
    figures = [
        {"name": "whatif:bars", "title": "Peak memory per policy", "figure": figure_json(comparison_bars(c))},
        {"name": "whatif:timeline", "title": "Bytes reserved over time", "figure": figure_json(comparison_timeline(c))},
    ]
    for o, figure in worst_maps(c, lean=True):
        figures.append({"name": f"whatif:map:{o.name}", "title": worst_moment(o), "figure": figure_json(figure)})
    columns, rows = _table_rows(c)
    data = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "title": title,
        "summary": _summary_lines(c),
        "figures": figures,
        "tables": [{"name": "whatif", "title": "Policies", "columns": columns, "rows": rows}],
    }
    parsed: dict[str, Any] = json.loads(json.dumps(data, cls=PlotlyJSONEncoder))
    return parsed


def _table_html(c: Comparison) -> str:
    columns, rows = _table_rows(c)
    head = "".join(f"<th>{html.escape(col)}</th>" for col in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f'<table class="gpuviz-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def comparison_static_html(c: Comparison) -> str:
    """Headline, table and a sparkline of reserved bytes per policy: no scripts."""
    parts = [f"<style>{TABLE_CSS}</style>", '<div class="gpuviz">', "<h3>What if</h3>"]
    parts += [f"<div>{html.escape(line)}</div>" for line in _summary_lines(c)]
    parts.append(_table_html(c))
    for o in c.outcomes:
        if len(o.series):
            reduced = resample(o.series, 360)
            parts.append(f"<div><b>{html.escape(o.name)}</b> bytes reserved<br>"
                         f"{sparkline_svg(reduced.maximum['pool_bytes'])}</div>")  # fmt: skip
    parts.append("</div>")
    return "\n".join(parts)


def comparison_html(c: Comparison, *, title: str = "gpuviz what-if", plotlyjs: str = "inline") -> str:
    """A self-contained HTML report of the comparison (``plotlyjs="cdn"`` to leave plotly.js out)."""
    check_plotlyjs(plotlyjs)
    body = [f"<h1>{html.escape(title)}</h1>"]
    body += [f"<p>{html.escape(line)}</p>" for line in _summary_lines(c)]
    body.append(_table_html(c))
    figures = [("Peak memory per policy", comparison_bars(c)), ("Bytes reserved over time", comparison_timeline(c))]
    figures += [(worst_moment(o), figure) for o, figure in worst_maps(c)]
    script = plotlyjs_script(plotlyjs, bundle_for(trace_types(figure for _, figure in figures)))
    for heading, figure in figures:
        body.append(f"<h2>{html.escape(heading)}</h2>")
        body.append(figure.to_html(full_html=False, include_plotlyjs=False))
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>body{{font-family:sans-serif;margin:1.5em}}{TABLE_CSS}</style>{script}</head><body>"
        + "\n".join(body)
        + "</body></html>"
    )


def _bundle(c: Comparison) -> dict[str, Any]:
    return {MIME_TYPE: comparison_result(c), "text/html": comparison_static_html(c), "text/plain": repr(c)}


set_renderer(_bundle)
