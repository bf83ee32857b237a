"""The BFC allocator's segment pool: growth, the memory limit, garbage collection and releasing
segments, written once for both BFC allocators.

``SegmentPool`` decides, with TensorFlow's rules (``gpuviz.capture.bfc_rules``), what happens when
no free chunk fits a request: reserve a new segment upstream (TF's Extend: the growth step,
capped by the limit, backing off while the device refuses), else, with garbage collection on,
return the wholly free segments upstream and try again (DeallocateFreeRegions), else raise
``OutOfMemoryError``. ``ReferenceBFCAllocator`` (Python) and ``NativeBFCAllocator`` (its heap in
C) both inherit it and differ only in the primitives below, which hold each one's heap. The C
twin of this module is ``bfc_grow`` in ``csrc/capture/_bfc_core.c`` (the what-if replay's and
PyTorch's pluggable allocator's).

Primitives (the heap's): ``_pool_bytes_now``, ``_in_use_now``, ``_largest_free``,
``_segment_list`` (base, size, wholly free; in the order added), ``_add_segment`` (may raise
``MemoryError``: nothing changed), ``_drop_segment`` (a wholly free one: out of the heap, its
``segment_free`` row written) and ``_emit`` (one row). All sizes in bytes.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import Any

from gpuviz.base.errors import OutOfMemoryError
from gpuviz.capture import bfc_rules
from gpuviz.capture.arguments import log_int
from gpuviz.capture.recorder import Observer
from gpuviz.capture.upstream import Upstream
from gpuviz.log.schema import Kind

__all__ = ["SegmentPool"]

logger = logging.getLogger("gpuviz")

_OOM = int(Kind.OOM)


class SegmentPool:
    """Growth, limit, garbage collection and release over an upstream (see the module doc)."""

    upstream: Upstream
    device: str
    memory_limit: int
    growth: bool
    garbage_collection: bool
    _next_segment_bytes: int
    _observer: Observer
    _locked: AbstractContextManager[Any]

    # ---------------------------------------------------------------- primitives
    def _pool_bytes_now(self) -> int:
        raise NotImplementedError

    def _in_use_now(self) -> int:
        raise NotImplementedError

    def _largest_free(self) -> int:
        raise NotImplementedError

    def _segment_list(self) -> list[tuple[int, int, bool]]:
        raise NotImplementedError

    def _add_segment(self, base: int, size: int, stack: int) -> None:
        raise NotImplementedError

    def _drop_segment(self, base: int, stack: int) -> None:
        raise NotImplementedError

    def _emit(self, kind: int, address: int, size: int, requested: int, segment: int, largest: int, tag: int,
              stack: int) -> None:  # fmt: skip
        raise NotImplementedError

    # -------------------------------------------------------------------- growth
    def _reserve(self, nbytes: int) -> int | None:
        """``nbytes`` from upstream: the base, or None when the device refuses."""
        try:
            return self.upstream.allocate(nbytes)
        except MemoryError:
            return None

    def _extend(self, rounded: int, stack: int) -> bool:
        """TF's Extend: reserve one new segment that can hold ``rounded`` bytes."""
        step = self._next_segment_bytes
        segment, self._next_segment_bytes = bfc_rules.extend(
            rounded, memory_limit=self.memory_limit, pool_bytes=self._pool_bytes_now(), step=step, reserve=self._reserve
        )
        if segment is None:
            return False
        try:
            self._add_segment(*segment, stack)
        except MemoryError:  # no memory for the heap or the log's row: undone, as if never made
            self.upstream.free(segment[0])
            self._next_segment_bytes = step
            raise
        return True

    def _collect(self, rounded: int, stack: int) -> bool:
        """DeallocateFreeRegions: if returning the wholly free segments can make ``rounded`` fit,
        return them (in the order they were added) and extend."""
        free_segments = [(base, size) for base, size, wholly_free in self._segment_list() if wholly_free]
        total = sum(size for _, size in free_segments)
        if not bfc_rules.gc_helps(rounded, self.memory_limit, self._pool_bytes_now(), total):
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
        return self._extend(rounded, stack)

    def _grow(self, rounded: int, stack: int) -> bool:
        """No free chunk holds ``rounded`` bytes: whether a segment that does was added
        (Extend, else with garbage collection DeallocateFreeRegions and Extend again)."""
        if rounded > self.memory_limit:
            return False
        return self._extend(rounded, stack) or (self.garbage_collection and self._collect(rounded, stack))

    def _out_of_memory(self, nbytes: int, rounded: int, stack: int) -> OutOfMemoryError:
        """Record the ``oom`` event of a request of ``nbytes`` and return the error to raise."""
        largest = self._largest_free()
        pool = self._pool_bytes_now()
        self._emit(_OOM, 0, log_int(rounded), log_int(nbytes), -1, largest, -1, stack)
        return OutOfMemoryError(
            requested=nbytes,
            rounded=rounded,
            free=pool - self._in_use_now(),
            largest_free_chunk=largest,
            reservable=self.memory_limit - pool,
            limit=self.memory_limit,
            device=self.device,
        )

    # ------------------------------------------------------------------- release
    def _release(self, base: int, stack: int) -> None:
        self._drop_segment(base, stack)
        self.upstream.free(base)

    def preallocate(self) -> int:
        """Without growth, reserve the whole memory limit now as one segment (as TensorFlow
        does for every visible GPU when it initialises); the bytes reserved.

        Does nothing (returns 0) with growth on or when a segment is already reserved. When
        the device has less than the limit the reservation backs off as ``allocate`` does;
        when nothing can be reserved it returns 0 and the first allocation tries again.
        """
        with self._locked:
            if self.growth or self._segment_list():
                return 0
            self._extend(bfc_rules.MIN_ALLOCATION_SIZE, self._observer.stack_id())
            return self._pool_bytes_now()

    def release_free_segments(self) -> int:
        """Return every wholly free segment upstream; the bytes released."""
        with self._locked:
            stack = self._observer.stack_id()
            released = 0
            for base, size, wholly_free in self._segment_list():
                if wholly_free:
                    self._release(base, stack)
                    released += size
            return released
