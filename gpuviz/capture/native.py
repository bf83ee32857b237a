"""The native BFC allocator: ``ReferenceBFCAllocator``'s policy and API with its hot path in C.

``NativeBFCAllocator`` takes the same arguments, makes the same decisions (addresses,
splits, merges, growth, garbage collection, errors) and records the same rows as
``ReferenceBFCAllocator``, which stays the executable reference: tests drive both with the same
operations and compare everything but time and thread.

What runs where:
    C (``gpuviz.capture._bfcnative``, built at install time where a C compiler exists):
        allocate/free, best fit over the free index, split, coalesce, stats, recording,
        the lock and the deferred-free rule.
    Python (this module): growth, the memory limit, garbage collection and the
        out-of-memory error (rare: only when no free chunk fits), state, bins, check,
        record_into.

``allocator_class()`` is the class new allocators should use: the native one when it is
built and ``GPUVIZ_NATIVE`` is not ``0``, else ``ReferenceBFCAllocator``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from gpuviz.base import native as registry
from gpuviz.base.errors import InvalidFreeError, InvariantError, OutOfMemoryError
from gpuviz.base.heapstate import ChunkState, HeapState, SegmentState
from gpuviz.capture.arguments import address_argument, allocation_size, log_int
from gpuviz.capture.bfc import AllocatorStats, ReferenceBFCAllocator
from gpuviz.capture.chunks import NUM_BINS, bin_for_size, rounded_bytes
from gpuviz.capture.recorder import Observer, Recorder
from gpuviz.log.eventlog import EventLog, RowStaging
from gpuviz.log.schema import Kind

__all__ = ["BFCAllocator", "NativeBFCAllocator", "allocator_class", "allocator_description", "native_core_available"]

logger = logging.getLogger("gpuviz")

_SEGMENT_ALLOC = int(Kind.SEGMENT_ALLOC)
_ALLOC = int(Kind.ALLOC)
_SPLIT = int(Kind.SPLIT)
_OOM = int(Kind.OOM)

# (address, size, requested, in_use, tag, tag_id)
_ChunkTuple = tuple[int, int, int, bool, "str | None", int]


class _Core(Protocol):
    def allocate(self, nbytes: int, *, tag: str | None = None) -> int: ...
    def free(self, address: int) -> None: ...
    def emit(self, kind: int, address: int, size: int, requested: int, segment: int, largest: int, tag: int,
             stack: int) -> None: ...  # fmt: skip
    def set_sink(self, staged: RowStaging | None, limit: int, flush: Any, device: int, tag_fn: Any,
                 stack_fn: Any) -> None: ...  # fmt: skip
    def add_segment(self, base: int, size: int, stack: int) -> None: ...
    def release_segment(self, base: int, stack: int) -> None: ...
    def segments(self) -> list[tuple[int, int, bool]]: ...
    def chunks(self, base: int) -> list[_ChunkTuple]: ...
    def lookup(self, address: object) -> _ChunkTuple | None: ...
    def set_tag_id(self, address: int, tag_id: int) -> None: ...
    def free_chunks(self) -> list[tuple[int, int]]: ...
    def stats(self) -> tuple[int, int, int, int, int, int, int]: ...
    def clear_stats(self) -> None: ...
    def largest_free(self) -> int: ...
    def check_links(self) -> str | None: ...
    def lock(self) -> None: ...
    def unlock(self) -> None: ...


_MODULE = "gpuviz.capture._bfcnative"
_core_module = registry.load(_MODULE)  # None where it was not built: the Python allocator is used
_CoreClass: Any = None if _core_module is None else _core_module.Core


def native_core_available() -> bool:
    """Whether the native core is built, loaded and not switched off (``gpuviz.base.native``)."""
    return _CoreClass is not None and registry.available(_MODULE)


def allocator_class() -> type[ReferenceBFCAllocator]:
    """``NativeBFCAllocator`` where the native core is available, else ``ReferenceBFCAllocator``."""
    return NativeBFCAllocator if native_core_available() else ReferenceBFCAllocator


def allocator_description() -> str:
    """Which BFC allocator new devices use, in words (for ``gpuviz info``)."""
    if native_core_available():
        return "native core (C)"
    return f"Python ({registry.why_not(_MODULE) or 'the native core is not loaded'})"


class _Locked:
    """``with self._locked:`` holds the core's lock; frees arriving meanwhile on this thread wait."""

    __slots__ = ("_core",)

    def __init__(self, core: _Core) -> None:
        self._core = core

    def __enter__(self) -> None:
        self._core.lock()

    def __exit__(self, *exc: object) -> None:
        self._core.unlock()


class NativeBFCAllocator(ReferenceBFCAllocator):
    """``ReferenceBFCAllocator`` with its hot path in C (same arguments, decisions, rows and errors).

    Raises ``RuntimeError`` when the native core was not built (no C compiler at install).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if _CoreClass is None:
            raise RuntimeError("the native allocator core is not built (gpuviz was installed without a C compiler)")
        super().__init__(*args, **kwargs)
        core: _Core = _CoreClass(self.device, self._grow, allocation_size, self._report, InvalidFreeError)
        self._core = core
        self._locked = _Locked(core)
        self._attach(self._observer)
        # the hot path: C methods bound on the instance, no Python frame per call
        self.allocate = core.allocate  # type: ignore[method-assign]
        self.free = core.free  # type: ignore[method-assign]

    def _attach(self, observer: Observer) -> None:
        self._observer = observer
        if isinstance(observer, Recorder):
            staged, limit = observer.log.row_sink()
            stack_fn = observer.stack_id if observer.stacks else None
            self._core.set_sink(staged, limit, observer.log.flush_staged, observer.device, observer.tag_id, stack_fn)
        else:
            self._core.set_sink(None, 0, None, 0, None, None)

    def _report(self, what: str, error: BaseException) -> None:
        """What failed at the end of an operation, after it was decided (see ``leave`` in
        _bfcnative.c): logged, never raised in place of the operation's outcome."""
        logger.error("%s: %s", self.device, what, exc_info=error)

    # ----------------------------------------------------------- growth (rare)
    def _grow(self, nbytes: int, stack: int) -> None:
        """No free chunk fits: reserve a segment (after GC if allowed) or raise OutOfMemoryError."""
        rounded = rounded_bytes(nbytes)
        grown = rounded <= self.memory_limit and (
            self._extend_pool(rounded, stack) or (self.garbage_collection and self._collect(rounded, stack))
        )
        if not grown:
            largest = self._core.largest_free()
            pool = self._core.stats()[4]
            self._core.emit(_OOM, 0, log_int(rounded), log_int(nbytes), -1, largest, -1, stack)
            raise OutOfMemoryError(
                requested=nbytes,
                rounded=rounded,
                free=pool - self._core.stats()[1],
                largest_free_chunk=largest,
                reservable=self.memory_limit - pool,
                limit=self.memory_limit,
                device=self.device,
            )

    def _extend_pool(self, rounded: int, stack: int) -> bool:
        """Reserve one new segment that can hold ``rounded`` bytes (TF's Extend, ``_reserve_segment``)."""
        step = self._next_segment_bytes
        reserved = self._reserve_segment(rounded, self._core.stats()[4])
        if reserved is None:
            return False
        try:
            self._core.add_segment(*reserved, stack)
        except MemoryError:  # no memory for the log's row: the reservation is undone, as if never made
            self.upstream.free(reserved[0])
            self._next_segment_bytes = step
            raise
        return True

    def _collect(self, rounded: int, stack: int) -> bool:
        """GC: if returning wholly free segments can make ``rounded`` fit, do it and extend."""
        free_segments = [(base, size) for base, size, wholly_free in self._core.segments() if wholly_free]
        total = sum(size for _, size in free_segments)
        if total == 0 or rounded > self.memory_limit - self._core.stats()[4] + total:
            return False
        logger.warning(
            "%s: garbage collection returns %d free segments (%d bytes) upstream to fit %d bytes",
            self.device,
            len(free_segments),
            total,
            rounded,
        )
        for base, _ in free_segments:
            self._release(base, stack)
        return self._extend_pool(rounded, stack)

    def _release(self, base: int, stack: int) -> None:
        self._core.release_segment(base, stack)
        self.upstream.free(base)

    # ------------------------------------------------------------------ queries
    def _live(self, address: int) -> _ChunkTuple:
        address = address_argument(address, what="size query")
        chunk = self._core.lookup(address)
        if chunk is None or not chunk[3]:
            raise InvalidFreeError(f"{self.device}: {address:#x} is not a live allocation")
        return chunk

    def requested_size(self, address: int) -> int:
        """Bytes the caller asked for at ``address``."""
        with self._locked:
            return self._live(address)[2]

    def allocated_size(self, address: int) -> int:
        """Bytes of the chunk handed out at ``address`` (rounded, maybe unsplit)."""
        with self._locked:
            return self._live(address)[1]

    def stats(self) -> AllocatorStats:
        with self._locked:
            num_allocs, in_use, peak, largest_alloc, pool, peak_pool, largest = self._core.stats()
        free = pool - in_use
        return AllocatorStats(
            num_allocs=num_allocs,
            bytes_in_use=in_use,
            peak_bytes_in_use=peak,
            largest_alloc_size=largest_alloc,
            bytes_limit=self.memory_limit,
            pool_bytes=pool,
            peak_pool_bytes=peak_pool,
            largest_free_block_bytes=largest,
            fragmentation=(free - largest) / free if free else 0.0,
        )

    def clear_stats(self) -> None:
        """TensorFlow's ClearStats: num_allocs := 0, peak := current, largest_alloc_size := 0."""
        with self._locked:
            self._core.clear_stats()

    def _segment_chunks(self) -> list[tuple[int, int, list[_ChunkTuple]]]:
        return [(base, size, self._core.chunks(base)) for base, size, _ in sorted(self._core.segments())]

    def state(self) -> HeapState:
        """Every segment and chunk of this device now."""
        with self._locked:
            segments = self._segment_chunks()
        return HeapState(
            self.device,
            tuple(
                SegmentState(base, size, tuple(ChunkState(a, s, r, u, t) for a, s, r, u, t, _ in chunks))
                for base, size, chunks in segments
            ),
        )

    def bins(self) -> list[list[tuple[int, int]]]:
        """The 21 bins: ``(size, address)`` of the free chunks in each."""
        with self._locked:
            entries = self._core.free_chunks()
        result: list[list[tuple[int, int]]] = [[] for _ in range(NUM_BINS)]
        for size, address in entries:
            result[bin_for_size(size)].append((size, address))
        return result

    # ---------------------------------------------------------------- recording
    def record_into(self, log: EventLog, *, stacks: bool | None = None) -> None:
        """Record into ``log`` from now on, starting with the current heap written as events.

        Each segment becomes a ``segment_alloc`` followed by the ``split``s and ``alloc``s
        that rebuild its chunks, so ``replay(log)`` reproduces this allocator's state from
        the first event on. Stats are not written (they live in the allocator).
        """
        with self._locked:
            observer = self._recorder_for(log, stacks)
            self.log = log
            self._attach(observer)
            emit = self._core.emit
            # largest free chunk after each synthetic event, as replay sees it: free chunks of
            # earlier segments, free chunks passed in this one, and the unsplit tail
            earlier = 0
            for base, size, chunks in self._segment_chunks():
                emit(_SEGMENT_ALLOC, base, size, 0, base, max(earlier, size), -1, -1)
                passed, tail = earlier, size
                for i, (address, chunk_size, requested, in_use, tag, _) in enumerate(chunks):
                    rest = tail - chunk_size
                    if i + 1 < len(chunks):
                        emit(_SPLIT, address, chunk_size, 0, base, max(passed, chunk_size, rest), -1, -1)
                    if in_use:
                        tag_id = observer.tag_id(tag)
                        self._core.set_tag_id(address, tag_id)
                        emit(_ALLOC, address, chunk_size, requested, base, max(passed, rest), tag_id, -1)
                    else:
                        passed = max(passed, chunk_size)
                    tail = rest
                earlier = passed

    # ------------------------------------------------------------------ release
    def preallocate(self) -> int:
        """Without growth, reserve the whole memory limit now as one segment, as
        ``ReferenceBFCAllocator.preallocate`` does; the bytes reserved (0 with growth on, when a
        segment is already reserved, or when nothing can be reserved)."""
        with self._locked:
            if self.growth or self._core.segments():
                return 0
            self._extend_pool(256, self._observer.stack_id())
            return self._core.stats()[4]

    def release_free_segments(self) -> int:
        """Return every wholly free segment upstream; the bytes released."""
        with self._locked:
            stack = self._observer.stack_id()
            released = 0
            for base, size, wholly_free in self._core.segments():
                if wholly_free:
                    self._release(base, stack)
                    released += size
            return released

    # -------------------------------------------------------------------- check
    def check(self) -> None:
        """Raise ``InvariantError`` on any breach of the allocator's invariants (see bfc.py)."""
        with self._locked:
            broken = self._core.check_links()
            if broken is not None:
                raise InvariantError(broken)
            segments = self._segment_chunks()
            free_index = self._core.free_chunks()
            _, bytes_in_use, peak, _, pool_bytes, peak_pool, _ = self._core.stats()
        free_keys = []
        in_use = pool = 0
        for base, size, chunks in segments:
            pool += size
            position, previous_free = base, False
            for address, chunk_size, requested, used, tag, _ in chunks:
                if address != position:
                    raise InvariantError(f"chunk list of segment {base:#x} is broken at {position:#x}")
                if chunk_size <= 0 or chunk_size % 256:
                    raise InvariantError(f"chunk {address:#x} has size {chunk_size}")
                if used:
                    in_use += chunk_size
                    if not 0 < requested <= chunk_size:
                        raise InvariantError(f"chunk {address:#x} requested {requested}")
                else:
                    if previous_free:
                        raise InvariantError(f"adjacent free chunks before and at {address:#x}")
                    if requested or tag is not None:
                        raise InvariantError(f"free chunk {address:#x} carries allocation data")
                    free_keys.append((chunk_size, address))
                previous_free = not used
                position += chunk_size
            if position != base + size:
                raise InvariantError(f"chunks of segment {base:#x} do not tile it")
        if sorted(free_keys) != free_index:
            raise InvariantError("the free index (bins) does not hold exactly the free chunks, once each, in order")
        if in_use != bytes_in_use:
            raise InvariantError(f"bytes_in_use is {bytes_in_use}, chunks in use add up to {in_use}")
        if pool != pool_bytes or pool > self.memory_limit:
            raise InvariantError(f"pool_bytes {pool_bytes}, segments add up to {pool}, limit {self.memory_limit}")
        if peak < in_use or peak_pool < pool:
            raise InvariantError("a peak is below its current value")


if TYPE_CHECKING:
    BFCAllocator = ReferenceBFCAllocator
else:
    # the name users are taught: the native allocator wherever it was built (and not switched
    # off with GPUVIZ_NATIVE=0 when gpuviz was imported), else the Python reference
    BFCAllocator = allocator_class()
