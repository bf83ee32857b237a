"""The instrumented best-fit-with-coalescing (BFC) allocator, with TensorFlow's semantics:
``ReferenceBFCAllocator``, the executable reference in Python.

Which code runs: by default it does NOT run. ``gpuviz.BFCAllocator`` (and every framework
integration and what-if replay) uses ``NativeBFCAllocator`` (``gpuviz/capture/native.py``), a
subclass of this one whose heap and hot path are C (``csrc/capture/_bfcnative.c`` over the core
``csrc/capture/_bfc_core.c``), wherever that was built. This class runs where it was not (no C
compiler at install), with ``GPUVIZ_NATIVE=0``, or when asked for by name; tests hold the two
equal operation by operation (``tests/test_bfc_native.py``).

One statement of the policy, shared by both:
    the rules       ``gpuviz.capture.bfc_rules`` (rounding, bins, split, growth, back-off, limit,
                    garbage collection; the C core's are ``csrc/capture/_bfc_rules.h``, held
                    equal by ``tests/test_bfc_rules.py``)
    the pool        ``gpuviz.capture.bfc_pool.SegmentPool`` (growth, limit, garbage collection,
                    release), on this class's or the native core's heap
    inspection      ``gpuviz.capture.bfc_inspect.HeapInspection`` (stats, state, bins,
                    record_into, check)
This module holds the heap in Python (``gpuviz.capture.chunks``) and its hot paths: best fit
(the smallest free chunk >= the rounded size, lowest address on ties), split, and coalescing on
free (with the next free neighbour, then the previous one).

Every decision is reported to an observer (``Recorder`` writes it to the EventLog).
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left, insort

from gpuviz.base.errors import InvalidFreeError
from gpuviz.base.units import parse_bytes
from gpuviz.capture.arguments import address_argument, allocation_size, tag_argument
from gpuviz.capture.bfc_inspect import AllocatorStats, ChunkTuple, HeapInspection
from gpuviz.capture.bfc_pool import SegmentPool
from gpuviz.capture.bfc_rules import (
    INITIAL_SEGMENT_BYTES,
    MAX_INTERNAL_FRAGMENTATION,
    first_segment_bytes,
    rounded_bytes,
    should_split,
)
from gpuviz.capture.chunks import _MASK, _SHIFT, Chunk, FreeIndex, Segment
from gpuviz.capture.recorder import NullRecorder, Observer, Recorder
from gpuviz.capture.upstream import Upstream
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind

__all__ = ["ReferenceBFCAllocator", "AllocatorStats", "INITIAL_SEGMENT_BYTES", "MAX_INTERNAL_FRAGMENTATION"]

logger = logging.getLogger("gpuviz")

_SEGMENT_ALLOC = int(Kind.SEGMENT_ALLOC)
_SEGMENT_FREE = int(Kind.SEGMENT_FREE)
_ALLOC = int(Kind.ALLOC)
_FREE = int(Kind.FREE)
_SPLIT = int(Kind.SPLIT)
_MERGE = int(Kind.MERGE)


class ReferenceBFCAllocator(SegmentPool, HeapInspection):
    """A best-fit-with-coalescing allocator over one device's upstream.

    Args:
        upstream: where segments come from (``SimUpstream``, the CuPy upstream, ...).
        memory_limit: cap on the total reserved (pool) bytes, an int or e.g. ``"4GiB"``;
            default: the upstream's capacity.
        memory_fraction: instead of ``memory_limit``, a fraction in (0, 1] of the capacity.
        growth: reserve segments as needed (2 MiB, doubling); False reserves the whole limit
            as one segment at the first allocation.
        garbage_collection: on OOM, return wholly free segments upstream and retry.
        device: the device name recorded in events, e.g. ``"GPU:0"``.
        log: the EventLog to record into; default a new one.
        record: False records nothing (the log stays empty).
        stacks: record the caller's Python stack with each event.
        stack_skip: path prefixes of frames left out of stacks besides gpuviz's own (e.g. the
            array library's), so a stack starts at the user's call site.
    """

    def __init__(
        self,
        upstream: Upstream,
        *,
        memory_limit: int | str | None = None,
        memory_fraction: float | None = None,
        growth: bool = True,
        garbage_collection: bool = False,
        device: str = "GPU:0",
        log: EventLog | None = None,
        record: bool = True,
        stacks: bool = False,
        stack_skip: tuple[str, ...] = (),
    ) -> None:
        capacity = upstream.capacity
        if memory_limit is not None and memory_fraction is not None:
            raise ValueError("give memory_limit or memory_fraction, not both")
        if memory_fraction is not None:
            if isinstance(memory_fraction, bool) or not 0 < memory_fraction <= 1:
                raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")
            limit = int(capacity * memory_fraction)
        elif memory_limit is not None:
            limit = parse_bytes(memory_limit, name="memory_limit")
        else:
            limit = capacity
        if limit > capacity:
            raise ValueError(f"memory_limit {limit} bytes exceeds the device capacity of {capacity} bytes")
        if limit < 256:
            raise ValueError(f"memory_limit must be at least 256 bytes, got {limit}")
        self.upstream = upstream
        self.device = device
        self.memory_limit = limit
        self.growth = growth
        self.garbage_collection = garbage_collection
        self.log = log if log is not None else EventLog()
        device_index = self.log.add_device(
            device,
            allocator="bfc",
            upstream=type(upstream).__name__,
            capacity=capacity,
            memory_limit=limit,
            growth=growth,
            garbage_collection=garbage_collection,
        )
        self._stack_skip = stack_skip
        self._observer: Observer = (
            Recorder(self.log, device_index, stacks=stacks, skip=stack_skip) if record else NullRecorder()
        )
        self._lock = threading.RLock()
        self._locked = self._lock
        self._busy = False
        self._pending: list[int] = []
        self._chunks: dict[int, Chunk] = {}
        self._segments: dict[int, Segment] = {}
        self._free = FreeIndex()
        self._keys = self._free.keys  # the same list, for the inlined hot paths
        self._next_segment_bytes = first_segment_bytes(growth, limit)
        self._num_allocs = 0
        self._bytes_in_use = 0
        self._peak_bytes_in_use = 0
        self._largest_alloc_size = 0
        self._pool_bytes = 0
        self._peak_pool_bytes = 0

    # ------------------------------------------------------------------ allocate
    def allocate(self, nbytes: int, *, tag: str | None = None) -> int:
        """Allocate ``nbytes`` bytes and return the chunk's address (0 for a 0-byte request).

        Raises ``OutOfMemoryError`` when the request cannot be met under the memory limit
        (any size, however large: ``2**63`` is an OOM, not an overflow),
        ``TypeError``/``ValueError`` for a size that is not a non-negative integer. Arguments
        are checked before anything changes (``gpuviz.capture.arguments``).
        """
        if type(nbytes) is not int or nbytes <= 0:
            nbytes = allocation_size(nbytes)
            if nbytes == 0:
                tag_argument(tag)
                return 0
        if tag is not None:
            tag_argument(tag)
        rounded = rounded_bytes(nbytes)
        with self._lock:
            if self._busy:
                raise RuntimeError("re-entrant allocate from inside the allocator (a finalizer allocating memory)")
            self._busy = True
            try:
                return self._allocate_locked(nbytes, rounded, tag)
            finally:
                if self._pending:
                    self._drain_pending()
                self._busy = False

    def _allocate_locked(self, nbytes: int, rounded: int, tag: str | None) -> int:
        # The hot path: FreeIndex operations are inlined on its key list (see chunks.py).
        observer = self._observer
        stack = observer.stack_id() if observer.stacks else -1
        keys = self._keys
        i = bisect_left(keys, rounded << _SHIFT)
        address = keys.pop(i) & _MASK if i < len(keys) else self._grow_and_take(nbytes, rounded, stack)
        chunk = self._chunks[address]
        emit = observer.emit
        size = chunk.size
        segment_base = chunk.segment.base
        if should_split(size, rounded):
            remainder = Chunk(address + rounded, size - rounded, chunk.segment)
            following = chunk.next
            remainder.prev = chunk
            remainder.next = following
            if following is not None:
                following.prev = remainder
            chunk.next = remainder
            chunk.size = size = rounded
            self._chunks[address + rounded] = remainder
            insort(keys, remainder.size << _SHIFT | remainder.address)
            # as replay sees it, the part split off stays free until the alloc event
            largest = keys[-1] >> _SHIFT
            emit(_SPLIT, address, rounded, 0, segment_base, rounded if rounded > largest else largest, -1, stack)
        tag_id = -1 if tag is None else observer.tag_id(tag)
        chunk.in_use = True
        chunk.requested = nbytes
        chunk.tag = tag
        chunk.tag_id = tag_id
        self._num_allocs += 1
        in_use = self._bytes_in_use = self._bytes_in_use + size
        if in_use > self._peak_bytes_in_use:
            self._peak_bytes_in_use = in_use
        if size > self._largest_alloc_size:
            self._largest_alloc_size = size
        emit(_ALLOC, address, size, nbytes, segment_base, keys[-1] >> _SHIFT if keys else 0, tag_id, stack)
        return address

    def _grow_and_take(self, nbytes: int, rounded: int, stack: int) -> int:
        """Reserve a new segment (after GC if allowed, ``SegmentPool._grow``) and take the best
        fit, or raise OOM."""
        if not self._grow(rounded, stack):
            raise self._out_of_memory(nbytes, rounded, stack)
        address = self._free.take_best_fit(rounded)
        if address is None:
            raise RuntimeError("gpuviz: the pool grew but holds no chunk for the request")
        return address

    # ---------------------------------------------------------------------- free
    def free(self, address: int) -> None:
        """Return the chunk at ``address``; coalesce it with free neighbours.

        ``free(0)`` is a no-op. Raises ``TypeError`` for an address that is not an integer
        and ``InvalidFreeError`` for one that is not a live allocation (the allocator is left
        unchanged either way). A free that arrives while this thread is inside the allocator
        (a finalizer run by the garbage collector) is deferred to the end of the running
        operation.
        """
        if type(address) is not int:
            address = address_argument(address)
        if address == 0:
            return
        with self._lock:
            if self._busy:
                self._pending.append(address)
                return
            self._busy = True
            try:
                self._free_locked(address)
            finally:
                if self._pending:
                    self._drain_pending()
                self._busy = False

    def _drain_pending(self) -> None:
        pending = self._pending
        while pending:
            address = pending.pop()
            try:
                self._free_locked(address)
            except InvalidFreeError:
                logger.exception("%s: a deferred free failed", self.device)

    def _free_locked(self, address: int) -> None:
        # The hot path: FreeIndex operations are inlined on its key list (see chunks.py).
        chunk = self._chunks.get(address)
        if chunk is None or not chunk.in_use:
            raise InvalidFreeError(self._explain_bad_free(address, chunk))
        observer = self._observer
        stack = observer.stack_id() if observer.stacks else -1
        emit = observer.emit
        keys = self._keys
        chunks = self._chunks
        size = chunk.size
        segment_base = chunk.segment.base
        self._bytes_in_use -= size
        chunk.in_use = False
        requested = chunk.requested
        tag_id = chunk.tag_id
        chunk.requested = 0
        chunk.tag = None
        chunk.tag_id = -1
        largest = keys[-1] >> _SHIFT if keys else 0
        emit(_FREE, address, size, requested, segment_base, size if size > largest else largest, tag_id, stack)
        following = chunk.next
        if following is not None and not following.in_use:
            key = following.size << _SHIFT | following.address
            del keys[bisect_left(keys, key)]
            size = chunk.size = size + following.size
            chunk.next = after = following.next
            if after is not None:
                after.prev = chunk
            del chunks[following.address]
            largest = keys[-1] >> _SHIFT if keys else 0
            emit(_MERGE, address, size, 0, segment_base, size if size > largest else largest, -1, stack)
        previous = chunk.prev
        if previous is not None and not previous.in_use:
            key = previous.size << _SHIFT | previous.address
            del keys[bisect_left(keys, key)]
            size = previous.size = previous.size + size
            previous.next = after = chunk.next
            if after is not None:
                after.prev = previous
            del chunks[address]
            chunk = previous
            largest = keys[-1] >> _SHIFT if keys else 0
            emit(_MERGE, chunk.address, size, 0, segment_base, size if size > largest else largest, -1, stack)
        insort(keys, size << _SHIFT | chunk.address)

    def _explain_bad_free(self, address: int, chunk: Chunk | None) -> str:
        where = f"{self.device}: cannot free {address:#x}"
        if chunk is not None:
            return f"{where}: it is not allocated (freed twice?)"
        for other in self._chunks.values():
            if other.address < address < other.address + other.size:
                return f"{where}: it points inside the chunk at {other.address:#x}, not to its start"
        return f"{where}: this allocator never allocated it"

    # -------------------------------------------------------------- primitives
    # the heap as SegmentPool and HeapInspection see it
    def _pool_bytes_now(self) -> int:
        return self._pool_bytes

    def _in_use_now(self) -> int:
        return self._bytes_in_use

    def _largest_free(self) -> int:
        return self._free.largest()

    def _segment_list(self) -> list[tuple[int, int, bool]]:
        return [(base, segment.size, self._is_wholly_free(segment)) for base, segment in self._segments.items()]

    def _is_wholly_free(self, segment: Segment) -> bool:
        chunk = self._chunks[segment.base]
        return not chunk.in_use and chunk.size == segment.size

    def _add_segment(self, base: int, size: int, stack: int) -> None:
        segment = Segment(base, size)
        self._segments[base] = segment
        self._pool_bytes += size
        if self._pool_bytes > self._peak_pool_bytes:
            self._peak_pool_bytes = self._pool_bytes
        chunk = Chunk(base, size, segment)
        self._chunks[base] = chunk
        self._free.insert(chunk)
        self._observer.emit(_SEGMENT_ALLOC, base, size, 0, base, self._free.largest(), -1, stack)

    def _drop_segment(self, base: int, stack: int) -> None:
        segment = self._segments.pop(base)
        self._free.remove(self._chunks.pop(base))
        self._pool_bytes -= segment.size
        self._observer.emit(_SEGMENT_FREE, base, segment.size, 0, base, self._free.largest(), -1, stack)

    def _emit(self, kind: int, address: int, size: int, requested: int, segment: int, largest: int, tag: int,
              stack: int) -> None:  # fmt: skip
        self._observer.emit(kind, address, size, requested, segment, largest, tag, stack)

    def _counters(self) -> tuple[int, int, int, int, int, int, int]:
        return (self._num_allocs, self._bytes_in_use, self._peak_bytes_in_use, self._largest_alloc_size,
                self._pool_bytes, self._peak_pool_bytes, self._free.largest())  # fmt: skip

    @staticmethod
    def _tuple(chunk: Chunk) -> ChunkTuple:
        return chunk.address, chunk.size, chunk.requested, chunk.in_use, chunk.tag, chunk.tag_id

    def _lookup(self, address: int) -> ChunkTuple | None:
        chunk = self._chunks.get(address)
        return None if chunk is None else self._tuple(chunk)

    def _segment_chunks(self) -> list[tuple[int, int, list[ChunkTuple]]]:
        result = []
        for base in sorted(self._segments):
            chunks: list[ChunkTuple] = []
            chunk: Chunk | None = self._chunks[base]
            while chunk is not None:
                chunks.append(self._tuple(chunk))
                chunk = chunk.next
            result.append((base, self._segments[base].size, chunks))
        return result

    def _free_entries(self) -> list[tuple[int, int]]:
        return self._free.entries()

    def _set_tag_id(self, address: int, tag_id: int) -> None:
        self._chunks[address].tag_id = tag_id

    def _attach(self, observer: Observer) -> None:
        self._observer = observer

    def _check_links(self) -> str | None:
        """The Python heap's own structures: chunk links, registration by address, the free
        index's order, deferred frees (the rest is ``HeapInspection.check``'s)."""
        seen = 0
        for base, segment in self._segments.items():
            chunk = self._chunks.get(base)
            if chunk is None or chunk.prev is not None:
                return f"segment {base:#x} does not start with a chunk"
            previous: Chunk | None = None
            while chunk is not None:
                seen += 1
                if chunk.segment is not segment or chunk.prev is not previous:
                    return f"chunk list of segment {base:#x} is broken at {chunk.address:#x}"
                if self._chunks.get(chunk.address) is not chunk:
                    return f"chunk {chunk.address:#x} is not registered by its address"
                previous, chunk = chunk, chunk.next
        if seen != len(self._chunks):
            return f"{len(self._chunks) - seen} registered chunks belong to no segment"
        keys = self._free.keys
        if keys != sorted(set(keys)):
            return "the free index (bins) is out of order or holds a chunk twice"
        if self._pending:
            return f"{len(self._pending)} deferred frees were never applied"
        return None

    def clear_stats(self) -> None:
        """TensorFlow's ClearStats: num_allocs := 0, peak := current, largest_alloc_size := 0."""
        with self._lock:
            self._num_allocs = 0
            self._peak_bytes_in_use = self._bytes_in_use
            self._largest_alloc_size = 0

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"<BFCAllocator {self.device}: {s.bytes_in_use} bytes in use, pool {s.pool_bytes} of limit {s.bytes_limit}>"
        )
