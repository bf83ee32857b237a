"""The live fragmentation map of a heap with many chunks, drawn from ``HeapArrays`` at a cost
that does not grow with the number of chunks beyond NumPy's passes over them.

Each segment is one row, as in ``fragmentation``; the range the map opens at (the used range
when bytes in use are below ``ZOOM_BELOW`` of the pool, else the whole segment) is cut into
equal buckets, the rest of a segment beyond it into one more, and every bucket is drawn as its
used, waste and free bytes, in that order from its start (nothing is dropped: a bucket's three
bars add up to its width). Hovering a bucket says how many chunks start in it, from which
address, and its used, waste and free bytes. The title carries the metric strip
(``metric_words``). Sizes and offsets in bytes.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np

from gpuviz.analysis.live import HeapArrays
from gpuviz.views.fragmentation import COLORS, ZOOM_BELOW, bucket_hover, coverage, metric_words, rows_layout

__all__ = ["live_map", "heap_numbers", "LIVE_MAX_RECTANGLES"]

LIVE_MAX_RECTANGLES = 600
"""The live map draws at most about this many bars (three per bucket)."""


def heap_numbers(heap: HeapArrays) -> tuple[int, int, int, tuple[int, int] | None]:
    """Bytes in use, pool bytes, the largest free chunk and the opening x range (``zoom_range``'s
    rule without an OOM: from 0 to a quarter past the highest chunk end, or None) of ``heap``."""
    bases, sizes, address, size = heap.segment_base, heap.segment_size, heap.address, heap.size
    pool, in_use = int(sizes.sum()), int(size.sum())
    if not len(bases):
        return in_use, pool, 0, None
    segment = np.searchsorted(bases, address, side="right") - 1
    ends = address + size
    same = np.zeros(len(address), dtype=bool)
    same[1:] = segment[1:] == segment[:-1]
    before = address - np.where(same, np.concatenate(([0], ends[:-1])), bases[segment])  # the hole before each chunk
    last = np.searchsorted(segment, np.arange(len(bases)), side="right") - 1  # each segment's last chunk
    has = last >= 0
    has[has] = segment[last[has]] == np.flatnonzero(has)
    after = bases + sizes - np.where(has, ends[np.maximum(last, 0)], bases)  # the hole after it (or the segment)
    largest = int(max(before.max(initial=0), after.max(initial=0)))
    zoom = None
    widest = int(sizes.max())
    if in_use < ZOOM_BELOW * pool:
        end = min(widest, int(int((ends - bases[segment]).max(initial=0)) * 1.25) + 1)
        zoom = None if end >= widest or end <= 0 else (0, end)
    return in_use, pool, largest, zoom


def live_map(heap: HeapArrays, *, title: str, max_rectangles: int = LIVE_MAX_RECTANGLES) -> dict[str, Any]:
    """The live map of ``heap`` as a plotly figure dict (bars in buckets, see the module doc)."""
    if max_rectangles < 3:
        raise ValueError(f"max_rectangles must be >= 3, got {max_rectangles}")
    in_use, pool, largest, zoom = heap_numbers(heap)
    bases, sizes = heap.segment_base.tolist(), heap.segment_size.tolist()
    buckets = max(1, max_rectangles // (3 * max(1, len(bases))))
    rows: list[str] = []
    edges: list[np.ndarray] = []
    for base, seg_size in zip(bases, sizes, strict=True):
        span = min(seg_size, zoom[1]) if zoom is not None else seg_size
        cut = np.linspace(base, base + span, buckets + 1).round().astype(np.int64)
        if span < seg_size:
            cut = np.append(cut, base + seg_size)
        edges.append(cut)
        rows += [f"{base:#x}"] * (len(cut) - 1)  # the map's row labels
    traces: dict[str, dict[str, list[Any]]] = {name: {"y": [], "base": [], "x": [], "hovertext": []} for name in COLORS}
    if edges:
        starts = np.concatenate([cut[:-1] for cut in edges])
        stops = np.concatenate([cut[1:] for cut in edges])
        offsets = starts - np.repeat(np.asarray(bases, dtype=np.int64), [len(cut) - 1 for cut in edges])
        width = stops - starts
        used = coverage(heap.address, heap.requested, stops) - coverage(heap.address, heap.requested, starts)
        waste_start = heap.address + heap.requested
        waste_length = heap.size - heap.requested
        waste = coverage(waste_start, waste_length, stops) - coverage(waste_start, waste_length, starts)
        free = width - used - waste
        counts = np.searchsorted(heap.address, stops) - np.searchsorted(heap.address, starts)
        columns = (offsets, starts, counts, used, waste, free)
        for row, offset, start, n, u, w, f in zip(rows, *(c.tolist() for c in columns), strict=True):
            text = bucket_hover(n, start, u, w, f)
            at = offset
            for name, length in (("used", u), ("waste", w), ("free", f)):
                if length > 0:
                    t = traces[name]
                    t["y"].append(row)
                    t["base"].append(at)
                    t["x"].append(length)
                    t["hovertext"].append(text)
                    at += length
    data = [
        {"type": "bar", "orientation": "h", "name": f"{name} (aggregated)",
         "marker": {"color": COLORS[name], "line": {"width": 0.5, "color": "white"}},
         "hoverinfo": "text", **traces[name]}
        for name in ("free", "waste", "used")
    ]  # fmt: skip
    chunks = len(heap.address)
    heading = (f"{html.escape(title)}<br><sub>{metric_words(in_use, pool, largest)} · {chunks} chunks in use,"
               f" drawn in buckets</sub>")  # fmt: skip
    layout = rows_layout(bases, sizes, zoom, heading)
    layout["uirevision"] = heap.device
    return {"data": data, "layout": layout}
