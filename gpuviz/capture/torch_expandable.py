"""The address space of PyTorch's expandable segments (``ExpandableSegment`` in
``c10/cuda/CUDACachingAllocator.cpp``), for the caching-allocator model.

With ``expandable_segments:True`` PyTorch reserves, per pool (small/large) and stream, one
virtual range big enough for 1 1/8 of the device's memory (``cuMemAddressReserve``) and maps
physical memory into it in granules (``cuMemCreate`` + ``cuMemMap``) of 2 MiB in the small
pool and 20 MiB in the large one, as allocations need it; it unmaps the granules that lie
wholly inside free blocks when it releases cached memory (``empty_cache``, or before giving
up on an allocation). Each contiguous mapped range is a segment of the heap (as PyTorch's
snapshots report them); ranges are recorded as ``segment_map`` / ``segment_unmap`` events.

``ExpandableSegment`` here is the bookkeeping of one virtual range: which granules are
mapped, and the upstream region backing each (one ``upstream.allocate(granule)`` per granule:
the device's capacity limits the mapped bytes, as physical memory does). Sizes and addresses
are bytes. Virtual ranges are placed from ``VIRTUAL_BASE`` on, each at a multiple of
``VIRTUAL_STRIDE`` (so two ranges never touch); a released range's addresses are not reused.
"""

from __future__ import annotations

from gpuviz.capture.upstream import Upstream

__all__ = ["ExpandableSegment", "VIRTUAL_BASE", "VIRTUAL_STRIDE", "reservation_size"]

VIRTUAL_BASE = 1 << 44  # where the model's virtual reservations begin (16 TiB)
VIRTUAL_STRIDE = 1 << 40  # reservations start at multiples of 1 TiB above VIRTUAL_BASE


def reservation_size(capacity: int, granule: int) -> int:
    """Bytes of virtual address space one expandable segment reserves: enough granules for
    ``capacity + capacity // 8`` bytes (PyTorch: ``numSegments(total + total / 8)``)."""
    total = capacity + capacity // 8
    return -(-total // granule) * granule


class ExpandableSegment:
    """One reserved virtual range ``[base, base + size)`` of one pool and stream, mapped in granules."""

    def __init__(self, base: int, size: int, granule: int, *, small: bool, stream: int) -> None:
        self.base = base
        self.size = size
        self.granule = granule
        self.small = small
        self.stream = stream
        self._handles: list[int | None] = [None] * (size // granule)  # upstream region per granule

    @property
    def end(self) -> int:
        return self.base + self.size

    @property
    def mapped_bytes(self) -> int:
        return sum(h is not None for h in self._handles) * self.granule

    def contains(self, address: int) -> bool:
        return self.base <= address < self.end

    def is_mapped(self, address: int) -> bool:
        return self._handles[(address - self.base) // self.granule] is not None

    def unmapped_run(self, address: int) -> int:
        """Bytes of the unmapped run from ``address`` (a granule boundary) to the next mapped
        granule or the end of the range; 0 when ``address`` is mapped or the end."""
        first = (address - self.base) // self.granule
        last = first
        while last < len(self._handles) and self._handles[last] is None:
            last += 1
        return (last - first) * self.granule

    def unmapped_starts(self) -> list[int]:
        """The start of every maximal unmapped run, in address order (PyTorch's ``unmapped`` blocks)."""
        handles = self._handles
        return [
            self.base + i * self.granule
            for i in range(len(handles))
            if handles[i] is None and (i == 0 or handles[i - 1] is not None)
        ]

    def map(self, upstream: Upstream, address: int, size: int) -> int:
        """Map the granules from ``address`` (a granule boundary) covering ``size`` bytes; returns
        the bytes mapped, or 0 when the upstream runs out (nothing mapped then)."""
        begin = (address - self.base) // self.granule
        end = -(-(address + size - self.base) // self.granule)
        made: list[int] = []
        try:
            for _ in range(begin, end):
                made.append(upstream.allocate(self.granule))
        except MemoryError:
            for handle in made:
                upstream.free(handle)
            return 0
        self._handles[begin:end] = made
        return (end - begin) * self.granule

    def unmap(self, upstream: Upstream, address: int, size: int) -> tuple[int, int]:
        """Unmap the granules lying wholly inside ``[address, address + size)``; returns the
        unmapped range ``(start, bytes)`` (bytes 0: none)."""
        begin = -(-(address - self.base) // self.granule)
        end = (address + size - self.base) // self.granule
        if begin >= end:
            return address, 0
        for i in range(begin, end):
            handle = self._handles[i]
            assert handle is not None, "unmapping a granule that is not mapped"
            upstream.free(handle)
            self._handles[i] = None
        return self.base + begin * self.granule, (end - begin) * self.granule
