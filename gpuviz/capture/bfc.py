"""The instrumented best-fit-with-coalescing (BFC) allocator, with TensorFlow's semantics:
``ReferenceBFCAllocator``, the executable reference in Python. Users get ``gpuviz.BFCAllocator``,
the native allocator (``capture.native.NativeBFCAllocator``) wherever it was built: the same
arguments, decisions, rows and errors, with its hot path in C.

Policy (design.md "Reference semantics"):
    rounding     sizes round up to 256 B (a 0-byte request returns the null address 0)
    best fit     the smallest free chunk >= the rounded size, lowest address on ties
    split        when chunk.size >= 2·rounded or chunk.size - rounded >= 128 MiB
    free         coalesce with the next free neighbour, then the previous one
    growth       the first segment is 2 MiB; each growth step doubles; a request larger than
                 the step doubles it until it fits (without growth the whole limit is
                 reserved as one segment at the first allocation)
    limit        pool_bytes <= memory_limit, always
    GC           optionally, on OOM, wholly free segments go back upstream and the
                 reservation is retried, only when that can make the request fit

Every decision is reported to an observer (``Recorder`` writes it to the EventLog).

Stats invariants (checked by ``check``):
    bytes_in_use == sum(c.size for in-use chunks)
    pool_bytes == sum(segment sizes) <= memory_limit
    peak_bytes_in_use >= bytes_in_use; peak_pool_bytes >= pool_bytes
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left, insort
from dataclasses import dataclass

import numpy as np

from gpuviz.base.errors import InvalidFreeError, InvariantError, OutOfMemoryError
from gpuviz.base.heapstate import ChunkState, HeapState, SegmentState
from gpuviz.base.units import MiB, parse_bytes
from gpuviz.capture.arguments import address_argument, allocation_size, log_int, tag_argument
from gpuviz.capture.chunks import _MASK, _SHIFT, Chunk, FreeIndex, Segment, rounded_bytes
from gpuviz.capture.recorder import NullRecorder, Observer, Recorder
from gpuviz.capture.upstream import Upstream
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind

__all__ = ["ReferenceBFCAllocator", "AllocatorStats", "INITIAL_SEGMENT_BYTES", "MAX_INTERNAL_FRAGMENTATION"]

logger = logging.getLogger("gpuviz")

INITIAL_SEGMENT_BYTES = 2 * MiB
MAX_INTERNAL_FRAGMENTATION = 128 * MiB
_BACKPEDAL_FACTOR = np.float32(0.9)

_SEGMENT_ALLOC = int(Kind.SEGMENT_ALLOC)
_SEGMENT_FREE = int(Kind.SEGMENT_FREE)
_ALLOC = int(Kind.ALLOC)
_FREE = int(Kind.FREE)
_SPLIT = int(Kind.SPLIT)
_MERGE = int(Kind.MERGE)
_OOM = int(Kind.OOM)


@dataclass(frozen=True)
class AllocatorStats:
    """A snapshot of an allocator's counters. All sizes in bytes.

    ``fragmentation = (free - largest_free_block_bytes) / free`` with
    ``free = pool_bytes - bytes_in_use``; 0.0 when nothing is free.
    """

    num_allocs: int
    bytes_in_use: int
    peak_bytes_in_use: int
    largest_alloc_size: int
    bytes_limit: int
    pool_bytes: int
    peak_pool_bytes: int
    largest_free_block_bytes: int
    fragmentation: float


class ReferenceBFCAllocator:
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
        self._busy = False
        self._pending: list[int] = []
        self._chunks: dict[int, Chunk] = {}
        self._segments: dict[int, Segment] = {}
        self._free = FreeIndex()
        self._keys = self._free.keys  # the same list, for the inlined hot paths
        self._next_segment_bytes = INITIAL_SEGMENT_BYTES if growth else rounded_bytes(limit)
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
        rounded = 256 if nbytes <= 256 else (nbytes + 255) & ~255
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
        if size >= rounded << 1 or size - rounded >= MAX_INTERNAL_FRAGMENTATION:
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
        """Reserve a new segment (after GC if allowed) and take the best fit, or raise OOM."""
        grown = rounded <= self.memory_limit and (
            self._extend(rounded, stack) or (self.garbage_collection and self._collect_for(rounded, stack))
        )
        address = self._free.take_best_fit(rounded) if grown else None
        if address is not None:
            return address
        raise self._out_of_memory(nbytes, rounded, stack)

    def _reserve_segment(self, rounded: int, pool_bytes: int) -> tuple[int, int] | None:
        """TF's Extend decision: reserve from upstream one segment that can hold ``rounded`` bytes
        when the pool holds ``pool_bytes``; ``(base, size)``, or None when it cannot be had.

        The step doubles until the request fits, is capped by what the limit leaves, and backs
        off by 10 % (in float32, as TF) while the device refuses it; the next step doubles unless
        this request already doubled it. Shared by the Python and the native allocator.
        """
        available = (self.memory_limit - pool_bytes) & ~255
        if rounded > available:
            return None
        increased = False
        while rounded > self._next_segment_bytes:
            self._next_segment_bytes *= 2
            increased = True
        nbytes = min(self._next_segment_bytes, available)
        while True:
            try:
                base = self.upstream.allocate(nbytes)
                break
            except MemoryError:
                smaller = rounded_bytes(int(np.float32(nbytes) * _BACKPEDAL_FACTOR))
                nbytes = smaller if smaller < nbytes else nbytes - 256
                if nbytes < rounded:
                    return None
        if not increased:
            self._next_segment_bytes *= 2
        return base, nbytes

    def _extend(self, rounded: int, stack: int) -> bool:
        """Reserve one new segment that can hold ``rounded`` bytes (TF's Extend)."""
        reserved = self._reserve_segment(rounded, self._pool_bytes)
        if reserved is None:
            return False
        base, nbytes = reserved
        segment = Segment(base, nbytes)
        self._segments[base] = segment
        self._pool_bytes += nbytes
        if self._pool_bytes > self._peak_pool_bytes:
            self._peak_pool_bytes = self._pool_bytes
        chunk = Chunk(base, nbytes, segment)
        self._chunks[base] = chunk
        self._free.insert(chunk)
        self._observer.emit(_SEGMENT_ALLOC, base, nbytes, 0, base, self._free.largest(), -1, stack)
        return True

    def _collect_for(self, rounded: int, stack: int) -> bool:
        """GC: if returning wholly free segments can make ``rounded`` fit, do it and extend."""
        free_segments = [s for s in self._segments.values() if self._is_wholly_free(s)]
        total = sum(s.size for s in free_segments)
        if total == 0 or rounded > self.memory_limit - self._pool_bytes + total:
            return False
        logger.warning(
            "%s: garbage collection returns %d free segments (%d bytes) upstream to fit %d bytes",
            self.device,
            len(free_segments),
            total,
            rounded,
        )
        for segment in free_segments:
            self._release_segment(segment, stack)
        return self._extend(rounded, stack)

    def _out_of_memory(self, nbytes: int, rounded: int, stack: int) -> OutOfMemoryError:
        largest = self._free.largest()
        self._observer.emit(_OOM, 0, log_int(rounded), log_int(nbytes), -1, largest, -1, stack)
        return OutOfMemoryError(
            requested=nbytes,
            rounded=rounded,
            free=self._pool_bytes - self._bytes_in_use,
            largest_free_chunk=largest,
            reservable=self.memory_limit - self._pool_bytes,
            limit=self.memory_limit,
            device=self.device,
        )

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

    # ------------------------------------------------------------------- queries
    def _live_chunk(self, address: int) -> Chunk:
        address = address_argument(address, what="size query")
        chunk = self._chunks.get(address)
        if chunk is None or not chunk.in_use:
            raise InvalidFreeError(f"{self.device}: {address:#x} is not a live allocation")
        return chunk

    def requested_size(self, address: int) -> int:
        """Bytes the caller asked for at ``address``."""
        with self._lock:
            return self._live_chunk(address).requested

    def allocated_size(self, address: int) -> int:
        """Bytes of the chunk handed out at ``address`` (rounded, maybe unsplit)."""
        with self._lock:
            return self._live_chunk(address).size

    def stats(self) -> AllocatorStats:
        with self._lock:
            largest = self._free.largest()
            free = self._pool_bytes - self._bytes_in_use
            return AllocatorStats(
                num_allocs=self._num_allocs,
                bytes_in_use=self._bytes_in_use,
                peak_bytes_in_use=self._peak_bytes_in_use,
                largest_alloc_size=self._largest_alloc_size,
                bytes_limit=self.memory_limit,
                pool_bytes=self._pool_bytes,
                peak_pool_bytes=self._peak_pool_bytes,
                largest_free_block_bytes=largest,
                fragmentation=(free - largest) / free if free else 0.0,
            )

    def clear_stats(self) -> None:
        """TensorFlow's ClearStats: num_allocs := 0, peak := current, largest_alloc_size := 0."""
        with self._lock:
            self._num_allocs = 0
            self._peak_bytes_in_use = self._bytes_in_use
            self._largest_alloc_size = 0

    def state(self) -> HeapState:
        """Every segment and chunk of this device now."""
        with self._lock:
            segments = []
            for base in sorted(self._segments):
                chunk: Chunk | None = self._chunks[base]
                states = []
                while chunk is not None:
                    states.append(ChunkState(chunk.address, chunk.size, chunk.requested, chunk.in_use, chunk.tag))
                    chunk = chunk.next
                segments.append(SegmentState(base, self._segments[base].size, tuple(states)))
            return HeapState(self.device, tuple(segments))

    def bins(self) -> list[list[tuple[int, int]]]:
        """The 21 bins: ``(size, address)`` of the free chunks in each."""
        with self._lock:
            return self._free.bins()

    # ----------------------------------------------------------------- recording
    def _recorder_for(self, log: EventLog, stacks: bool | None) -> Recorder:
        """A recorder into ``log`` for this device (registered there with this allocator's options);
        ``stacks`` None keeps the current setting."""
        keep_stacks = self._observer.stacks if stacks is None else stacks
        device_index = log.add_device(self.device, **self.log.devices[self.log.device_index(self.device)].options)
        return Recorder(log, device_index, stacks=keep_stacks, skip=self._stack_skip)

    def record_into(self, log: EventLog, *, stacks: bool | None = None) -> None:
        """Record into ``log`` from now on, starting with the current heap written as events.

        Each segment becomes a ``segment_alloc`` followed by the ``split``s and ``alloc``s
        that rebuild its chunks, so ``replay(log)`` reproduces this allocator's state from
        the first event on. Stats are not written (they live in the allocator).
        """
        with self._lock:
            observer: Observer = self._recorder_for(log, stacks)
            emit = observer.emit
            # largest free chunk after each synthetic event, as replay sees it: free chunks of
            # earlier segments, free chunks passed in this one, and the unsplit tail
            earlier = 0
            for base in sorted(self._segments):
                segment = self._segments[base]
                emit(_SEGMENT_ALLOC, base, segment.size, 0, base, max(earlier, segment.size), -1, -1)
                passed, tail = earlier, segment.size
                chunk: Chunk | None = self._chunks[base]
                while chunk is not None:
                    rest = tail - chunk.size
                    if chunk.next is not None:
                        emit(_SPLIT, chunk.address, chunk.size, 0, base, max(passed, chunk.size, rest), -1, -1)
                    if chunk.in_use:
                        chunk.tag_id = observer.tag_id(chunk.tag)
                        largest = max(passed, rest)
                        emit(_ALLOC, chunk.address, chunk.size, chunk.requested, base, largest, chunk.tag_id, -1)
                    else:
                        passed = max(passed, chunk.size)
                    tail = rest
                    chunk = chunk.next
                earlier = passed
            self.log = log
            self._observer = observer

    # ------------------------------------------------------------------- release
    def _is_wholly_free(self, segment: Segment) -> bool:
        chunk = self._chunks[segment.base]
        return not chunk.in_use and chunk.size == segment.size

    def _release_segment(self, segment: Segment, stack: int) -> None:
        chunk = self._chunks.pop(segment.base)
        self._free.remove(chunk)
        self.upstream.free(segment.base)
        del self._segments[segment.base]
        self._pool_bytes -= segment.size
        self._observer.emit(_SEGMENT_FREE, segment.base, segment.size, 0, segment.base, self._free.largest(), -1, stack)

    def preallocate(self) -> int:
        """Without growth, reserve the whole memory limit now as one segment (as TensorFlow
        does for every visible GPU when it initialises); the bytes reserved.

        Does nothing (returns 0) with growth on or when a segment is already reserved. When
        the device has less than the limit the reservation backs off as ``allocate`` does;
        when nothing can be reserved it returns 0 and the first allocation tries again.
        """
        with self._lock:
            if self.growth or self._segments:
                return 0
            self._extend(256, self._observer.stack_id())
            return self._pool_bytes

    def release_free_segments(self) -> int:
        """Return every wholly free segment upstream; the bytes released."""
        with self._lock:
            stack = self._observer.stack_id()
            released = 0
            for segment in [s for s in self._segments.values() if self._is_wholly_free(s)]:
                self._release_segment(segment, stack)
                released += segment.size
            return released

    # --------------------------------------------------------------------- check
    def check(self) -> None:
        """Raise ``InvariantError`` on any breach of the invariants in this module's and chunks' docs."""
        with self._lock:
            seen = 0
            in_use = 0
            free_keys = []
            pool = 0
            for base, segment in self._segments.items():
                pool += segment.size
                chunk = self._chunks.get(base)
                if chunk is None or chunk.prev is not None:
                    raise InvariantError(f"segment {base:#x} does not start with a chunk")
                position = base
                previous: Chunk | None = None
                while chunk is not None:
                    seen += 1
                    if chunk.address != position or chunk.segment is not segment or chunk.prev is not previous:
                        raise InvariantError(f"chunk list of segment {base:#x} is broken at {position:#x}")
                    if chunk.size <= 0 or chunk.size % 256:
                        raise InvariantError(f"chunk {chunk.address:#x} has size {chunk.size}")
                    if self._chunks.get(chunk.address) is not chunk:
                        raise InvariantError(f"chunk {chunk.address:#x} is not registered by its address")
                    if chunk.in_use:
                        in_use += chunk.size
                        if not 0 < chunk.requested <= chunk.size:
                            raise InvariantError(f"chunk {chunk.address:#x} requested {chunk.requested}")
                    else:
                        if previous is not None and not previous.in_use:
                            raise InvariantError(
                                f"adjacent free chunks at {previous.address:#x} and {chunk.address:#x}"
                            )
                        if chunk.requested or chunk.tag is not None:
                            raise InvariantError(f"free chunk {chunk.address:#x} carries allocation data")
                        free_keys.append(chunk.key)
                    position += chunk.size
                    previous, chunk = chunk, chunk.next
                if position != base + segment.size:
                    raise InvariantError(f"chunks of segment {base:#x} do not tile it")
            if seen != len(self._chunks):
                raise InvariantError(f"{len(self._chunks) - seen} registered chunks belong to no segment")
            keys = self._free.keys
            if keys != sorted(set(keys)) or sorted(free_keys) != keys:
                raise InvariantError("the free index (bins) does not hold exactly the free chunks, once each, in order")
            bins = self._free.bins()
            if sum(len(b) for b in bins) != len(free_keys):
                raise InvariantError("a free chunk is in no bin or in several")
            if in_use != self._bytes_in_use:
                raise InvariantError(f"bytes_in_use is {self._bytes_in_use}, chunks in use add up to {in_use}")
            if pool != self._pool_bytes or pool > self.memory_limit:
                raise InvariantError(
                    f"pool_bytes {self._pool_bytes}, segments add up to {pool}, limit {self.memory_limit}"
                )
            if self._peak_bytes_in_use < in_use or self._peak_pool_bytes < pool:
                raise InvariantError("a peak is below its current value")
            if self._pending:
                raise InvariantError(f"{len(self._pending)} deferred frees were never applied")

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"<BFCAllocator {self.device}: {s.bytes_in_use} bytes in use, pool {s.pool_bytes} of limit {s.bytes_limit}>"
        )
