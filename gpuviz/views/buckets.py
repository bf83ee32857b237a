"""The aggregated fragmentation map (a heap of more chunks than a map draws): every segment cut
into equal buckets, each bucket measured as its bytes used, wasted and free, in whole-array
passes over all segments at once, and drawn as those three parts (``aggregated_traces``;
``aggregated_specs``, the lean form the report embeds).

A bucket of segment ``s`` spans offsets ``[edges[s, j], edges[s, j + 1])`` with ``edges[s]`` =
``np.linspace(0, size_s, buckets + 1)``; its used bytes are the requested bytes of chunks in use
inside it, its waste their ``size - requested`` tails, its free the free chunks' bytes. Within a
bucket the three parts are drawn in that order from the bucket's left edge. The arithmetic is the
one ``coverage`` does segment by segment (the same floats, bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuviz.analysis.heapcolumns import HeapColumns
from gpuviz.base.heapstate import HeapState
from gpuviz.base.units import format_size
from gpuviz.views.mapstyle import COLORS, OOM_COLORS, PALETTE, label

__all__ = ["Buckets", "PARTS", "bucket_count", "measure_buckets", "coverage", "bucket_hover", "aggregated_traces"]
__all__ += ["aggregated_specs", "LEAN_AGGREGATED"]

PARTS = ("used", "waste", "free")
"""The parts of a bucket, in the order they are drawn from its left edge."""


def bucket_count(segments: int, max_rectangles: int) -> int:
    """Buckets per segment: three rectangles per bucket within ``max_rectangles``, at least one."""
    return max(1, max_rectangles // (3 * max(1, segments)))


@dataclass(frozen=True)
class Buckets:
    """Per segment row ``s`` and bucket ``j`` (arrays of shape ``(segments, buckets)``):
    ``amounts[part]`` bytes (float64), where each part's bar starts, ``starts[part]`` (float64
    bytes from the segment's base), ``counts`` (chunks starting in the bucket) and ``address``
    (int64: the segment's base plus the bucket's left edge, truncated)."""

    amounts: dict[str, np.ndarray]
    starts: dict[str, np.ndarray]
    counts: np.ndarray
    address: np.ndarray


def _coverage(
    heap: HeapColumns, pick: np.ndarray, start: np.ndarray, length: np.ndarray, edges: np.ndarray
) -> np.ndarray:
    """Per segment row and edge: bytes of the picked intervals ``[start, start + length)``
    (absolute addresses, disjoint, ascending) of that segment below the edge (an offset)."""
    start, length, owner = start[pick], length[pick], heap.owner[pick]
    out = np.zeros(edges.shape, dtype=np.float64)
    if not len(start):
        return out
    rows = np.arange(len(heap.bases))
    first = np.searchsorted(owner, rows, side="left")  # the segment's intervals: [first, last]
    last = np.searchsorted(owner, rows, side="right") - 1
    # the last interval of the segment starting at or below the edge (starts are whole bytes)
    key = heap.bases[:, None] + np.floor(edges).astype(np.int64)
    k = np.minimum(np.searchsorted(start, key, side="right") - 1, last[:, None])
    valid = k >= first[:, None]
    k = np.maximum(k, 0)
    cumulative = np.concatenate(([0], np.cumsum(length)))
    before = cumulative[k] - cumulative[first][:, None]  # bytes of the segment's intervals before k
    inside = np.minimum(edges - (start[k] - heap.bases[:, None]), length[k])
    return np.where(valid, before + np.maximum(inside, 0), 0).astype(np.float64)


def measure_buckets(heap: HeapColumns, buckets: int) -> Buckets:
    """The buckets of every segment of ``heap`` (``buckets`` per segment)."""
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, got {buckets}")
    edges = np.linspace(0, heap.sizes, buckets + 1, axis=1).reshape(len(heap.bases), buckets + 1)
    used = heap.in_use
    wasted = used & (heap.size > heap.requested)
    covered = {
        "used": _coverage(heap, used, heap.address, heap.requested, edges),
        "waste": _coverage(heap, wasted, heap.address + heap.requested, heap.size - heap.requested, edges),
        "free": _coverage(heap, ~used, heap.address, heap.size, edges),
    }
    amounts = {name: np.diff(covered[name], axis=1) for name in PARTS}
    # chunks starting below each edge: offsets are whole bytes, so offset < edge <=> offset < ceil(edge)
    below = np.searchsorted(heap.address, heap.bases[:, None] + np.ceil(edges).astype(np.int64), side="left")
    counts = np.diff(below, axis=1)
    left = edges[:, :-1]
    starts = {"used": left, "waste": left + amounts["used"]}
    starts["free"] = starts["waste"] + amounts["waste"]
    return Buckets(amounts, starts, counts, heap.bases[:, None] + left.astype(np.int64))


def coverage(starts: np.ndarray, lengths: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Bytes of the disjoint, sorted intervals ``[start, start + length)`` below each ``x``
    (one segment's buckets: the definition ``measure_buckets`` follows, and the live map's)."""
    if not len(starts):
        return np.zeros(len(x), dtype=np.float64)
    cumulative = np.concatenate(([0], np.cumsum(lengths)))
    k = np.searchsorted(starts, x, side="right") - 1
    inside = np.where(k >= 0, np.minimum(x - starts[np.maximum(k, 0)], lengths[np.maximum(k, 0)]), 0)
    return np.where(k >= 0, cumulative[np.maximum(k, 0)] + np.maximum(inside, 0), 0).astype(np.float64)


def bucket_hover(chunks: int, start: int, used: float, waste: float, free: float) -> str:
    """The hover of an aggregated map's bucket (the static map's and the live one's): how many
    chunks start in it, from which address, and its used, waste and free bytes."""
    return (
        f"{chunks} chunks from {start:#x}<br>used {format_size(used)}<br>waste {format_size(waste)}"
        f"<br>free {format_size(free)}"
    )


def aggregated_traces(state: HeapState, max_rectangles: int, texts: bool = True) -> dict[str, dict[str, list[Any]]]:
    """Each segment cut into equal buckets, each bucket drawn as its bytes used, wasted and free
    (in that order from the bucket's left edge), with its chunk count (``buckets``)."""
    heap = HeapColumns.from_state(state)
    measured = measure_buckets(heap, bucket_count(len(heap.bases), max_rectangles))
    labels = [label(base) for base in heap.bases.tolist()]
    traces: dict[str, dict[str, list[Any]]] = {}
    for name in COLORS:
        rows, columns = np.nonzero(measured.amounts[name] > 0)
        length = measured.amounts[name][rows, columns]
        start, counts = measured.address[rows, columns].tolist(), measured.counts[rows, columns].tolist()
        words = (  # lean traces hover from customdata instead
            [bucket_hover(n, a, *(float(measured.amounts[part][r, c]) for part in PARTS))
             for n, a, r, c in zip(counts, start, rows.tolist(), columns.tolist(), strict=True)]
            if texts else [""] * len(rows)
        )  # fmt: skip
        traces[name] = {
            "y": [labels[r] for r in rows.tolist()], "base": measured.starts[name][rows, columns].tolist(),
            "x": length.tolist(), "text": words,
            "custom": list(zip(start, counts, length.astype(np.int64).tolist(), strict=True)),
        }  # fmt: skip
    return traces


def aggregated_specs(
    heap: HeapColumns, max_rectangles: int, *, free_name: str = "free", arrays: bool = False
) -> list[dict[str, Any]]:
    """The lean traces of the aggregated map of ``heap`` (``trace_specs(lean=True)`` of a heap
    of more than ``max_rectangles / 2`` chunks), from whole arrays: ``free_name``, ``waste``,
    ``used``; rows as segment numbers, bars in whole bytes, hover from ``customdata``
    ``[bucket address, chunks, bytes]``. (At an OOM, ``free_name`` is "free hole" and that
    trace stays empty: the aggregated map shows no holes.) ``arrays``: ``y``, ``base``, ``x``
    and ``customdata`` (n rows of 3) as int64 NumPy arrays instead of lists."""
    measured = measure_buckets(heap, bucket_count(len(heap.bases), max_rectangles))
    specs = []
    for i, name in enumerate((free_name, "waste", "used")):
        color = OOM_COLORS.get(name) or COLORS.get(name, PALETTE[i % len(PALETTE)])
        spec: dict[str, Any] = {
            "type": "bar", "orientation": "h", "name": name + (" (aggregated)" if name in COLORS else ""),
            "marker": {"color": color, "line": {"width": 0.5, "color": "white"}},
        }  # fmt: skip
        if name in PARTS:
            rows, columns = np.nonzero(measured.amounts[name] > 0)
            length = measured.amounts[name][rows, columns]
            custom = np.stack((measured.address[rows, columns], measured.counts[rows, columns],
                               length.astype(np.int64)), axis=1)  # fmt: skip
            bars = {"y": rows.astype(np.int64), "base": measured.starts[name][rows, columns].astype(np.int64),
                    "x": np.rint(length).astype(np.int64), "customdata": custom}  # fmt: skip
        else:
            bars = {"y": _NONE, "base": _NONE, "x": _NONE, "customdata": _NONE.reshape(0, 3)}
        spec.update(bars if arrays else {key: value.tolist() for key, value in bars.items()})
        spec["hovertemplate"] = LEAN_AGGREGATED
        specs.append(spec)
    return specs


_NONE = np.zeros(0, dtype=np.int64)
LEAN_AGGREGATED = "%{customdata[1]} chunks from 0x%{customdata[0]:x}<br>%{customdata[2]} B"
"""The hover of a lean aggregated map's bar, from its ``customdata``."""
