"""The BFC allocator's building blocks: Chunk, Segment and the free-chunk index (bins).

Rounding and bins are TensorFlow's rules (``gpuviz.capture.bfc_rules``, re-exported here):
    MIN_ALLOCATION_SIZE = 256          every chunk size is a multiple of 256
    NUM_BINS = 21                      bin b holds free chunks of size in [256·2^b, 256·2^(b+1)),
                                       the last bin (20) every size >= 256 MiB

Chunk invariants:
    chunk.size % 256 == 0 and chunk.size > 0
    chunk.next is None or chunk.next.address == chunk.address + chunk.size
    chunk.next.prev is chunk, chunk.prev.next is chunk
    not chunk.in_use  =>  chunk.requested == 0 and chunk.tag is None

Segment invariants:
    the chunks of a segment tile [base, base + size) exactly; chunks never span segments

FreeIndex invariants:
    keys == sorted(key(c) for every free chunk c), no duplicates
    key(c) = c.size << 64 | c.address, so ascending keys are ascending size, then address

TensorFlow keeps 21 ordered sets and scans them from the request's bin upwards, taking
the first chunk that fits: the smallest free chunk >= the request, lowest address on ties.
Because bins partition sizes in ascending order, their concatenation is one ordered index,
and that scan is a single binary search in it. ``FreeIndex.bins()`` gives the 21 bins.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from gpuviz.capture.bfc_rules import MIN_ALLOCATION_SIZE, NUM_BINS, bin_for_size, bin_size, rounded_bytes

__all__ = [
    "MIN_ALLOCATION_SIZE",
    "NUM_BINS",
    "Chunk",
    "Segment",
    "FreeIndex",
    "bin_for_size",
    "bin_size",
    "rounded_bytes",
]

_SHIFT = 64
_MASK = (1 << _SHIFT) - 1


class Segment:
    """One region obtained from upstream (TF: AllocationRegion): ``size`` bytes at ``base``."""

    __slots__ = ("base", "size")

    def __init__(self, base: int, size: int) -> None:
        self.base = base
        self.size = size


class Chunk:
    """A contiguous piece of a segment, wholly free or wholly in use."""

    __slots__ = ("address", "in_use", "next", "prev", "requested", "segment", "size", "tag", "tag_id")

    def __init__(self, address: int, size: int, segment: Segment) -> None:
        self.address = address
        self.size = size
        self.requested = 0
        self.in_use = False
        self.tag: str | None = None
        self.tag_id = -1
        self.prev: Chunk | None = None
        self.next: Chunk | None = None
        self.segment = segment

    @property
    def key(self) -> int:
        return self.size << _SHIFT | self.address

    def __repr__(self) -> str:
        state = "in use" if self.in_use else "free"
        return f"<Chunk {self.address:#x} size={self.size} requested={self.requested} {state}>"


class FreeIndex:
    """Every free chunk, ordered by (size, address)."""

    __slots__ = ("keys",)

    def __init__(self) -> None:
        self.keys: list[int] = []

    def insert(self, chunk: Chunk) -> None:
        insort(self.keys, chunk.size << _SHIFT | chunk.address)

    def remove(self, chunk: Chunk) -> None:
        keys = self.keys
        key = chunk.size << _SHIFT | chunk.address
        i = bisect_left(keys, key)
        if i == len(keys) or keys[i] != key:
            raise KeyError(f"free chunk {chunk.address:#x} ({chunk.size} bytes) is not in the free index")
        del keys[i]

    def take_best_fit(self, rounded: int) -> int | None:
        """Remove and return the address of the smallest free chunk >= ``rounded`` (lowest address on ties)."""
        keys = self.keys
        i = bisect_left(keys, rounded << _SHIFT)
        if i == len(keys):
            return None
        return keys.pop(i) & _MASK

    def largest(self) -> int:
        """Size of the largest free chunk, 0 when none."""
        keys = self.keys
        return keys[-1] >> _SHIFT if keys else 0

    def __len__(self) -> int:
        return len(self.keys)

    def entries(self) -> list[tuple[int, int]]:
        """``(size, address)`` of every free chunk in index order."""
        return [(key >> _SHIFT, key & _MASK) for key in self.keys]

    def bins(self) -> list[list[tuple[int, int]]]:
        """The 21 bins: ``(size, address)`` of their free chunks, each bin in (size, address) order."""
        result: list[list[tuple[int, int]]] = [[] for _ in range(NUM_BINS)]
        for size, address in self.entries():
            result[bin_for_size(size)].append((size, address))
        return result
