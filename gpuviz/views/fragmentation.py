"""The fragmentation map: every segment of a device at one instant, chunks drawn to scale.

Each segment is one row (y: its base address); x is the byte offset inside the segment.
A chunk in use is drawn as its used part ``[address, address + requested)`` and its
internal waste ``[address + requested, address + size)``; a free chunk as free. When a
heap holds more chunks than ``max_rectangles``, each segment is cut into equal buckets
and every bucket is drawn as its used, waste and free bytes (what cannot be seen at that
zoom is aggregated, never dropped).
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import plotly.graph_objects as go

from gpuviz.base.heapstate import HeapState
from gpuviz.base.tags import parse_array_tag
from gpuviz.base.units import format_bytes

__all__ = ["fragmentation_map", "map_traces", "COLORS", "metric_text"]

COLORS = {"used": "#3b6fb6", "waste": "#e8a33d", "free": "#d9dde3"}
_PALETTE = ["#3b6fb6", "#6a9e3f", "#9b59b6", "#16a085", "#c0392b", "#2c3e50", "#d35400", "#7f8c8d"]


def metric_text(state: HeapState) -> str:
    """The metric strip: bytes in use, pool, largest free chunk, fragmentation."""
    return (
        f"in use {format_bytes(state.bytes_in_use)} · pool {format_bytes(state.pool_bytes)} · "
        f"largest free {format_bytes(state.largest_free_chunk)} · fragmentation {state.fragmentation:.1%}"
    )


def _label(base: int) -> str:
    return f"{base:#x}"


def _group(tag: str | None, color_by: str) -> str:
    if color_by == "dtype":
        parsed = parse_array_tag(tag)
        return parsed.dtype if parsed else "(untagged)"
    return tag or "(untagged)"


def _exact(state: HeapState, color_by: str) -> dict[str, dict[str, list[Any]]]:
    traces: dict[str, dict[str, list[Any]]] = {}

    def add(name: str, y: str, start: int, length: int, text: str) -> None:
        t = traces.setdefault(name, {"y": [], "base": [], "x": [], "text": []})
        t["y"].append(y)
        t["base"].append(start)
        t["x"].append(length)
        t["text"].append(text)

    for seg in state.segments:
        y = _label(seg.base)
        for c in seg.chunks:
            offset = c.address - seg.base
            tag = html.escape(c.tag) if c.tag else "-"
            info = f"address {c.address:#x}<br>size {c.size} B<br>requested {c.requested} B<br>tag {tag}"
            if c.in_use:
                used = "used" if color_by == "state" else html.escape(_group(c.tag, color_by))
                add(used, y, offset, c.requested, info)
                if c.size > c.requested:
                    add("waste", y, offset + c.requested, c.size - c.requested, info)
            else:
                add("free", y, offset, c.size, f"free chunk {c.address:#x}<br>size {c.size} B")
    return traces


def _coverage(starts: np.ndarray, lengths: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Bytes of the disjoint, sorted intervals ``[start, start + length)`` below each ``x``."""
    if not len(starts):
        return np.zeros(len(x), dtype=np.float64)
    cumulative = np.concatenate(([0], np.cumsum(lengths)))
    k = np.searchsorted(starts, x, side="right") - 1
    inside = np.where(k >= 0, np.minimum(x - starts[np.maximum(k, 0)], lengths[np.maximum(k, 0)]), 0)
    return np.where(k >= 0, cumulative[np.maximum(k, 0)] + np.maximum(inside, 0), 0).astype(np.float64)


def _aggregated(state: HeapState, max_rectangles: int) -> dict[str, dict[str, list[Any]]]:
    traces: dict[str, dict[str, list[Any]]] = {name: {"y": [], "base": [], "x": [], "text": []} for name in COLORS}
    buckets = max(1, max_rectangles // (3 * max(1, len(state.segments))))
    for seg in state.segments:
        y = _label(seg.base)
        parts: dict[str, list[tuple[int, int]]] = {"used": [], "waste": [], "free": []}
        for c in seg.chunks:
            offset = c.address - seg.base
            if c.in_use:
                parts["used"].append((offset, c.requested))
                if c.size > c.requested:
                    parts["waste"].append((offset + c.requested, c.size - c.requested))
            else:
                parts["free"].append((offset, c.size))
        edges = np.linspace(0, seg.size, buckets + 1)
        amounts = {}
        for name, intervals in parts.items():
            arr = np.array(intervals, dtype=np.int64).reshape(-1, 2)
            covered = _coverage(arr[:, 0], arr[:, 1], edges)
            amounts[name] = np.diff(covered)
        counts = np.diff(np.searchsorted([c.address - seg.base for c in seg.chunks], edges))
        for i in range(buckets):
            start = edges[i]
            text = (
                f"{int(counts[i])} chunks from {seg.base + int(start):#x}<br>used {int(amounts['used'][i])} B"
                f"<br>waste {int(amounts['waste'][i])} B<br>free {int(amounts['free'][i])} B"
            )
            for name in ("used", "waste", "free"):
                length = amounts[name][i]
                if length > 0:
                    t = traces[name]
                    t["y"].append(y)
                    t["base"].append(start)
                    t["x"].append(length)
                    t["text"].append(text)
                    start += length
    return traces


def map_traces(state: HeapState, *, color_by: str = "state", max_rectangles: int = 20_000) -> list[go.Bar]:
    """The map's bars: always ``used``, ``waste``, ``free`` (first three, possibly empty) in
    ``"state"`` mode or when aggregated, so frames of a scrubber line up trace by trace."""
    n_chunks = sum(len(s.chunks) for s in state.segments)
    aggregated = n_chunks * 2 > max_rectangles
    traces = _aggregated(state, max_rectangles) if aggregated else _exact(state, color_by)
    names = ["used", "waste", "free", *sorted(n for n in traces if n not in COLORS)]
    bars = []
    for i, name in enumerate(names):
        data = traces.get(name, {"y": [], "base": [], "x": [], "text": []})
        color = COLORS.get(name, _PALETTE[i % len(_PALETTE)])
        bars.append(
            go.Bar(
                name=name + (" (aggregated)" if aggregated and name in COLORS else ""),
                orientation="h",
                y=data["y"],
                base=data["base"],
                x=data["x"],
                hovertext=data["text"],
                hoverinfo="text",
                marker={"color": color, "line": {"width": 0.5, "color": "white"}},
            )
        )
    return bars


def fragmentation_map(
    state: HeapState, *, color_by: str = "state", max_rectangles: int = 20_000, title: str | None = None
) -> go.Figure:
    """The fragmentation map of ``state`` with its metric strip as the title."""
    figure = go.Figure(map_traces(state, color_by=color_by, max_rectangles=max_rectangles))
    rows = max(1, len(state.segments))
    figure.update_layout(
        title={"text": html.escape(title or state.device) + "<br><sub>" + metric_text(state) + "</sub>"},
        barmode="overlay",
        bargap=0.15,
        height=min(900, 180 + 28 * rows),
        xaxis={"title": "offset in segment", "rangemode": "tozero", "exponentformat": "SI", "ticksuffix": "B"},
        yaxis={"title": "segment", "type": "category", "autorange": "reversed"},
        legend={"orientation": "h", "y": -0.25},
        margin={"l": 120, "r": 20, "t": 80, "b": 60},
    )
    return figure
