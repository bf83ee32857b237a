"""What a BFC allocator tells about itself, written once for both BFC allocators: stats, size
queries, its heap (``state``, ``bins``), its heap written as events (``record_into``) and the
check of its invariants.

``HeapInspection`` works on a plain view of the heap that each allocator gives through the
primitives below (``ReferenceBFCAllocator`` from its Python chunks, ``NativeBFCAllocator`` from
its C core), so the two answer every question with the same code.

Primitives: ``_counters`` (num_allocs, bytes_in_use, peak_bytes_in_use, largest_alloc_size,
pool_bytes, peak_pool_bytes, largest free chunk), ``_lookup`` (the chunk at an address),
``_segment_chunks`` (every segment by base, with its chunks in address order), ``_free_entries``
(the free index, (size, address) in order), ``_set_tag_id``, ``_attach`` (record with an
observer from now on), ``_emit`` (one row) and ``_check_links`` (the allocator's own
structures: links, registration, the free index's shape, deferred frees; None or what is
broken). A chunk is ``(address, size, requested, in_use, tag, tag_id)``. Sizes in bytes.

Stats invariants (checked by ``check``):
    bytes_in_use == sum(c.size for in-use chunks)
    pool_bytes == sum(segment sizes) <= memory_limit
    peak_bytes_in_use >= bytes_in_use; peak_pool_bytes >= pool_bytes
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from gpuviz.base.errors import InvalidFreeError, InvariantError
from gpuviz.base.heapstate import ChunkState, HeapState, SegmentState
from gpuviz.capture.arguments import address_argument
from gpuviz.capture.bfc_rules import NUM_BINS, bin_for_size
from gpuviz.capture.recorder import Observer, Recorder
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind

__all__ = ["AllocatorStats", "ChunkTuple", "HeapInspection"]

_SEGMENT_ALLOC = int(Kind.SEGMENT_ALLOC)
_ALLOC = int(Kind.ALLOC)
_SPLIT = int(Kind.SPLIT)

ChunkTuple = tuple[int, int, int, bool, "str | None", int]
"""(address, size, requested, in_use, tag, tag_id) of one chunk."""


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


class HeapInspection:
    """Stats, queries, state, bins, ``record_into`` and ``check`` (see the module doc)."""

    device: str
    memory_limit: int
    log: EventLog
    _observer: Observer
    _stack_skip: tuple[str, ...]
    _locked: AbstractContextManager[Any]

    # ---------------------------------------------------------------- primitives
    def _counters(self) -> tuple[int, int, int, int, int, int, int]:
        raise NotImplementedError

    def _lookup(self, address: int) -> ChunkTuple | None:
        raise NotImplementedError

    def _segment_chunks(self) -> list[tuple[int, int, list[ChunkTuple]]]:
        raise NotImplementedError

    def _free_entries(self) -> list[tuple[int, int]]:
        raise NotImplementedError

    def _set_tag_id(self, address: int, tag_id: int) -> None:
        raise NotImplementedError

    def _attach(self, observer: Observer) -> None:
        raise NotImplementedError

    def _emit(self, kind: int, address: int, size: int, requested: int, segment: int, largest: int, tag: int,
              stack: int) -> None:  # fmt: skip
        raise NotImplementedError

    def _check_links(self) -> str | None:
        raise NotImplementedError

    # ------------------------------------------------------------------- queries
    def _live(self, address: int) -> ChunkTuple:
        address = address_argument(address, what="size query")
        chunk = self._lookup(address)
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
            num_allocs, in_use, peak, largest_alloc, pool, peak_pool, largest = self._counters()
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
            entries = self._free_entries()
        result: list[list[tuple[int, int]]] = [[] for _ in range(NUM_BINS)]
        for size, address in entries:
            result[bin_for_size(size)].append((size, address))
        return result

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
        with self._locked:
            observer = self._recorder_for(log, stacks)
            self.log = log
            self._attach(observer)
            emit = self._emit
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
                        self._set_tag_id(address, tag_id)
                        emit(_ALLOC, address, chunk_size, requested, base, max(passed, rest), tag_id, -1)
                    else:
                        passed = max(passed, chunk_size)
                    tail = rest
                earlier = passed

    # --------------------------------------------------------------------- check
    def check(self) -> None:
        """Raise ``InvariantError`` on any breach of the invariants in this module's and chunks' docs."""
        with self._locked:
            broken = self._check_links()
            if broken is not None:
                raise InvariantError(broken)
            segments = self._segment_chunks()
            free_index = self._free_entries()
            _, bytes_in_use, peak, _, pool_bytes, peak_pool, _ = self._counters()
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
