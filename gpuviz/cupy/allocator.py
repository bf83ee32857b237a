"""gpuviz's allocator under CuPy: every CuPy device allocation goes through one
``gpuviz.BFCAllocator`` per device, installed with ``cupy.cuda.set_allocator``.

Contract with CuPy (14): the allocator receives only a byte count (possibly 0) and must
return a ``cupy.cuda.MemoryPointer``; the memory is wrapped as
``MemoryPointer(UnownedMemory(address, size, owner, device_id), 0)`` with the device id
always explicit, and it is freed when CuPy drops the last reference to ``owner`` (views
keep it alive). Frees may come from any thread and even from inside an allocation (a
garbage-collector pass); the BFC allocator defers those. CuPy only prints errors raised
in a free path, so the free path logs and never raises. CuPy's ``MemoryHook``s do not
fire for a custom allocator, and ``CUPY_GPU_MEMORY_LIMIT`` is enforced only by CuPy's own
pool: gpuviz records everything itself and honours the variable itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

from gpuviz.base.errors import OutOfMemoryError
from gpuviz.base.units import parse_bytes
from gpuviz.capture.bfc import ReferenceBFCAllocator
from gpuviz.capture.native import allocator_class
from gpuviz.capture.upstream import Upstream
from gpuviz.log.eventlog import EventLog

__all__ = ["CupyAllocator", "Block", "cupy_out_of_memory", "limit_from_environment"]

logger = logging.getLogger("gpuviz")


class Block:
    """The owner of one allocation: when CuPy drops it, the chunk goes back to the BFC."""

    __slots__ = ("__weakref__", "address", "allocator")

    def __init__(self, allocator: ReferenceBFCAllocator, address: int) -> None:
        self.allocator = allocator
        self.address = address

    def __del__(self) -> None:
        try:
            self.allocator.free(self.address)
        except Exception:  # CuPy would only print it: log it instead, never raise here
            with contextlib.suppress(Exception):  # at interpreter shutdown logging may be gone
                logger.exception("gpuviz: freeing %#x failed", self.address)


_oom_classes: dict[type, type] = {}


def cupy_out_of_memory(error: OutOfMemoryError) -> OutOfMemoryError:
    """``error`` as an instance that is also a ``cupy.cuda.memory.OutOfMemoryError``, so code
    that catches CuPy's error catches gpuviz's, with gpuviz's fragmentation diagnosis."""
    import cupy

    base = cupy.cuda.memory.OutOfMemoryError
    cls = _oom_classes.get(base)
    if cls is None:
        cls = _oom_classes[base] = type("CupyOutOfMemoryError", (OutOfMemoryError, base), {})
    converted = cls(
        requested=error.requested,
        rounded=error.rounded,
        free=error.free,
        largest_free_chunk=error.largest_free_chunk,
        reservable=error.reservable,
        limit=error.limit,
        device=error.device,
    )
    assert isinstance(converted, OutOfMemoryError)
    return converted


def limit_from_environment() -> tuple[int | None, float | None]:
    """``CUPY_GPU_MEMORY_LIMIT`` as (bytes, fraction): ``"90%"`` is a fraction, else bytes."""
    value = os.environ.get("CUPY_GPU_MEMORY_LIMIT", "").strip()
    if not value:
        return None, None
    if value.endswith("%"):
        try:
            fraction = float(value[:-1]) / 100
        except ValueError:
            raise ValueError(f"CUPY_GPU_MEMORY_LIMIT={value!r} is not a percentage") from None
        return None, fraction
    return parse_bytes(value, name="CUPY_GPU_MEMORY_LIMIT"), None


class CupyAllocator:
    """The callable handed to ``cupy.cuda.set_allocator``: ``allocator(nbytes) -> MemoryPointer``.

    One ``gpuviz.BFCAllocator`` per device, created at the device's first allocation from
    ``upstream(device_id)``; ``current_device()`` says which device CuPy allocates for.
    """

    def __init__(
        self,
        log: EventLog,
        *,
        upstream: Callable[[int], Upstream],
        current_device: Callable[[], int],
        memory_limit: int | str | None = None,
        memory_fraction: float | None = None,
        growth: bool = True,
        garbage_collection: bool = True,
        stacks: bool = False,
    ) -> None:
        import cupy

        self._cupy = cupy
        self.cupy_dir = os.path.dirname(os.path.abspath(cupy.__file__)) + os.sep  # left out of stacks
        self.log = log
        self._upstream = upstream
        self._current_device = current_device
        self._options: dict[str, Any] = {
            "memory_limit": memory_limit,
            "memory_fraction": memory_fraction,
            "growth": growth,
            "garbage_collection": garbage_collection,
            "stacks": stacks,
        }
        self.allocators: dict[int, ReferenceBFCAllocator] = {}

    def allocator_for(self, device_id: int) -> ReferenceBFCAllocator:
        allocator = self.allocators.get(device_id)
        if allocator is None:
            allocator = self.allocators[device_id] = allocator_class()(
                self._upstream(device_id), device=f"GPU:{device_id}", log=self.log, stack_skip=(self.cupy_dir,),
                **self._options,
            )  # fmt: skip
        return allocator

    def __call__(self, nbytes: int) -> Any:
        memory = self._cupy.cuda.memory
        device_id = self._current_device()
        if nbytes == 0:
            return memory.MemoryPointer(memory.UnownedMemory(0, 0, None, device_id), 0)
        allocator = self.allocator_for(device_id)
        try:
            address = allocator.allocate(nbytes)
        except OutOfMemoryError as error:
            raise cupy_out_of_memory(error) from None
        owner = Block(allocator, address)
        return memory.MemoryPointer(memory.UnownedMemory(address, nbytes, owner, device_id), 0)
