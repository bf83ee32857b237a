"""HeapState: every segment and chunk of one device at one event index.

Produced by a live allocator (``BFCAllocator.state()``) and by replaying a log
(``Replay.state_at(i)``); the two must compare equal for the same point in a run.

Invariants (checked by ``HeapState.check``):
    for each segment s:  s.chunks[0].address == s.base
                         c[k].address + c[k].size == c[k+1].address
                         sum(c.size for c in s.chunks) == s.size
    no two adjacent chunks of a segment are both free
    free chunks have requested == 0 and tag is None
    segments do not overlap and are sorted by base
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuviz.base.errors import InvariantError

__all__ = ["ChunkState", "SegmentState", "HeapState"]


@dataclass(frozen=True, slots=True)
class ChunkState:
    """One chunk: ``size`` bytes at ``address``; ``requested`` bytes asked for (0 when free)."""

    address: int
    size: int
    requested: int
    in_use: bool
    tag: str | None = None
    stack: int = field(default=-1, compare=False)  # the allocating call site, where known (replay)


@dataclass(frozen=True, slots=True)
class SegmentState:
    """One segment obtained from upstream: ``size`` bytes at ``base``, tiled by ``chunks``."""

    base: int
    size: int
    chunks: tuple[ChunkState, ...]

    @property
    def end(self) -> int:
        return self.base + self.size


@dataclass(frozen=True, slots=True)
class HeapState:
    """All segments of one device, sorted by base address."""

    device: str
    segments: tuple[SegmentState, ...]

    @property
    def pool_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def bytes_in_use(self) -> int:
        return sum(c.size for s in self.segments for c in s.chunks if c.in_use)

    @property
    def bytes_requested(self) -> int:
        return sum(c.requested for s in self.segments for c in s.chunks if c.in_use)

    @property
    def largest_free_chunk(self) -> int:
        return max((c.size for s in self.segments for c in s.chunks if not c.in_use), default=0)

    @property
    def fragmentation(self) -> float:
        """``(free - largest_free_chunk) / free`` with ``free = pool - in_use``; 0.0 when nothing is free."""
        free = self.pool_bytes - self.bytes_in_use
        return (free - self.largest_free_chunk) / free if free else 0.0

    def chunks(self) -> list[ChunkState]:
        return [c for s in self.segments for c in s.chunks]

    def check(self) -> None:
        """Raise ``InvariantError`` if the state breaks an invariant listed in the module docstring."""
        previous_end = -1
        for seg in self.segments:
            if seg.base < previous_end:
                raise InvariantError(f"segment at {seg.base:#x} overlaps the previous segment")
            previous_end = seg.end
            position = seg.base
            previous_free = False
            for c in seg.chunks:
                if c.address != position:
                    raise InvariantError(f"gap or overlap at {position:#x} in segment {seg.base:#x}")
                if c.size <= 0:
                    raise InvariantError(f"chunk at {c.address:#x} has size {c.size}")
                if not c.in_use:
                    if previous_free:
                        raise InvariantError(f"two adjacent free chunks end at {c.address:#x}")
                    if c.requested or c.tag is not None:
                        raise InvariantError(f"free chunk at {c.address:#x} carries allocation data")
                position += c.size
                previous_free = not c.in_use
            if position != seg.end:
                raise InvariantError(f"chunks of segment {seg.base:#x} do not tile it")
