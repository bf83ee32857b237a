"""Two more what-if policies: RMM's pool (coalescing best fit) and no pool at all.

``RmmPoolAllocator`` follows RMM's ``pool_memory_resource`` (sizes in bytes):
    rounding     requests are aligned up to 256 B
    best fit     the smallest free block that fits, lowest address on ties
                 (``coalescing_free_list::get_block`` over an address-ordered list)
    split        always: the request is cut from the block's start, any rest stays free
    free         the block coalesces with free neighbours of the same upstream allocation
    growth       with no free block, the pool grows by ``max(size, pool size)``, or with a
                 maximum by ``max(size, remaining / 2)`` when the request fits under it; a
                 failed growth halves the attempt down to the request before giving up
    never        releases memory upstream while running

``NoPoolAllocator`` is what ``cudaMalloc``/``cudaFree`` per tensor would do: each allocation is its
own segment of the request aligned to 256 B, released on free — the lower bound of reserved bytes.

Both record through ``HeapBuilder``, so their logs are ordinary gpuviz logs.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from gpuviz.base.errors import InvalidFreeError, OutOfMemoryError
from gpuviz.base.heapstate import HeapState
from gpuviz.capture.upstream import Upstream
from gpuviz.log.eventlog import NO_INDEX, EventLog
from gpuviz.log.heapbuilder import HeapBuilder

__all__ = ["RmmPoolAllocator", "NoPoolAllocator", "ALIGNMENT"]

ALIGNMENT = 256  # rmm::CUDA_ALLOCATION_ALIGNMENT, and cudaMalloc's address alignment


def _align(size: int) -> int:
    return max(ALIGNMENT, (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT)


class _Recorded:
    """What both policies share: a heap recorder, in-use and reserved counters."""

    def __init__(self, upstream: Upstream, device: str, log: EventLog | None, options: dict[str, object]) -> None:
        self.upstream = upstream
        self.device = device
        self.log = log if log is not None else EventLog()
        options = {**options, "memory_limit": upstream.capacity}
        self.heap = HeapBuilder(self.log, self.log.add_device(device, **options))
        self.reserved = 0
        self.peak_reserved = 0
        self.in_use = 0
        self.time_ns = 0

    def _reserve(self, nbytes: int) -> int | None:
        try:
            base = self.upstream.allocate(nbytes)
        except MemoryError:
            return None
        self.heap.segment_alloc(self.time_ns, base, nbytes)
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return base

    def _oom(self, nbytes: int, rounded: int, largest: int, tag: int, stack: int) -> OutOfMemoryError:
        self.heap.oom(self.time_ns, nbytes, rounded, tag=tag, stack=stack)
        capacity = self.upstream.capacity
        return OutOfMemoryError(
            requested=nbytes, rounded=rounded, free=self.reserved - self.in_use, largest_free_chunk=largest,
            reservable=max(0, capacity - self.reserved), limit=capacity, device=self.device,
        )  # fmt: skip

    def state(self) -> HeapState:
        return self.heap.state()

    def check(self) -> None:
        self.heap.check()


class RmmPoolAllocator(_Recorded):
    """RMM's pool memory resource over ``upstream`` (one device, one stream)."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        initial_pool_size: int = 0,
        maximum_pool_size: int | None = None,
        device: str = "GPU:0",
        log: EventLog | None = None,
    ) -> None:
        if initial_pool_size < 0 or (maximum_pool_size is not None and maximum_pool_size < initial_pool_size):
            raise ValueError("need 0 <= initial_pool_size <= maximum_pool_size")
        options = {"policy": "rmm-pool", "initial_pool_size": initial_pool_size, "maximum_pool_size": maximum_pool_size}
        super().__init__(upstream, device, log, options)
        self.maximum = maximum_pool_size
        self._free: list[tuple[int, int]] = []  # (size, address) of free blocks: best fit, lowest address
        self._live: dict[int, int] = {}  # address -> block size
        self._sizes: dict[int, int] = {}  # free block address -> size
        self._segment_of: dict[int, int] = {}  # block address -> the upstream allocation it belongs to
        if initial_pool_size:
            base = self._reserve(_align(initial_pool_size))
            if base is None:
                raise MemoryError(f"the initial pool of {initial_pool_size} bytes does not fit the device")
            self._add_free(base, _align(initial_pool_size), base)

    def _add_free(self, address: int, size: int, segment: int) -> None:
        insort(self._free, (size, address))
        self._sizes[address] = size
        self._segment_of[address] = segment

    def _take_free(self, address: int) -> int:
        size = self._sizes.pop(address)
        self._free.pop(bisect_left(self._free, (size, address)))
        return size

    def _size_to_grow(self, size: int) -> int:
        if self.maximum is not None:
            remaining = _align(self.maximum - self.reserved) if self.maximum > self.reserved else 0
            return max(size, remaining // 2) if size <= remaining else 0
        return max(size, self.reserved)

    def _expand(self, size: int) -> int | None:
        attempt = self._size_to_grow(size)
        while attempt >= size:
            base = self._reserve(attempt)
            if base is not None:
                self._add_free(base, attempt, base)
                return base
            attempt //= 2
        return None

    def allocate(self, nbytes: int, *, tag: int = NO_INDEX, stack: int = NO_INDEX) -> int:
        size = _align(nbytes)
        i = bisect_left(self._free, (size, -1))
        if i == len(self._free):
            if self._expand(size) is None:
                raise self._oom(nbytes, size, self._free[-1][0] if self._free else 0, tag, stack)
            i = bisect_left(self._free, (size, -1))
        block_size, address = self._free[i]
        self._take_free(address)
        segment = self._segment_of.pop(address)
        if block_size > size:
            self._add_free(address + size, block_size - size, segment)
        self._live[address] = size
        self._segment_of[address] = segment
        self.heap.alloc(self.time_ns, address, size, nbytes, tag=tag, stack=stack)
        self.in_use += size
        return address

    def free(self, address: int) -> None:
        size = self._live.pop(address, None)
        if size is None:
            raise InvalidFreeError(f"{address:#x} is not a live allocation of this pool")
        self.in_use -= size
        self.heap.free(self.time_ns, address)
        segment = self._segment_of.pop(address)
        start, total = address, size
        previous = self.heap.chunk_at(address - 1) if address > segment else None
        if previous is not None and previous[0] in self._sizes:
            start = previous[0]
            total += self._take_free(start)
            self._segment_of.pop(start)
        following = address + size
        if following in self._sizes and self._segment_of.get(following) == segment:
            total += self._take_free(following)
            self._segment_of.pop(following)
        self._add_free(start, total, segment)


class NoPoolAllocator(_Recorded):
    """Every allocation its own device allocation (aligned to 256 B), returned at once on free."""

    def __init__(self, upstream: Upstream, *, device: str = "GPU:0", log: EventLog | None = None) -> None:
        super().__init__(upstream, device, log, {"policy": "no-pool"})
        self._live: dict[int, int] = {}

    def allocate(self, nbytes: int, *, tag: int = NO_INDEX, stack: int = NO_INDEX) -> int:
        size = _align(nbytes)
        base = self._reserve(size)
        if base is None:
            raise self._oom(nbytes, size, 0, tag, stack)
        self.heap.alloc(self.time_ns, base, size, nbytes, tag=tag, stack=stack)
        self._live[base] = size
        self.in_use += size
        return base

    def free(self, address: int) -> None:
        size = self._live.pop(address, None)
        if size is None:
            raise InvalidFreeError(f"{address:#x} is not a live allocation")
        self.in_use -= size
        self.heap.free(self.time_ns, address)
        self.heap.segment_free(self.time_ns, address)
        self.upstream.free(address)
        self.reserved -= size
