"""The timeline: memory over wall-clock time, transfers as spans, events as annotations.

Long series are downsampled to ``points`` time buckets keeping each bucket's minimum and
maximum (drawn as a band), so peaks and short spikes are never lost.
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpuviz.analysis.timeline import Peak, TimelineSeries, resample
from gpuviz.base.units import format_bytes

__all__ = ["timeline", "DIRECTION_COLORS", "MAX_TRANSFER_SPANS", "MAX_MARKS"]

DIRECTION_COLORS = {"H2D": "#2e86de", "D2H": "#e67e22", "D2D": "#8e44ad"}
MAX_TRANSFER_SPANS = 500
MAX_MARKS = 200
_LINES = {
    "bytes_in_use": ("bytes in use", "#3b6fb6"),
    "bytes_requested": ("bytes requested", "#6a9e3f"),
    "pool_bytes": ("pool (reserved)", "#7f8c8d"),
}


def _seconds(time_ns: np.ndarray, t0_ns: int) -> np.ndarray:
    return (np.asarray(time_ns, dtype=np.int64) - t0_ns) / 1e9


def _transfer_spans(group: pd.DataFrame, direction: str, t0: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Spans (start s, length s, hover) of one direction's transfers: one per transfer, or,
    past ``MAX_TRANSFER_SPANS``, one per time bucket covering its transfers (count, bytes,
    busy time), so none disappears and the browser draws few rectangles."""
    times = group["time_ns"].to_numpy()
    durations = group["duration_ns"].to_numpy()
    sizes = group["bytes"].to_numpy()
    if len(group) <= MAX_TRANSFER_SPANS:
        gbps = group["bandwidth"].to_numpy() / 1e9
        text = [
            f"{direction} {format_bytes(int(b))} {html.escape(str(s))}→{html.escape(str(d))}"
            f" in {int(ns) / 1e3:.1f} µs ({g:.1f} GB/s), {html.escape(str(r))}"
            for b, s, d, ns, g, r in zip(sizes.tolist(), group["source"].tolist(), group["destination"].tolist(),
                                         durations.tolist(), gbps.tolist(), group["reason"].tolist(), strict=True)
        ]  # fmt: skip
        return _seconds(times, t0), durations / 1e9, text
    order = np.argsort(times, kind="stable")
    times, durations, sizes = times[order], durations[order], sizes[order]
    edges = np.linspace(times[0], times[-1] + 1, MAX_TRANSFER_SPANS + 1)
    bucket = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, MAX_TRANSFER_SPANS - 1)
    starts = np.flatnonzero(np.concatenate(([True], bucket[1:] != bucket[:-1])))
    first = times[starts]
    last_end = np.maximum.reduceat(times + durations, starts)
    count = np.diff(np.append(starts, len(times)))
    total = np.add.reduceat(sizes, starts)
    busy = np.add.reduceat(durations, starts)
    text = [
        f"{n} {direction} transfers, {format_bytes(int(b))} in {int(ns) / 1e3:.1f} µs of copying"
        for n, b, ns in zip(count.tolist(), total.tolist(), busy.tolist(), strict=True)
    ]
    return _seconds(first, t0), (last_end - first) / 1e9, text


def timeline(
    series: TimelineSeries,
    *,
    t0_ns: int | None = None,
    points: int = 2000,
    transfers: pd.DataFrame | None = None,
    marks: pd.DataFrame | None = None,
    ooms: pd.DataFrame | None = None,
    segments: pd.DataFrame | None = None,
    peak: Peak | None = None,
) -> go.Figure:
    """A two-row figure: memory (and fragmentation on a second axis), then transfers."""
    t0 = int(series.time_ns[0]) if t0_ns is None and len(series) else (t0_ns or 0)
    has_transfers = transfers is not None and len(transfers) > 0
    figure = make_subplots(
        rows=2 if has_transfers else 1,
        cols=1,
        shared_xaxes=True,
        row_heights=[0.75, 0.25] if has_transfers else [1.0],
        vertical_spacing=0.06,
        specs=[[{"secondary_y": True}]] + ([[{}]] if has_transfers else []),
    )
    reduced = resample(series, points)
    x = _seconds(reduced.time_ns, t0)
    for metric, (label, color) in _LINES.items():
        high = reduced.maximum[metric]
        figure.add_trace(
            go.Scatter(x=x, y=high, name=label, mode="lines", line={"color": color, "shape": "hv"}),
            row=1, col=1, secondary_y=False,
        )  # fmt: skip
        if len(x) < len(series) and metric == "bytes_in_use":
            figure.add_trace(
                go.Scatter(x=x, y=reduced.minimum[metric], name=f"{label} (bucket min)", mode="lines",
                           line={"color": color, "width": 0.5, "shape": "hv"}, fill="tonexty", opacity=0.3),
                row=1, col=1, secondary_y=False,
            )  # fmt: skip
    figure.add_trace(
        go.Scatter(x=x, y=reduced.maximum["fragmentation"], name="fragmentation", mode="lines",
                   line={"color": "#c0392b", "dash": "dot", "shape": "hv"}),
        row=1, col=1, secondary_y=True,
    )  # fmt: skip
    if peak is not None and peak.index >= 0:
        figure.add_trace(
            go.Scatter(x=[(peak.time_ns - t0) / 1e9], y=[peak.bytes], name="peak", mode="markers+text",
                       marker={"symbol": "star", "size": 14, "color": "#c0392b"},
                       text=[f"peak {format_bytes(peak.bytes)}"], textposition="top center"),
            row=1, col=1, secondary_y=False,
        )  # fmt: skip
    if ooms is not None and len(ooms):
        figure.add_trace(
            go.Scatter(x=_seconds(ooms["time_ns"].to_numpy(), t0), y=ooms["pool_bytes"], name="out of memory",
                       mode="markers", marker={"symbol": "x", "size": 12, "color": "#c0392b"},
                       hovertext=[f"OOM requesting {format_bytes(int(r))}" for r in ooms["requested"]],
                       hoverinfo="text"),
            row=1, col=1, secondary_y=False,
        )  # fmt: skip
    if segments is not None and len(segments):
        grow = segments[segments["kind"] == "segment_alloc"]
        if len(grow):
            at = np.searchsorted(series.seq, grow["seq"].to_numpy())
            at = np.clip(at, 0, max(len(series) - 1, 0))
            figure.add_trace(
                go.Scatter(x=_seconds(grow["time_ns"].to_numpy(), t0), y=series.pool_bytes[at] if len(series) else [],
                           name="segment reserved", mode="markers", marker={"symbol": "triangle-up", "size": 8},
                           hovertext=[f"segment of {format_bytes(int(s))}" for s in grow["size"]], hoverinfo="text"),
                row=1, col=1, secondary_y=False,
            )  # fmt: skip
    if marks is not None and len(marks):
        shown = marks[marks["phase"] != "end"].head(MAX_MARKS)
        shapes, notes = [], []  # one layout update: add_vline per mark copies every shape each time
        for row in shown.to_dict("records"):
            x_mark = (int(row["time_ns"]) - t0) / 1e9
            shapes.append({"type": "line", "x0": x_mark, "x1": x_mark, "xref": "x", "y0": 0, "y1": 1,
                           "yref": "y domain", "line": {"color": "#95a5a6", "dash": "dash", "width": 1}})  # fmt: skip
            notes.append({"x": x_mark, "xref": "x", "y": 1, "yref": "y domain", "text": html.escape(str(row["label"])),
                          "showarrow": False, "xanchor": "left", "yanchor": "top", "font": {"size": 10}})  # fmt: skip
        figure.update_layout(shapes=shapes, annotations=notes)
    if has_transfers:
        assert transfers is not None
        for key, group in transfers.groupby("direction", sort=True):
            direction = str(key)
            start, length, text = _transfer_spans(group, direction, t0)
            figure.add_trace(
                go.Bar(orientation="h", name=f"{direction} transfers", y=[direction] * len(start), base=start, x=length,
                       marker={"color": DIRECTION_COLORS.get(direction, "#555")}, hovertext=text, hoverinfo="text"),
                row=2, col=1,
            )  # fmt: skip
        figure.update_yaxes(title_text="transfers", row=2, col=1)
    figure.update_layout(
        title={"text": html.escape(series.device) + " memory over time"},
        height=520 if has_transfers else 420,
        hovermode="closest",
        legend={"orientation": "h", "y": -0.2},
        margin={"l": 70, "r": 60, "t": 50, "b": 60},
        barmode="overlay",
    )
    figure.update_yaxes(
        title_text="bytes", row=1, col=1, secondary_y=False, rangemode="tozero", exponentformat="SI", ticksuffix="B"
    )
    figure.update_yaxes(title_text="fragmentation", row=1, col=1, secondary_y=True, range=[0, 1])
    figure.update_xaxes(title_text="time (s)", row=2 if has_transfers else 1, col=1)
    return figure
