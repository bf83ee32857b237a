"""Exceptions that are part of gpuviz's API."""

from __future__ import annotations

from gpuviz.base.units import format_bytes

__all__ = ["GpuvizError", "OutOfMemoryError", "InvalidFreeError", "LogFormatError", "InvariantError"]


class GpuvizError(Exception):
    """Base class of gpuviz's own errors."""


class InvalidFreeError(GpuvizError, ValueError):
    """``free`` was given an address that is not a live allocation (unknown, or freed twice)."""


class InvariantError(GpuvizError, AssertionError):
    """``check()`` found a breach of an allocator invariant (a bug in gpuviz)."""


class LogFormatError(GpuvizError, ValueError):
    """A file is not a gpuviz event log, or is of a format version this gpuviz cannot read."""


class OutOfMemoryError(GpuvizError, MemoryError):
    """An allocation could not be satisfied.

    Attributes (all in bytes):
        requested: bytes the caller asked for.
        rounded: the request rounded up to the allocator's granularity (256 B).
        free: bytes reserved from the device but not in use (pool bytes - bytes in use).
        largest_free_chunk: the largest contiguous free chunk in the pool.
        reservable: bytes that could still be reserved from the device under the memory limit.
        limit: the allocator's memory limit.
        device: the device name, e.g. ``"GPU:0"``.
        fragmentation: True when enough bytes are free in total but no single chunk is large
            enough, i.e. the OOM is caused by fragmentation.
    """

    def __init__(
        self,
        *,
        requested: int,
        rounded: int,
        free: int,
        largest_free_chunk: int,
        reservable: int,
        limit: int,
        device: str,
    ) -> None:
        self.requested = requested
        self.rounded = rounded
        self.free = free
        self.largest_free_chunk = largest_free_chunk
        self.reservable = reservable
        self.limit = limit
        self.device = device
        self.fragmentation = free + reservable >= rounded and rounded <= limit
        MemoryError.__init__(self, self._message())  # not super(): a CuPy-compatible subclass mixes in CuPy's error

    def _message(self) -> str:
        fb = format_bytes
        head = f"{self.device}: out of memory allocating {fb(self.requested)} (rounded to {self.rounded} bytes)."
        facts = (
            f" Free in the pool: {fb(self.free)}; largest free chunk: {fb(self.largest_free_chunk)};"
            f" still reservable from the device: {fb(self.reservable)}; memory limit: {fb(self.limit)}."
        )
        if self.rounded > self.limit:
            cause = (
                " The request is larger than the memory limit itself: raise the limit"
                " (memory_limit / memory_fraction) or split the data into smaller pieces."
            )
        elif self.fragmentation:
            cause = (
                " Cause: fragmentation - enough bytes are free in total, but no contiguous chunk"
                " is large enough. Try allocating the largest buffers first, freeing long-lived"
                " small buffers that sit between free regions, enabling garbage_collection, or"
                " releasing memory between experiments."
            )
        else:
            cause = (
                " Cause: not enough memory - live allocations use too much of the limit. Try a"
                " smaller batch, freeing arrays you no longer need, lower precision (e.g. float32"
                " instead of float64), or a larger memory limit."
            )
        return head + facts + cause
