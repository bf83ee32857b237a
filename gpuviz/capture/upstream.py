"""Upstreams: where an allocator gets its segments (big regions of device memory).

An upstream is anything with ``capacity`` (bytes), ``allocate(nbytes) -> address`` (raises
``MemoryError`` when it cannot) and ``free(address)``. ``SimUpstream`` simulates a device;
the CuPy upstream calls cudaMalloc/cudaFree.
"""

from __future__ import annotations

import contextlib
import mmap
import threading
from bisect import bisect_left, bisect_right, insort
from typing import Protocol, runtime_checkable

import numpy as np

from gpuviz.base.units import parse_bytes

__all__ = ["Upstream", "SimUpstream", "UpstreamOutOfMemory", "SIM_BASE"]

SIM_BASE = 1 << 40
"""Address of the first byte of a simulated device (as TensorFlow's BFC tests use)."""


class UpstreamOutOfMemory(MemoryError):
    """The upstream cannot provide the requested region (the device itself is full)."""


@runtime_checkable
class Upstream(Protocol):
    """Where segments come from. Sizes and addresses are in bytes."""

    @property
    def capacity(self) -> int: ...

    def allocate(self, nbytes: int) -> int: ...

    def free(self, address: int) -> None: ...


class SimUpstream:
    """A simulated device of ``capacity`` bytes whose addresses start at ``base``.

    Regions are placed first-fit by address, so addresses are deterministic: the first
    region is at ``base``, a freed hole is reused by the next region that fits. The
    device's capacity is enforced on the total reserved bytes.

    With ``backed=True`` each region is backed by an anonymous memory map of its size,
    so data can be stored and copied (``buffer(address, nbytes)``); pages cost host memory
    only once touched, so a large preallocated region is cheap until used.
    """

    def __init__(self, capacity: int | str = "16GiB", *, base: int = SIM_BASE, backed: bool = False) -> None:
        self._capacity = parse_bytes(capacity, name="capacity")
        if self._capacity <= 0:
            raise ValueError("capacity must be positive")
        if base < 0 or base % 256:
            raise ValueError(f"base must be a non-negative multiple of 256, got {base}")
        self.base = base
        self.backed = backed
        self._lock = threading.Lock()
        self._regions: dict[int, int] = {}  # address -> size
        self._starts: list[int] = []  # sorted region addresses
        # free gaps between regions, by address (first fit scans these, not every region);
        # everything from ``_tail`` up is free too
        self._holes: list[int] = []
        self._hole_size: dict[int, int] = {}
        self._tail = base
        self._maps: dict[int, mmap.mmap] = {}
        self._arrays: dict[int, np.ndarray] = {}  # the bytes of each map (views over them are cheap to make)
        self._last: tuple[int, int, np.ndarray] | None = None  # (start, end, bytes) of the last region mapped
        self.reserved = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def allocate(self, nbytes: int) -> int:
        """Reserve ``nbytes`` and return the lowest address where they fit."""
        if nbytes <= 0:
            raise ValueError(f"upstream allocation size must be positive, got {nbytes}")
        with self._lock:
            if self.reserved + nbytes > self._capacity:
                raise UpstreamOutOfMemory(
                    f"simulated device is full: {nbytes} bytes requested, "
                    f"{self._capacity - self.reserved} of {self._capacity} free"
                )
            address = self._tail
            for i, hole in enumerate(self._holes):
                size = self._hole_size[hole]
                if size >= nbytes:
                    address = hole
                    del self._hole_size[hole]
                    if size > nbytes:
                        self._holes[i] = hole + nbytes
                        self._hole_size[hole + nbytes] = size - nbytes
                    else:
                        del self._holes[i]
                    break
            else:
                self._tail = address + nbytes
            if self.backed:
                flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20) | getattr(mmap, "MAP_NORESERVE", 0)
                self._maps[address] = mmap.mmap(-1, nbytes, flags=flags)
                self._arrays[address] = np.frombuffer(self._maps[address], dtype=np.uint8)
            self._regions[address] = nbytes
            insort(self._starts, address)
            self.reserved += nbytes
            return address

    def free(self, address: int) -> None:
        """Return the region at ``address``; ``ValueError`` if no region starts there."""
        with self._lock:
            size = self._regions.pop(address, None)
            if size is None:
                raise ValueError(f"simulated device: no region starts at {address:#x}")
            del self._starts[bisect_left(self._starts, address)]
            self.reserved -= size
            self._release_range(address, size)
            region = self._maps.pop(address, None)
            self._arrays.pop(address, None)
            self._last = None
        if region is not None:
            with contextlib.suppress(BufferError):  # a caller still holds a view; the map goes with it
                region.close()

    def _release_range(self, address: int, size: int) -> None:
        """Make ``[address, address + size)`` free: join the gaps around it, or the tail."""
        i = bisect_right(self._holes, address)
        if i > 0 and self._holes[i - 1] + self._hole_size[self._holes[i - 1]] == address:
            i -= 1
            address = self._holes.pop(i)
            size += self._hole_size.pop(address)
        end = address + size
        if end == self._tail:
            self._tail = address
            return
        if i < len(self._holes) and self._holes[i] == end:
            size += self._hole_size.pop(self._holes.pop(i))
        self._holes.insert(i, address)
        self._hole_size[address] = size

    def regions(self) -> list[tuple[int, int]]:
        """``(address, size)`` of every reserved region, by address."""
        with self._lock:
            return [(a, self._regions[a]) for a in self._starts]

    def buffer(self, address: int, nbytes: int) -> memoryview:
        """Writable bytes ``[address, address + nbytes)`` of a backed region."""
        region, offset = self.mapped(address, nbytes)
        return region[offset : offset + nbytes].data

    def mapped(self, address: int, nbytes: int) -> tuple[np.ndarray, int]:
        """The host memory backing ``[address, address + nbytes)`` of a backed region: its
        region's bytes (a ``uint8`` array over its map) and the byte offset in them (an array
        over them is one ``np.ndarray`` constructor call, cheaper over an array than over a map)."""
        last = self._last  # most arrays of a loop live in one region: no lock, no search
        if last is not None and last[0] <= address and address + nbytes <= last[1] and nbytes >= 0:
            return last[2], address - last[0]
        if not self.backed:
            raise RuntimeError("this SimUpstream is not backed by host memory (create it with backed=True)")
        with self._lock:
            index = bisect_right(self._starts, address) - 1
            start = self._starts[index] if index >= 0 else -1
            if start < 0 or address + nbytes > start + self._regions[start] or nbytes < 0:
                raise ValueError(f"[{address:#x}, +{nbytes}) is not inside a reserved region")
            self._last = (start, start + self._regions[start], self._arrays[start])
            return self._arrays[start], address - start

    def __repr__(self) -> str:
        return f"SimUpstream(capacity={self._capacity}, base={self.base:#x}, reserved={self.reserved})"
