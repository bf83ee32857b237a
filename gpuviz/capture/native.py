"""The native BFC allocator, the one ``gpuviz.BFCAllocator`` is by default: ``ReferenceBFCAllocator``'s
policy and API with its heap and hot path in C.

Wherever its C part was built (and ``GPUVIZ_NATIVE`` is not ``0``) this class, not the Python
reference in ``gpuviz/capture/bfc.py``, serves every allocation of gpuviz's BFC allocator: the
public ``gpuviz.BFCAllocator``, the framework integrations and the what-if ``tf-bfc`` replay.
``NativeBFCAllocator`` takes the same arguments, makes the same decisions (addresses, splits,
merges, growth, garbage collection, errors) and records the same rows as
``ReferenceBFCAllocator``, which stays the executable reference: tests drive both with the same
operations and compare everything but time and thread.

What runs where:
    C (``gpuviz.capture._bfcnative``, ``csrc/capture/_bfcnative.c`` over the core
        ``csrc/capture/_bfc_core.c``, built at install time where a C compiler exists):
        allocate/free, best fit over the free index, split, coalesce, stats, recording,
        the lock and the deferred-free rule; rounding and the split rule are
        ``csrc/capture/_bfc_rules.h``'s.
    Python, the same code as the reference's: growth, the memory limit, garbage collection
        and the out-of-memory error (``bfc_pool.SegmentPool``, with ``bfc_rules``; rare: only
        when no free chunk fits), stats, state, bins, check and record_into
        (``bfc_inspect.HeapInspection``). This module gives them the C heap as primitives.

``allocator_class()`` is the class new allocators should use: the native one when it is
built and ``GPUVIZ_NATIVE`` is not ``0``, else ``ReferenceBFCAllocator``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from gpuviz.base import native as registry
from gpuviz.base.errors import InvalidFreeError
from gpuviz.capture.arguments import allocation_size
from gpuviz.capture.bfc import ReferenceBFCAllocator
from gpuviz.capture.bfc_inspect import ChunkTuple
from gpuviz.capture.bfc_rules import rounded_bytes
from gpuviz.capture.recorder import Observer, Recorder
from gpuviz.log.eventlog import RowStaging

__all__ = ["BFCAllocator", "NativeBFCAllocator", "allocator_class", "allocator_description", "native_core_available"]

logger = logging.getLogger("gpuviz")


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
    def chunks(self, base: int) -> list[ChunkTuple]: ...
    def lookup(self, address: object) -> ChunkTuple | None: ...
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
        core: _Core = _CoreClass(self.device, self._grow_or_raise, allocation_size, self._report, InvalidFreeError)
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
    def _grow_or_raise(self, nbytes: int, stack: int) -> None:
        """No free chunk fits (the core asks): reserve a segment, ``SegmentPool._grow``, or raise
        ``OutOfMemoryError``."""
        rounded = rounded_bytes(nbytes)
        if not self._grow(rounded, stack):
            raise self._out_of_memory(nbytes, rounded, stack)

    # -------------------------------------------------------------- primitives
    # the C heap as SegmentPool and HeapInspection see it
    def _pool_bytes_now(self) -> int:
        return self._core.stats()[4]

    def _in_use_now(self) -> int:
        return self._core.stats()[1]

    def _largest_free(self) -> int:
        return self._core.largest_free()

    def _segment_list(self) -> list[tuple[int, int, bool]]:
        return self._core.segments()

    def _add_segment(self, base: int, size: int, stack: int) -> None:
        self._core.add_segment(base, size, stack)

    def _drop_segment(self, base: int, stack: int) -> None:
        self._core.release_segment(base, stack)

    def _emit(self, kind: int, address: int, size: int, requested: int, segment: int, largest: int, tag: int,
              stack: int) -> None:  # fmt: skip
        self._core.emit(kind, address, size, requested, segment, largest, tag, stack)

    def _counters(self) -> tuple[int, int, int, int, int, int, int]:
        return self._core.stats()

    def _lookup(self, address: int) -> ChunkTuple | None:
        return self._core.lookup(address)

    def _segment_chunks(self) -> list[tuple[int, int, list[ChunkTuple]]]:
        return [(base, size, self._core.chunks(base)) for base, size, _ in sorted(self._core.segments())]

    def _free_entries(self) -> list[tuple[int, int]]:
        return self._core.free_chunks()

    def _set_tag_id(self, address: int, tag_id: int) -> None:
        self._core.set_tag_id(address, tag_id)

    def _check_links(self) -> str | None:
        return self._core.check_links()

    def clear_stats(self) -> None:
        """TensorFlow's ClearStats: num_allocs := 0, peak := current, largest_alloc_size := 0."""
        with self._locked:
            self._core.clear_stats()


if TYPE_CHECKING:
    BFCAllocator = ReferenceBFCAllocator
else:
    # the name users are taught: the native allocator wherever it was built (and not switched
    # off with GPUVIZ_NATIVE=0 when gpuviz was imported), else the Python reference
    BFCAllocator = allocator_class()
