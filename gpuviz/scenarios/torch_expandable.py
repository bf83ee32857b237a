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
the device's capacity limits the mapped bytes, as physical memory does). ``ExpandableBlocks``
is the part of ``TorchCachingAllocator`` that finds, maps and unmaps blocks in those ranges
(PyTorch's ``find_expandable_block``, ``map_block``, ``try_allocate_expandable_block``,
``unmap_block``). Sizes and addresses
are bytes. Virtual ranges are placed from ``VIRTUAL_BASE`` on, each at a multiple of
``VIRTUAL_STRIDE`` (so two ranges never touch); a released range's addresses are not reused.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

from gpuviz.base.torch_rules import LARGE_BUFFER, SMALL_BUFFER
from gpuviz.capture.upstream import Upstream
from gpuviz.log.heapbuilder import HeapBuilder
from gpuviz.scenarios.torch_block import Block

__all__ = ["ExpandableSegment", "ExpandableBlocks", "VIRTUAL_BASE", "VIRTUAL_STRIDE", "reservation_size"]

VIRTUAL_BASE = 1 << 44  # where the model's virtual reservations begin (16 TiB)
VIRTUAL_STRIDE = 1 << 40  # reservations start at multiples of 1 TiB above VIRTUAL_BASE


def reservation_size(capacity: int, granule: int) -> int:
    """Bytes of virtual address space one expandable segment reserves: enough granules for
    ``capacity + capacity // 8`` bytes (PyTorch: ``numSegments(total + total / 8)``)."""
    total = capacity + capacity // 8
    return -(-total // granule) * granule


class ExpandableSegment:
    """One reserved virtual range ``[base, base + size)`` of one pool and stream, mapped in granules.

    Sparse: only the mapped granules are stored (their upstream regions, and the mapped runs as
    sorted granule intervals), so a range the size of an unbounded device costs what is mapped,
    and each query is a binary search over the mapped runs."""

    def __init__(self, base: int, size: int, granule: int, *, small: bool, stream: int) -> None:
        self.base = base
        self.size = size
        self.granule = granule
        self.small = small
        self.stream = stream
        self._count = size // granule  # granules in the range
        self._handles: dict[int, int] = {}  # granule index -> upstream region, mapped granules only
        self._starts: list[int] = []  # mapped runs [start, end) in granule indices, sorted, disjoint,
        self._ends: list[int] = []  # never adjacent (touching runs are merged)

    @property
    def end(self) -> int:
        return self.base + self.size

    @property
    def mapped_bytes(self) -> int:
        return len(self._handles) * self.granule

    def mapped_runs(self) -> list[tuple[int, int]]:
        """Every maximal mapped range as ``(address, bytes)``, in address order."""
        g = self.granule
        return [(self.base + a * g, (b - a) * g) for a, b in zip(self._starts, self._ends, strict=True)]

    def contains(self, address: int) -> bool:
        return self.base <= address < self.end

    def _run_at(self, index: int) -> int:
        """The position of the mapped run holding granule ``index``, or -1."""
        at = bisect_right(self._starts, index) - 1
        return at if at >= 0 and index < self._ends[at] else -1

    def is_mapped(self, address: int) -> bool:
        return (address - self.base) // self.granule in self._handles

    def unmapped_run(self, address: int) -> int:
        """Bytes of the unmapped run from ``address`` (a granule boundary) to the next mapped
        granule or the end of the range; 0 when ``address`` is mapped or the end."""
        first = (address - self.base) // self.granule
        if first >= self._count or first in self._handles:
            return 0
        following = bisect_right(self._starts, first)
        last = self._starts[following] if following < len(self._starts) else self._count
        return (last - first) * self.granule

    def unmapped_starts(self) -> list[int]:
        """The start of every maximal unmapped run, in address order (PyTorch's ``unmapped`` blocks)."""
        starts = [0] if not self._starts or self._starts[0] > 0 else []
        starts.extend(end for end in self._ends if end < self._count)
        return [self.base + i * self.granule for i in starts]

    def map(self, upstream: Upstream, address: int, size: int) -> int:
        """Map the granules from ``address`` (a granule boundary) covering ``size`` bytes; returns
        the bytes mapped, or 0 when the upstream runs out (nothing mapped then)."""
        begin = (address - self.base) // self.granule
        end = min(-(-(address + size - self.base) // self.granule), self._count)
        assert begin < end and all(i not in self._handles for i in (begin, end - 1)), "mapping a mapped granule"
        made: list[int] = []
        try:
            for _ in range(begin, end):
                made.append(upstream.allocate(self.granule))
        except MemoryError:
            for handle in made:
                upstream.free(handle)
            return 0
        self._handles.update(zip(range(begin, end), made, strict=True))
        at = bisect_right(self._starts, begin)  # the new run goes here; merge with touching neighbours
        new_start, new_end = begin, end
        if at > 0 and self._ends[at - 1] == begin:
            at -= 1
            new_start = self._starts[at]
            del self._starts[at], self._ends[at]
        if at < len(self._starts) and self._starts[at] == end:
            new_end = self._ends[at]
            del self._starts[at], self._ends[at]
        self._starts.insert(at, new_start)
        self._ends.insert(at, new_end)
        return (end - begin) * self.granule

    def unmap(self, upstream: Upstream, address: int, size: int) -> tuple[int, int]:
        """Unmap the granules lying wholly inside ``[address, address + size)``; returns the
        unmapped range ``(start, bytes)`` (bytes 0: none)."""
        begin = -(-(address - self.base) // self.granule)
        end = (address + size - self.base) // self.granule
        if begin >= end:
            return address, 0
        at = self._run_at(begin)
        assert at >= 0 and end <= self._ends[at], "unmapping a granule that is not mapped"
        for i in range(begin, end):
            upstream.free(self._handles.pop(i))
        run_start, run_end = self._starts[at], self._ends[at]
        del self._starts[at], self._ends[at]
        for piece in ((end, run_end), (run_start, begin)):  # what stays mapped on either side
            if piece[1] > piece[0]:
                self._starts.insert(at, piece[0])
                self._ends.insert(at, piece[1])
        return self.base + begin * self.granule, (end - begin) * self.granule


class ExpandableBlocks:
    """The expandable-segment operations of ``TorchCachingAllocator``, on its blocks, pools and heap."""

    heap: HeapBuilder
    upstream: Upstream
    reserved: int
    peak_reserved: int
    time_ns: int
    _blocks: dict[int, Block]
    _expandable: list[ExpandableSegment]  # in the order reserved (= address order)
    _next_virtual: int

    if TYPE_CHECKING:  # the allocator's pool operations

        def _insert_free(self, address: int, block: Block) -> None: ...

        def _remove_free(self, address: int, block: Block) -> None: ...

    def _expandable_size(self, key: tuple[int, int, int]) -> int:
        """The bytes a free block (its pool key) can grow to: its own and, for an expandable
        block, the unmapped run right after it (``get_free_block``'s ``expandable_size``)."""
        _, size, address = key
        if not self._blocks[address].expandable:
            return size
        es = self._segment_of(address)
        return size + (es.unmapped_run(address + size) if address + size < es.end else 0)

    def _segment_of(self, address: int) -> ExpandableSegment:
        """The expandable segment whose virtual range holds ``address``."""
        return next(es for es in self._expandable if es.contains(address))

    def _free_block_before(self, address: int, es: ExpandableSegment) -> int | None:
        """Address of the free (mapped) block ending at ``address``, if there is one."""
        if address == es.base or not es.is_mapped(address - 1):
            return None
        found = self.heap.chunk_at(address - 1)
        assert found is not None
        return found[0] if self._blocks[found[0]].requested == 0 else None

    def _room_from(self, address: int, es: ExpandableSegment, size: int) -> bool:
        """Whether free blocks and unmapped runs from ``address`` on add up to ``size`` bytes."""
        room = 0
        while room < size and address < es.end:
            if es.is_mapped(address):
                block = self._blocks[address]
                if block.requested:
                    return False
                room += block.size
                address += block.size
            else:
                run = es.unmapped_run(address)
                room += run
                address += run
        return room >= size

    def _find_expandable_block(self, small: bool, stream: int, size: int) -> tuple[ExpandableSegment, int]:
        """``find_expandable_block``: the lowest unmapped run of the pool and stream (from the free
        block before it, if any) with room for ``size`` bytes; else a new virtual range."""
        for es in self._expandable:
            if es.small != small or es.stream != stream:
                continue
            for start in es.unmapped_starts():
                before = self._free_block_before(start, es)
                candidate = start if before is None else before
                if self._room_from(candidate, es, size):
                    return es, candidate
        granule = SMALL_BUFFER if small else LARGE_BUFFER
        es = ExpandableSegment(
            self._next_virtual, reservation_size(self.upstream.capacity, granule), granule, small=small, stream=stream
        )
        self._next_virtual += -(-(es.size + 1) // VIRTUAL_STRIDE) * VIRTUAL_STRIDE
        self._expandable.append(es)
        return es, es.base

    def _map_block(self, es: ExpandableSegment, address: int, size: int) -> bool:
        """``map_block``: map granules from the unmapped ``address`` for ``size`` bytes; the new
        free block joins the free blocks before and after it. False when the device is full."""
        mapped = es.map(self.upstream, address, size)
        if not mapped:
            return False
        before = self._free_block_before(address, es)
        self.heap.segment_map(self.time_ns, address, mapped)
        self.reserved += mapped
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        start, block = address, Block(mapped, es.base, es.small, es.stream, expandable=True)
        self._blocks[address] = block
        if before is not None:
            previous = self._blocks[before]
            self._remove_free(before, previous)
            previous.size += mapped
            del self._blocks[address]
            start, block = before, previous
        following = self._blocks.get(start + block.size)
        if following is not None and following.requested == 0 and following.expandable:
            self._remove_free(start + block.size, following)
            del self._blocks[start + block.size]
            block.size += following.size
        self._insert_free(start, block)
        return True

    def _allocate_expandable(self, small: bool, stream: int, size: int) -> int | None:
        """``try_allocate_expandable_block``: a free block of at least ``size`` bytes, out of its
        pool, mapping granules as needed; None when the device is full."""
        es, candidate = self._find_expandable_block(small, stream, size)
        if not es.is_mapped(candidate) and not self._map_block(es, candidate, min(es.unmapped_run(candidate), size)):
            return None
        while self._blocks[candidate].size < size:  # free -> unmapped -> ...: map more after it
            following = candidate + self._blocks[candidate].size
            remaining = size - self._blocks[candidate].size
            if not self._map_block(es, following, min(es.unmapped_run(following), remaining)):
                return None
        self._remove_free(candidate, self._blocks[candidate])
        return candidate

    def _unmap_block(self, address: int) -> int:
        """``unmap_block``: unmap the whole granules of the free expandable block at ``address``;
        what is left of it on either side stays a free block. Returns the bytes unmapped."""
        block = self._blocks[address]
        es = self._segment_of(address)
        start, unmapped = es.unmap(self.upstream, address, block.size)
        if not unmapped:
            return 0
        self._remove_free(address, block)
        del self._blocks[address]
        end = address + block.size
        for piece, piece_end in ((address, start), (start + unmapped, end)):
            if piece_end > piece:
                rest = Block(piece_end - piece, es.base, es.small, es.stream, expandable=True)
                self._blocks[piece] = rest
                self._insert_free(piece, rest)
        self.heap.segment_unmap(self.time_ns, start, unmapped)
        self.reserved -= unmapped
        if es.mapped_bytes == 0:  # release_expandable_segment: the virtual range is given back
            self._expandable.remove(es)
        return unmapped
