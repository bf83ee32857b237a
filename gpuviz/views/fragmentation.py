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
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from gpuviz.base.heapstate import HeapState
from gpuviz.base.tags import parse_array_tag
from gpuviz.base.units import format_bytes
from gpuviz.log.eventlog import Frame

__all__ = ["fragmentation_map", "map_traces", "trace_specs", "map_layout", "segment_rows", "COLORS", "metric_text"]

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


def call_site(stacks: Sequence[tuple[Frame, ...]] | None, stack: int) -> str | None:
    """``file:line (function)`` of the innermost recorded frame of stack ``stack``."""
    if stacks is None or not 0 <= stack < len(stacks) or not stacks[stack]:
        return None
    frame = stacks[stack][0]
    return f"{frame.filename}:{frame.lineno} ({frame.function})"


def _exact(
    state: HeapState, color_by: str, stacks: Sequence[tuple[Frame, ...]] | None = None
) -> dict[str, dict[str, list[Any]]]:
    traces: dict[str, dict[str, list[Any]]] = {}

    def add(name: str, y: str, start: int, length: int, text: str, custom: tuple[int, int, int]) -> None:
        t = traces.setdefault(name, {"y": [], "base": [], "x": [], "text": [], "custom": []})
        t["y"].append(y)
        t["base"].append(start)
        t["x"].append(length)
        t["text"].append(text)
        t["custom"].append(custom)

    for seg in state.segments:
        y = _label(seg.base)
        for c in seg.chunks:
            offset = c.address - seg.base
            tag = html.escape(c.tag) if c.tag else "-"
            info = f"address {c.address:#x}<br>size {c.size} B<br>requested {c.requested} B<br>tag {tag}"
            site = call_site(stacks, c.stack)
            if site is not None:
                info += f"<br>call site {html.escape(site)}"
            if c.in_use:
                used = "used" if color_by == "state" else html.escape(_group(c.tag, color_by))
                custom = (c.address, c.size, c.requested)
                add(used, y, offset, c.requested, info, custom)
                if c.size > c.requested:
                    add("waste", y, offset + c.requested, c.size - c.requested, info, custom)
            else:
                add("free", y, offset, c.size, f"free chunk {c.address:#x}<br>size {c.size} B", (c.address, c.size, 0))
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
    traces: dict[str, dict[str, list[Any]]] = {
        name: {"y": [], "base": [], "x": [], "text": [], "custom": []} for name in COLORS
    }
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
                    t["custom"].append((seg.base + int(edges[i]), int(counts[i]), int(length)))
                    start += length
    return traces


_LEAN_HOVER = {
    False: "0x%{customdata[0]:x}<br>size %{customdata[1]} B<br>requested %{customdata[2]} B",
    True: "%{customdata[1]} chunks from 0x%{customdata[0]:x}<br>%{customdata[2]} B",
}


def trace_specs(
    state: HeapState,
    *,
    color_by: str = "state",
    max_rectangles: int = 20_000,
    lean: bool = False,
    stacks: Sequence[tuple[Frame, ...]] | None = None,
) -> list[dict[str, Any]]:
    """The map's bars as plain plotly trace dicts: always ``used``, ``waste``, ``free`` first
    (possibly empty) in ``"state"`` mode or when aggregated, so scrubber frames line up.

    ``lean``: rows as numbers (``segment_rows`` labels them), whole-byte geometry and hover
    from numeric ``customdata`` instead of per-rectangle text (tags left out): about a
    third of the bytes, for reports that embed many frames.
    """
    n_chunks = sum(len(s.chunks) for s in state.segments)
    aggregated = n_chunks * 2 > max_rectangles
    traces = _aggregated(state, max_rectangles) if aggregated else _exact(state, color_by, stacks)
    names = ["used", "waste", "free", *sorted(n for n in traces if n not in COLORS)]
    rows = {_label(seg.base): i for i, seg in enumerate(state.segments)}
    specs = []
    for i, name in enumerate(names):
        data = traces.get(name, {"y": [], "base": [], "x": [], "text": [], "custom": []})
        spec: dict[str, Any] = {
            "type": "bar",
            "orientation": "h",
            "name": name + (" (aggregated)" if aggregated and name in COLORS else ""),
            "marker": {
                "color": COLORS.get(name, _PALETTE[i % len(_PALETTE)]),
                "line": {"width": 0.5, "color": "white"},
            },
        }
        if lean:
            spec.update(
                y=[rows[y] for y in data["y"]],
                base=[int(b) for b in data["base"]],
                x=[round(x) for x in data["x"]],
                customdata=[list(c) for c in data["custom"]],
                hovertemplate=_LEAN_HOVER[aggregated] + f"<extra>{name}</extra>",
            )
        else:
            spec.update(y=data["y"], base=data["base"], x=data["x"], hovertext=data["text"], hoverinfo="text")
        specs.append(spec)
    return specs


def map_traces(
    state: HeapState,
    *,
    color_by: str = "state",
    max_rectangles: int = 20_000,
    lean: bool = False,
    stacks: Sequence[tuple[Frame, ...]] | None = None,
) -> list[go.Bar]:
    """``trace_specs`` as validated plotly ``Bar`` traces."""
    specs = trace_specs(state, color_by=color_by, max_rectangles=max_rectangles, lean=lean, stacks=stacks)
    return [go.Bar(**spec) for spec in specs]


def segment_rows(state: HeapState) -> dict[str, Any]:
    """y-axis settings that label the numeric rows of lean traces with segment addresses."""
    return {
        "tickvals": list(range(len(state.segments))),
        "ticktext": [_label(s.base) for s in state.segments],
        "range": [len(state.segments) - 0.5, -0.5],
        "type": "linear",
    }


def map_layout(state: HeapState, *, title: str | None = None, lean: bool = False) -> dict[str, Any]:
    """The map's layout as a plain dict: the metric strip in the title, one row per segment."""
    rows = max(1, len(state.segments))
    yaxis: dict[str, Any] = {"title": {"text": "segment"}, "type": "category", "autorange": "reversed"}
    if lean:
        yaxis = {"title": {"text": "segment"}, **segment_rows(state)}
    return {
        "title": {"text": html.escape(title or state.device) + "<br><sub>" + metric_text(state) + "</sub>"},
        "barmode": "overlay",
        "bargap": 0.15,
        "height": min(900, 180 + 28 * rows),
        "xaxis": {
            "title": {"text": "offset in segment"},
            "rangemode": "tozero",
            "exponentformat": "SI",
            "ticksuffix": "B",
        },
        "yaxis": yaxis,
        "legend": {"orientation": "h", "y": -0.25},
        "margin": {"l": 120, "r": 20, "t": 80, "b": 60},
    }


def fragmentation_map(
    state: HeapState,
    *,
    color_by: str = "state",
    max_rectangles: int = 20_000,
    title: str | None = None,
    lean: bool = False,
    stacks: Sequence[tuple[Frame, ...]] | None = None,
) -> go.Figure:
    """The fragmentation map of ``state`` with its metric strip as the title.

    ``stacks``: the log's stack table, to show each chunk's call site on hover (chunks from
    a replay carry their allocation's stack id). ``lean``: see ``trace_specs``.
    """
    return go.Figure(
        data=map_traces(state, color_by=color_by, max_rectangles=max_rectangles, lean=lean, stacks=stacks),
        layout=map_layout(state, title=title, lean=lean),
    )
