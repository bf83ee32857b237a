"""A model of PyTorch's CUDA caching allocator (``c10/cuda/CUDACachingAllocator.cpp``), for what-if replays.

Policy, as PyTorch's source defines it (sizes in bytes; the size rules are
``gpuviz.base.torch_rules``, shared with the importer of PyTorch snapshots):
    rounding     ``round_size``: < 512 -> 512; else to a multiple of 512, or with
                 ``roundup_power2_divisions`` d (> 1) and size > 512·d, up to the next of d
                 equal divisions between the powers of two around the size
    pools        a request of rounded size <= 1 MiB uses the small pool, else the large one
    segments     ``allocation_size``: <= 1 MiB -> 2 MiB; < 10 MiB -> 20 MiB; else rounded up
                 to a multiple of 2 MiB (one cudaMalloc each)
    best fit     the free block of the pool with the smallest (stream, size, address) >= the request
                 (``lower_bound``); an oversize block (>= max_split_size) is not used for a request
                 below max_split_size, nor for a larger request when it exceeds it by >= 20 MiB
    split        the block is handed out from its start; the rest stays free when it is
                 >= 512 B (small pool) or > 1 MiB and the request < max_split_size (large pool)
    free         the block joins its free neighbours of the same segment
    no block     garbage collection (only with a memory fraction and a threshold), cudaMalloc of a
                 new segment; on failure release oversize cached segments (with max_split_size),
                 then every wholly free segment, and retry; then out of memory
    limit        with ``memory_fraction`` f, reserved + new segment must stay <= f · capacity
    deferred     a block used on other streams (``record_stream``) is not reusable when freed:
                 PyTorch records an event on each of those streams and returns the block to its
                 pool once they complete (``complete_free``, at the trace's ``free_completed``) or
                 when it synchronizes them all, which ``release_cached_blocks`` (``empty_cache``,
                 and the last step before an out-of-memory error) does first

    expandable   ``expandable_segments``: no cudaMalloc; per (pool, stream) one virtual range
                 (``gpuviz.scenarios.torch_expandable``) into which granules of 2 MiB (small pool) /
                 20 MiB (large) are mapped at the lowest unmapped address where, together with
                 the free block before it, the request fits (``find_expandable_block``,
                 ``map_block``); blocks always split (remainder >= 512 B); a free block's whole
                 granules are unmapped when cached blocks are released (``unmap_block``), and a
                 range with nothing mapped is given back. Recorded as ``segment_map`` /
                 ``segment_unmap``: each contiguous mapped range is a segment.

Not modelled: CUDA graph private pools; expandable segments together with ``max_split_size``
(PyTorch's ``release_available_cached_blocks`` would ``release_block`` an expandable block,
an internal assertion, so the model refuses the combination). Expandable segments and
deferred frees have no real trace here (none of the snapshots has one): they are tested on
hand-computed cases.

Decisions are recorded through ``HeapBuilder`` (the model decides, the builder records), so the
log is an ordinary gpuviz log: ``replay(log).state_at(-1)`` is this allocator's heap.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from gpuviz.base.errors import InvalidFreeError, OutOfMemoryError
from gpuviz.base.heapstate import HeapState
from gpuviz.base.torch_rules import LARGE_BUFFER, NO_MAX_SPLIT, SMALL_BUFFER, SMALL_SIZE, CachingRules, allocation_size
from gpuviz.capture.upstream import Upstream
from gpuviz.log.eventlog import NO_INDEX, EventLog
from gpuviz.log.heapbuilder import HeapBuilder
from gpuviz.scenarios.torch_block import Block as _Block
from gpuviz.scenarios.torch_expandable import VIRTUAL_BASE, ExpandableBlocks, ExpandableSegment

__all__ = ["TorchCachingAllocator"]


class TorchCachingAllocator(ExpandableBlocks):
    """PyTorch's caching allocator for one device over ``upstream`` (the cudaMalloc of the model).

    Args:
        upstream: where segments come from; its ``capacity`` is the device's total memory.
        device: the device name recorded in events.
        log: the EventLog to record into (default: a new one).
        rules: the size rules and settings (``max_split_size``, ``roundup_power2_divisions``);
            default PyTorch's defaults (no limit, 512 B rounding).
        garbage_collection_threshold: fraction in (0, 1); needs ``memory_fraction`` as in PyTorch.
        memory_fraction: ``set_per_process_memory_fraction``: reserved bytes stay <= fraction · capacity.
    """

    def __init__(
        self,
        upstream: Upstream,
        *,
        device: str = "GPU:0",
        log: EventLog | None = None,
        rules: CachingRules | None = None,
        garbage_collection_threshold: float | None = None,
        memory_fraction: float | None = None,
    ) -> None:
        self.rules = rules if rules is not None else CachingRules()
        if self.rules.max_split_size <= LARGE_BUFFER:
            raise ValueError(f"max_split_size must be above 20 MiB as in PyTorch, got {self.rules.max_split_size}")
        if self.rules.expandable and self.rules.max_split_size != NO_MAX_SPLIT:
            raise ValueError("expandable segments with max_split_size are not modelled (see the module docstring)")
        if garbage_collection_threshold is not None and not 0 < garbage_collection_threshold < 1:
            raise ValueError(f"garbage_collection_threshold must be in (0, 1), got {garbage_collection_threshold}")
        if memory_fraction is not None and not 0 < memory_fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
        self.upstream = upstream
        self.max_split_size = self.rules.max_split_size
        self.gc_threshold = garbage_collection_threshold or 0.0
        self.allowed = None if memory_fraction is None else int(memory_fraction * upstream.capacity)
        options = {
            "policy": "torch-caching",
            "max_split_size": None if self.max_split_size == NO_MAX_SPLIT else self.max_split_size,
            "roundup_power2_divisions": list(self.rules.divisions),
            "garbage_collection_threshold": garbage_collection_threshold,
            "memory_fraction": memory_fraction,
            "memory_limit": upstream.capacity if self.allowed is None else self.allowed,
        }
        if self.rules.expandable:
            options["expandable_segments"] = True
        self.log = log if log is not None else EventLog()
        self.device = device
        self.heap = HeapBuilder(self.log, self.log.add_device(device, **options))
        self._blocks: dict[int, _Block] = {}  # every block (free or in use) by address
        # free blocks per pool as sorted (stream, size, address) keys: std::set with BlockComparatorSize
        self._pools: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        self._calls = {True: 0, False: 0}  # get_free_block calls per pool (GC ages)
        self.reserved = 0  # total_allocated_memory
        self.peak_reserved = 0
        self.in_use = 0
        self.time_ns = 0  # time stamp of the next events (set by the driver)
        # deferred frees: address -> the caller's key, in the order they were freed (cuda_events)
        self._pending: dict[int, object] = {}
        self._synchronized: set[object] = set()  # keys of deferred frees completed by synchronizing
        self._expandable: list[ExpandableSegment] = []  # in the order reserved (= address order)
        self._next_virtual = VIRTUAL_BASE

    # ------------------------------------------------------------------ seeding
    def seed(self, state: HeapState, *, streams: dict[int, int] | None = None) -> None:
        """Start from ``state`` (segments and live blocks when recording began). A 2 MiB segment
        is a small-pool segment (only small requests get one); any other is large."""
        if self._blocks:
            raise RuntimeError("seed() must come before any allocation")
        for segment in state.segments:
            self.upstream_reserved(segment.base, segment.size)
            small = segment.size == SMALL_BUFFER
            for chunk in segment.chunks:
                stream = (streams or {}).get(chunk.address, 0)
                block = _Block(chunk.size, segment.base, small, stream)
                self._blocks[chunk.address] = block
                if chunk.in_use:
                    self.heap.alloc(self.time_ns, chunk.address, chunk.size, chunk.requested)
                    block.requested = max(chunk.requested, 1)
                    self.in_use += chunk.size
                else:
                    self._insert_free(chunk.address, block)

    def upstream_reserved(self, base: int, size: int) -> None:
        """Record a segment that exists already (seeding)."""
        self.heap.segment_alloc(self.time_ns, base, size)
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    # ------------------------------------------------------------------ pools
    def _insert_free(self, address: int, block: _Block) -> None:
        block.requested = 0
        block.age = self._calls[block.small]
        insort(self._pools[block.small], (block.stream, block.size, address))

    def _remove_free(self, address: int, block: _Block) -> None:
        pool = self._pools[block.small]
        pool.pop(bisect_left(pool, (block.stream, block.size, address)))

    def _get_free_block(self, small: bool, stream: int, size: int) -> int | None:
        if self.allowed is not None and self.gc_threshold > 0:
            self._calls[small] += 1
        pool = self._pools[small]
        i = bisect_left(pool, (stream, size, -1))
        if i == len(pool) or pool[i][0] != stream:
            return None
        # an expandable block counts as the size it can grow to (its free block plus the unmapped
        # run after it); a later block that can grow less is the better fit
        while (
            self._blocks[pool[i][2]].expandable
            and i + 1 < len(pool)
            and pool[i + 1][0] == stream
            and self._expandable_size(pool[i + 1]) < self._expandable_size(pool[i])
        ):
            i += 1
        _, block_size, address = pool[i]
        if size < self.max_split_size and block_size >= self.max_split_size:
            return None
        if size >= self.max_split_size and block_size >= size + LARGE_BUFFER:
            return None
        pool.pop(i)
        return address

    def _is_split(self, address: int) -> bool:
        block = self._blocks[address]
        return not (address == block.segment and block.size == self.heap.segments[block.segment])

    # --------------------------------------------------------------- segments
    def _alloc_block(self, small: bool, stream: int, alloc_size: int, size: int) -> int | None:
        if self.allowed is not None and self.reserved + alloc_size > self.allowed:
            return None
        if self.rules.expandable:
            return self._allocate_expandable(small, stream, size)
        try:
            base = self.upstream.allocate(alloc_size)
        except MemoryError:
            return None
        self.heap.segment_alloc(self.time_ns, base, alloc_size)
        self.reserved += alloc_size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self._blocks[base] = _Block(alloc_size, base, small, stream)
        return base

    def _release_block(self, address: int) -> None:
        """cudaFree a wholly free segment (the block is already out of its pool)."""
        block = self._blocks.pop(address)
        self.heap.segment_free(self.time_ns, address)
        self.upstream.free(address)
        self.reserved -= block.size

    def _release_available_cached_blocks(self, stream: int, size: int) -> bool:
        if self.max_split_size == NO_MAX_SPLIT:
            return False
        pool = self._pools[False] if size > SMALL_SIZE else self._pools[True]
        key_size = max(size, self.max_split_size)
        i = bisect_left(pool, (stream, key_size, -1))
        if i == len(pool) or pool[i][0] != stream:
            if i == 0:
                return False
            released = 0
            i -= 1  # the largest block of this stream
            while released < key_size and i >= 0 and pool[i][1] >= self.max_split_size and pool[i][0] == stream:
                _, block_size, address = pool.pop(i)
                released += block_size
                self._release_block(address)
                i -= 1
            return released >= key_size
        _, _, address = pool.pop(i)
        self._release_block(address)
        return True

    def synchronize_and_free_events(self) -> int:
        """Complete every deferred free (waiting on other streams' work), in the order they were
        freed; returns how many. ``complete_free`` of one of them afterwards is a no-op."""
        pending = list(self._pending.items())
        self._pending.clear()
        for address, key in pending:
            self._synchronized.add(key)
            self._free_block(address, self._blocks[address])
        return len(pending)

    def release_cached_blocks(self) -> int:
        """``torch.cuda.empty_cache()``: complete deferred frees, then release every wholly free
        segment; returns bytes released."""
        self.synchronize_and_free_events()
        released = 0
        for small in (False, True):  # release_blocks(large_blocks), then small_blocks
            pool = self._pools[small]
            keep = []
            to_unmap = []
            for key in pool:
                address = key[2]
                if self._blocks[address].expandable:
                    keep.append(key)
                    to_unmap.append(address)
                elif self._is_split(address):
                    keep.append(key)
                else:
                    released += self._blocks[address].size
                    self._release_block(address)
            self._pools[small] = keep
            for address in to_unmap:  # then unmap the whole granules of expandable free blocks
                released += self._unmap_block(address)
        return released

    def _garbage_collect(self) -> None:
        assert self.allowed is not None
        threshold = int(self.gc_threshold * self.allowed)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        pool = self._pools[False]

        def age(key: tuple[int, int, int]) -> int:
            return self._calls[False] - self._blocks[key[2]].age

        # (a free block of an expandable segment is never released whole: PyTorch counts it split)
        freeable = [key for key in pool if not self._blocks[key[2]].expandable and not self._is_split(key[2])]
        if not freeable:
            return
        total_age = sum(age(key) for key in freeable)
        count = len(freeable)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            threshold_age = total_age / count
            freed = False
            for key in list(self._pools[False]):
                if not self._blocks[key[2]].expandable and not self._is_split(key[2]) and age(key) >= threshold_age:
                    freed = True
                    reclaimed += key[1]
                    total_age -= age(key)
                    count -= 1
                    self._pools[False].remove(key)
                    self._release_block(key[2])

    # ------------------------------------------------------------------ public
    def allocate(self, nbytes: int, *, stream: int = 0, tag: int = NO_INDEX, stack: int = NO_INDEX) -> int:
        """Allocate ``nbytes`` on ``stream``; returns the block's address. ``OutOfMemoryError`` when even
        releasing every cached segment does not make room (one ``oom`` event is recorded)."""
        size = self.rules.round_size(nbytes)
        small = self.rules.is_small(size)
        alloc_size = allocation_size(size)
        address = self._get_free_block(small, stream, size)
        if address is None:
            if self.allowed is not None and self.gc_threshold > 0:
                self._garbage_collect()
            address = self._alloc_block(small, stream, alloc_size, size)
            if address is None and self._release_available_cached_blocks(stream, size):
                address = self._alloc_block(small, stream, alloc_size, size)
            if address is None:
                self.release_cached_blocks()
                address = self._alloc_block(small, stream, alloc_size, size)
            if address is None:
                self.heap.oom(self.time_ns, nbytes, size, tag=tag, stack=stack)
                free = self.reserved - self.in_use
                largest = max((key[1] for pool in self._pools.values() for key in pool), default=0)
                reservable = max(0, (self.allowed or self.upstream.capacity) - self.reserved)
                raise OutOfMemoryError(
                    requested=nbytes, rounded=size, free=free, largest_free_chunk=largest, reservable=reservable,
                    limit=self.allowed or self.upstream.capacity, device=self.device,
                )  # fmt: skip
        block = self._blocks[address]
        remaining = block.size - size
        if self.rules.should_split(block.size, size):
            rest = _Block(remaining, block.segment, block.small, stream, expandable=block.expandable)
            self._blocks[address + size] = rest
            self._insert_free(address + size, rest)
            block.size = size
        block.requested = max(nbytes, 1)
        block.stream = stream
        self.heap.alloc(self.time_ns, address, block.size, nbytes, tag=tag, stack=stack)
        self.in_use += block.size
        return address

    def free(self, address: int, *, deferred: bool = False, key: object = None) -> None:
        """Return the block at ``address``; it joins its free neighbours (previous, then next).

        ``deferred``: the block was used on other streams, so it stays out of the pool until
        ``complete_free(address)`` (or a synchronization: ``synchronize_and_free_events``);
        ``key`` names this free for ``complete_free`` (default: the address).
        """
        block = self._blocks.get(address)
        if block is None or block.requested == 0:
            raise InvalidFreeError(f"{address:#x} is not a live allocation of this allocator")
        if address in self._pending:
            raise InvalidFreeError(f"{address:#x} was already freed; its free waits on other streams")
        if deferred:
            self._pending[address] = address if key is None else key
            return
        self._free_block(address, block)

    def complete_free(self, address: int, *, key: object = None) -> bool:
        """The other streams' work on a deferred free's block is done: return it to its pool.
        False (nothing done) when a synchronization already completed that free."""
        key = address if key is None else key
        if key in self._synchronized:
            self._synchronized.discard(key)
            return False
        if self._pending.get(address, self) != key:
            raise InvalidFreeError(f"{address:#x} has no deferred free waiting to complete")
        del self._pending[address]
        self._free_block(address, self._blocks[address])
        return True

    def _free_block(self, address: int, block: _Block) -> None:
        self.in_use -= block.size
        self.heap.free(self.time_ns, address)
        start = address
        previous = self.heap.chunk_at(address - 1) if address > block.segment else None
        if previous is not None:
            p_block = self._blocks[previous[0]]
            if p_block.requested == 0:
                self._remove_free(previous[0], p_block)
                p_block.size += block.size
                del self._blocks[address]
                start, block = previous[0], p_block
        end = start + block.size
        following = self._blocks.get(end)
        if following is not None and following.requested == 0 and following.segment == block.segment:
            self._remove_free(end, following)
            block.size += following.size
            del self._blocks[end]
        self._insert_free(start, block)

    def empty_cache(self) -> int:
        """Alias of ``release_cached_blocks`` (PyTorch's name)."""
        return self.release_cached_blocks()

    def state(self) -> HeapState:
        return self.heap.state()

    def check(self) -> None:
        """Raise ``InvariantError`` when the model and its recorded heap disagree or break an invariant."""
        from gpuviz.base.errors import InvariantError

        self.heap.check()
        recorded = {c.address: (c.size, c.in_use) for c in self.heap.state().chunks()}
        modelled = {a: (b.size, b.requested > 0) for a, b in self._blocks.items()}
        if recorded != modelled:
            raise InvariantError("the model's blocks and the recorded heap differ")
        free_keys = sorted((b.stream, b.size, a) for a, b in self._blocks.items() if b.requested == 0)
        if free_keys != sorted(self._pools[True] + self._pools[False]):
            raise InvariantError("free blocks and pools differ")
        if self.reserved != sum(self.heap.segments.values()):
            raise InvariantError("reserved bytes differ from the segments")
        if any(self._blocks.get(a) is None or self._blocks[a].requested == 0 for a in self._pending):
            raise InvariantError("a deferred free waits on a block that is not in use")
