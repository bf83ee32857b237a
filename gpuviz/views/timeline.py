"""The timeline: memory over wall-clock time, transfers as spans, events as annotations.

The memory lines are sampled after each public operation (``timeline.settled``: no spike
between a ``split`` and its ``alloc``), in the binary unit that suits their largest value
(KiB, MiB, GiB), with formatted hovers. The y range follows bytes in use and requested: when
the pool is more than ``POOL_HIDDEN`` times larger (a preallocated GPU), its line starts
hidden (a click on its legend entry shows it). Fragmentation is a percentage on the right axis.
Long series are downsampled to ``points`` time buckets keeping each bucket's minimum and
maximum (drawn as a band), so peaks and short spikes are never lost. Marks are vertical lines
with a hover marker each; a label is written only where it does not crowd the previous one.
Transfers are spans at least ``MIN_SPAN`` of the time axis wide, bucketed when dense.

The x axis opens at the activity (``activity_range``: where most events are, and the peak)
when that is less than half the run, with buttons for it and the whole run. Times an importer
inferred (the source recorded none: ``times_inferred``) are never drawn as seconds: the x axis
is then the event's position in the log, and the title says the times were inferred.
"""

from __future__ import annotations

import dataclasses
import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpuviz.analysis.timeline import Peak, TimelineSeries, resample
from gpuviz.base.units import binary_unit, format_duration, format_size

__all__ = [
    "timeline",
    "activity_range",
    "ACTIVITY_SHARE",
    "DIRECTION_COLORS",
    "MAX_TRANSFER_SPANS",
    "MAX_MARKS",
    "MAX_SEGMENT_MARKERS",
    "POOL_HIDDEN",
    "MIN_SPAN",
    "LABEL_GAP",
]

DIRECTION_COLORS = {"H2D": "#2e86de", "D2H": "#e67e22", "D2D": "#8e44ad"}
MAX_TRANSFER_SPANS = 500
MAX_MARKS = 200
POOL_HIDDEN = 2.0
"""The pool line starts hidden when the pool's maximum is more than this times the data's."""
MAX_SEGMENT_MARKERS = 400
"""The most "segment reserved" markers a timeline draws one by one; beyond, they are grouped
into that many equal spans of the x axis, one marker per span naming its count and bytes."""
MIN_SPAN = 0.002
"""Transfer spans are drawn at least this share of the time axis wide."""
ACTIVITY_SHARE = 0.95
"""The x axis opens at the span holding this share of the events (the last ones, and the peak)."""
LABEL_GAP = 0.06
"""A mark's label is written only this share of the time axis after the previous label."""
_LINES = {  # drawn in this order: requested (dashed) over in use, both over the pool
    "pool_bytes": ("pool (reserved)", "#7f8c8d", None, 1.0),
    "bytes_in_use": ("bytes in use", "#3b6fb6", None, 2.5),
    "bytes_requested": ("bytes requested", "#27ae60", "dash", 1.5),
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
            f"{direction} {format_size(int(b))} {html.escape(str(s))}→{html.escape(str(d))}"
            f" in {format_duration(int(ns))} ({g:.1f} GB/s), {html.escape(str(r))}"
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
        f"{n} {direction} transfers, {format_size(int(b))} in {format_duration(int(ns))} of copying"
        for n, b, ns in zip(count.tolist(), total.tolist(), busy.tolist(), strict=True)
    ]
    return _seconds(first, t0), (last_end - first) / 1e9, text


def _hover(values: np.ndarray, label: str, where: str = "t = %{x:.6f} s") -> tuple[list[str], str]:
    return [format_size(int(v)) for v in values], f"{label} %{{text}}<br>{where}<extra></extra>"


def activity_range(x: np.ndarray, peak_x: float | None = None) -> tuple[float, float] | None:
    """The x range a timeline opens at, or None for the whole run: the span from the event
    ``1 - ACTIVITY_SHARE`` of the way into ``x`` (sorted event x values) to the last event, widened
    to the peak and padded by 5 %, when it is less than half of the whole span."""
    if len(x) < 2:
        return None
    first, last = float(x[0]), float(x[-1])
    lo = float(x[int(np.floor((1 - ACTIVITY_SHARE) * (len(x) - 1)))])
    if peak_x is not None:
        lo = min(lo, peak_x)
    if last - first <= 0 or (last - lo) >= 0.5 * (last - first):
        return None
    pad = 0.05 * max(last - lo, 1e-9)
    return max(first, lo - pad), last + pad


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
    times_inferred: bool = False,
) -> go.Figure:
    """A two-row figure: memory (and fragmentation on a second axis), then transfers.

    ``times_inferred``: the log's times were inferred by its importer (``meta["columns"]``):
    x is then each event's position in the log, never seconds."""
    if times_inferred:  # x: the event's log position (ooms, segments, marks: their seq)
        series = dataclasses.replace(series, time_ns=np.asarray(series.index, dtype=np.int64))
        t0_ns, scale, where = 0, 1.0, "event %{x:.0f}"
    else:
        scale, where = 1e9, "t = %{x:.6f} s"

    def at(frame: pd.DataFrame) -> np.ndarray:
        column = "seq" if times_inferred else "time_ns"
        return (frame[column].to_numpy().astype(np.int64) - t0) / scale

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
    settled_events = int(np.count_nonzero(series.settled))
    reduced = resample(series, points, settled_only=True)  # settled(series), without building it
    highest = reduced.maximum
    data_max = int(max(highest["bytes_in_use"].max(initial=0), highest["bytes_requested"].max(initial=0)))
    pool_max = int(highest["pool_bytes"].max(initial=0))
    factor, unit = binary_unit(max(data_max, 1))
    x = (reduced.time_ns - t0) / scale
    span = float((series.time_ns[-1] - t0) / scale) if len(series) else 0.0
    for metric, (label, color, dash, width) in _LINES.items():
        high = reduced.maximum[metric]
        text, template = _hover(high, label, where)
        hidden = metric == "pool_bytes" and pool_max > POOL_HIDDEN * max(data_max, 1)
        figure.add_trace(
            go.Scatter(x=x, y=high / factor, name=label, mode="lines", text=text, hovertemplate=template,
                       line={"color": color, "shape": "hv", "dash": dash, "width": width},
                       visible="legendonly" if hidden else True),
            row=1, col=1, secondary_y=False,
        )  # fmt: skip
        if len(x) < settled_events and metric == "bytes_in_use":
            low = reduced.minimum[metric]
            text, template = _hover(low, f"{label} (bucket min)", where)
            figure.add_trace(
                go.Scatter(x=x, y=low / factor, name=f"{label} (bucket min)", mode="lines", text=text,
                           hovertemplate=template, line={"color": color, "width": 0.5, "shape": "hv"},
                           fill="tonexty", opacity=0.3),
                row=1, col=1, secondary_y=False,
            )  # fmt: skip
    figure.add_trace(
        go.Scatter(x=x, y=reduced.maximum["fragmentation"] * 100, name="fragmentation", mode="lines",
                   hovertemplate="fragmentation %{y:.1f}%<br>" + where + "<extra></extra>",
                   line={"color": "#c0392b", "dash": "dot", "shape": "hv"}),
        row=1, col=1, secondary_y=True,
    )  # fmt: skip
    peak_x = None
    if peak is not None and peak.index >= 0:
        peak_x = float(peak.index) if times_inferred else (peak.time_ns - t0) / 1e9
        figure.add_trace(
            go.Scatter(x=[peak_x], y=[peak.bytes / factor], name="peak", mode="markers+text",
                       marker={"symbol": "star", "size": 14, "color": "#c0392b"},
                       text=[f"peak {format_size(peak.bytes)}"], textposition="top center",
                       hovertemplate=f"peak {format_size(peak.bytes)} at event {peak.index}<extra></extra>"),
            row=1, col=1, secondary_y=False,
        )  # fmt: skip

    def level(seq: np.ndarray) -> np.ndarray:
        """Bytes in use right at the events with sequence numbers ``seq`` (on the memory line)."""
        if not len(series):
            return np.zeros(len(seq))
        at = np.clip(np.searchsorted(series.seq, seq), 0, len(series) - 1)
        return series.bytes_in_use[at] / factor

    if ooms is not None and len(ooms):
        figure.add_trace(
            go.Scatter(x=at(ooms), y=level(ooms["seq"].to_numpy()),
                       name="out of memory", mode="markers", marker={"symbol": "x", "size": 13, "color": "#c0392b"},
                       hovertext=[f"out of memory requesting {format_size(int(r))} at event {s}"
                                  for r, s in zip(ooms["requested"], ooms["seq"], strict=True)],
                       hoverinfo="text"),
            row=1, col=1, secondary_y=False,
        )  # fmt: skip
    if segments is not None and len(segments):
        grow = segments[segments["kind"].isin(["segment_alloc", "segment_map"])]
        if len(grow):
            words = {"segment_alloc": "segment of {} reserved", "segment_map": "{} mapped into a growing segment"}
            grow_x, grow_seq = at(grow), grow["seq"].to_numpy()
            if len(grow) <= MAX_SEGMENT_MARKERS:
                hover = [words[k].format(format_size(int(s))) for k, s in zip(grow["kind"], grow["size"], strict=True)]
            else:  # one marker per span of the x axis (the first event in it), its count and bytes
                grow_x, grow_seq, hover = _grouped_markers(grow_x, grow_seq, grow["size"].to_numpy())
            figure.add_trace(
                go.Scatter(x=grow_x, y=level(grow_seq),
                           name="segment reserved", mode="markers", marker={"symbol": "triangle-up", "size": 8},
                           hovertext=hover, hoverinfo="text"),
                row=1, col=1, secondary_y=False,
            )  # fmt: skip
    if marks is not None and len(marks):
        shown = marks[marks["phase"] != "end"]
        shapes, notes = [], []  # one layout update: add_vline per mark copies every shape each time
        xs = at(shown).tolist()
        labels = [html.escape(str(v)) for v in shown["label"]]
        last_label = -np.inf
        for x_mark, label in zip(xs[:MAX_MARKS], labels[:MAX_MARKS], strict=True):
            shapes.append({"type": "line", "x0": x_mark, "x1": x_mark, "xref": "x", "y0": 0, "y1": 1,
                           "yref": "y domain", "line": {"color": "#95a5a6", "dash": "dash", "width": 1}})  # fmt: skip
            if x_mark - last_label >= LABEL_GAP * max(span, 1e-12):
                last_label = x_mark
                notes.append({"x": x_mark, "xref": "x", "y": 1, "yref": "y domain", "text": label, "showarrow": False,
                              "xanchor": "left", "yanchor": "top", "font": {"size": 10}})  # fmt: skip
        figure.add_trace(
            go.Scatter(x=xs, y=[100.0] * len(xs), name="marks", mode="markers", hovertext=labels, hoverinfo="text",
                       marker={"symbol": "triangle-down", "size": 8, "color": "#7f8c8d"}),
            row=1, col=1, secondary_y=True,
        )  # fmt: skip
        figure.update_layout(shapes=shapes, annotations=notes)
    if has_transfers:
        assert transfers is not None
        for key, group in transfers.groupby("direction", sort=True):
            direction = str(key)
            start, length, text = _transfer_spans(group, direction, t0)
            if times_inferred:  # no durations either: spans at the copies' log positions
                start, length = at(group.sort_values("time_ns")), np.zeros(len(start))
            length = np.maximum(length, MIN_SPAN * span)
            figure.add_trace(
                go.Bar(orientation="h", name=f"{direction} transfers", y=[direction] * len(start), base=start, x=length,
                       marker={"color": DIRECTION_COLORS.get(direction, "#555")}, hovertext=text, hoverinfo="text"),
                row=2, col=1,
            )  # fmt: skip
        figure.update_yaxes(title_text="transfers", row=2, col=1)
    title = html.escape(series.device) + " memory over time"
    if times_inferred:
        title = html.escape(series.device) + " memory event by event<br><sub>the source recorded no times (gpuviz "
        title += "inferred them): x is each event's position in the log, not seconds</sub>"
    figure.update_layout(
        title={"text": title},
        height=520 if has_transfers else 420,
        hovermode="closest",
        legend={"orientation": "h", "y": -0.2},
        margin={"l": 70, "r": 60, "t": 80 if times_inferred else 50, "b": 60},
        barmode="overlay",
    )
    figure.update_yaxes(title_text=f"memory ({unit})", row=1, col=1, secondary_y=False, rangemode="tozero")
    figure.update_yaxes(title_text="fragmentation", row=1, col=1, secondary_y=True, range=[0, 102], dtick=20,
                        ticksuffix="%", showgrid=False)  # fmt: skip
    figure.update_xaxes(title_text="event (log position)" if times_inferred else "time (s)",
                        row=2 if has_transfers else 1, col=1)  # fmt: skip
    settled_x = (series.time_ns[series.settled] - t0) / scale
    zoom = activity_range(settled_x, peak_x)
    if zoom is not None:
        whole = [float(settled_x[0]), float(settled_x[-1])]
        figure.update_xaxes(range=list(zoom))
        figure.update_layout(updatemenus=[{
            "type": "buttons", "direction": "right", "x": 1, "xanchor": "right", "y": 1.0, "yanchor": "bottom",
            "showactive": True, "active": 0,
            "buttons": [
                {"label": "activity", "method": "relayout", "args": [{"xaxis.range": list(zoom)}]},
                {"label": "whole run", "method": "relayout", "args": [{"xaxis.range": whole}]},
            ],
        }])  # fmt: skip
    return figure


def _grouped_markers(x: np.ndarray, seq: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Segment markers (x ascending) grouped into ``MAX_SEGMENT_MARKERS`` equal spans of x: the
    first marker of each non-empty span, and its hover (how many segments, their bytes)."""
    order = np.argsort(x, kind="stable")
    x, seq, size = x[order], seq[order], size[order]
    lo, hi = float(x[0]), float(x[-1])
    spans = np.minimum(((x - lo) / max(hi - lo, 1e-300) * MAX_SEGMENT_MARKERS).astype(np.int64),
                       MAX_SEGMENT_MARKERS - 1)  # fmt: skip
    first = np.flatnonzero(np.r_[True, spans[1:] != spans[:-1]])
    counts = np.diff(np.r_[first, len(x)])
    totals = np.add.reduceat(size.astype(np.int64), first)
    hover = [
        f"{n} segments reserved here, {format_size(int(b))} in all"
        if n > 1
        else f"segment of {format_size(int(b))} reserved"
        for n, b in zip(counts.tolist(), totals.tolist(), strict=True)
    ]
    return x[first], seq[first], hover
