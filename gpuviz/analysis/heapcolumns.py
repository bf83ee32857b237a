"""HeapColumns: one device's heap at one instant as arrays, without a Python object per chunk.

The same facts as ``HeapState`` (every segment, every chunk), as NumPy columns: what the views
that draw many heaps (the report's scrubber frames) read, where building ``ChunkState``
objects would cost more than drawing. ``Replay.columns_at`` makes them from the replay's
packed records; ``from_state`` and ``to_state`` convert to and from ``HeapState``; ``subset``
keeps some segments (what a drill-down draws, turned into objects alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuviz.base.heapstate import ChunkState, HeapState, SegmentState

__all__ = ["HeapColumns"]


@dataclass(frozen=True, eq=False)
class HeapColumns:
    """Every segment and chunk of ``device``: segments by base, chunks by address (both ascending).

    Segments: ``bases``, ``sizes`` (int64 bytes). Chunks: ``address``, ``size``, ``requested``
    (int64 bytes; 0 when free), ``in_use`` (bool), ``tag`` (int32 index into ``strings``, -1
    none), ``stack`` (int32 stack id, -1 none), ``owner`` (int64: the row of the segment holding
    the chunk)."""

    device: str
    bases: np.ndarray
    sizes: np.ndarray
    address: np.ndarray
    size: np.ndarray
    requested: np.ndarray
    in_use: np.ndarray
    tag: np.ndarray
    stack: np.ndarray
    owner: np.ndarray
    strings: Sequence[str]

    @classmethod
    def build(
        cls, device: str, bases: np.ndarray, sizes: np.ndarray, address: np.ndarray, size: np.ndarray,
        requested: np.ndarray, in_use: np.ndarray, tag: np.ndarray, stack: np.ndarray, strings: Sequence[str],
    ) -> HeapColumns:  # fmt: skip
        """Columns in any order, sorted here (segments by base, chunks by address) and typed."""
        by_base = np.argsort(bases, kind="stable")
        by_address = np.argsort(address, kind="stable")
        bases = np.asarray(bases, dtype=np.int64)[by_base]
        address = np.asarray(address, dtype=np.int64)[by_address]
        return cls(
            device, bases, np.asarray(sizes, dtype=np.int64)[by_base], address,
            np.asarray(size, dtype=np.int64)[by_address], np.asarray(requested, dtype=np.int64)[by_address],
            np.asarray(in_use, dtype=np.bool_)[by_address], np.asarray(tag, dtype=np.int32)[by_address],
            np.asarray(stack, dtype=np.int32)[by_address],
            (np.searchsorted(bases, address, side="right") - 1).astype(np.int64), strings,
        )  # fmt: skip

    @classmethod
    def from_state(cls, state: HeapState) -> HeapColumns:
        """The columns of ``state``; its tags become ``strings`` in order of first appearance."""
        chunks = state.chunks()
        strings: dict[str, int] = {}
        tags = [strings.setdefault(c.tag, len(strings)) if c.tag is not None else -1 for c in chunks]
        n = len(chunks)
        return cls.build(
            state.device,
            np.fromiter((s.base for s in state.segments), np.int64, len(state.segments)),
            np.fromiter((s.size for s in state.segments), np.int64, len(state.segments)),
            np.fromiter((c.address for c in chunks), np.int64, n), np.fromiter((c.size for c in chunks), np.int64, n),
            np.fromiter((c.requested for c in chunks), np.int64, n),
            np.fromiter((c.in_use for c in chunks), np.bool_, n),
            np.array(tags, dtype=np.int32), np.fromiter((c.stack for c in chunks), np.int32, n), list(strings),
        )  # fmt: skip

    def to_state(self) -> HeapState:
        """The same heap as a ``HeapState`` (a Python object per chunk)."""
        strings = self.strings
        bounds = np.searchsorted(self.owner, np.arange(len(self.bases) + 1)).tolist()
        chunks = [
            ChunkState(a, s, r, u, strings[t] if t >= 0 else None, k)
            for a, s, r, u, t, k in zip(
                self.address.tolist(), self.size.tolist(), self.requested.tolist(), self.in_use.tolist(),
                self.tag.tolist(), self.stack.tolist(), strict=True,
            )
        ]  # fmt: skip
        return HeapState(
            self.device,
            tuple(
                SegmentState(base, size, tuple(chunks[bounds[k] : bounds[k + 1]]))
                for k, (base, size) in enumerate(zip(self.bases.tolist(), self.sizes.tolist(), strict=True))
            ),
        )

    def subset(self, rows: Sequence[int]) -> HeapColumns:
        """The heap of the segments at ``rows`` alone (kept by base) and their chunks."""
        keep = np.unique(np.asarray(rows, dtype=np.int64))
        picked = np.isin(self.owner, keep)
        return HeapColumns(
            self.device, self.bases[keep], self.sizes[keep], self.address[picked], self.size[picked],
            self.requested[picked], self.in_use[picked], self.tag[picked], self.stack[picked],
            np.searchsorted(keep, self.owner[picked]).astype(np.int64), self.strings,
        )  # fmt: skip

    @property
    def pool_bytes(self) -> int:
        """Bytes of every segment."""
        return int(self.sizes.sum())

    @property
    def bytes_in_use(self) -> int:
        """Bytes of the chunks in use (their sizes)."""
        return int(self.size[self.in_use].sum())

    @property
    def largest_free_chunk(self) -> int:
        """Bytes of the largest free chunk, 0 when none is free."""
        free = self.size[~self.in_use]
        return int(free.max()) if len(free) else 0
