"""The aggregated fragmentation map's numbers: every segment cut into equal buckets, each bucket
measured as its bytes used, wasted and free, in whole-array passes over all segments at once.

A bucket of segment ``s`` spans offsets ``[edges[s, j], edges[s, j + 1])`` with ``edges[s]`` =
``np.linspace(0, size_s, buckets + 1)``; its used bytes are the requested bytes of chunks in use
inside it, its waste their ``size - requested`` tails, its free the free chunks' bytes. Within a
bucket the three parts are drawn in that order from the bucket's left edge. The arithmetic is the
one ``fragmentation.coverage`` does segment by segment (the same floats, bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuviz.analysis.heapcolumns import HeapColumns

__all__ = ["Buckets", "PARTS", "bucket_count", "measure_buckets"]

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
