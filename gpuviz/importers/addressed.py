"""Traces of allocations and frees at addresses, with no segments: PyTorch profiler traces, RMM logs.

Such a trace starts in the middle of a run: memory allocated before it began shows up
only as frees of addresses never allocated in the trace, or as a running total that does
not start at zero. ``prepare`` gives a device's ``HeapBuilder`` what it needs before the
first event: inferred segments (the connected address ranges ever used), the allocations
freed in the trace but made before it (seeded at their addresses, tagged ``PREEXISTING``)
and, when the source reports the bytes in use before its first event, the rest of those
bytes as one ``PREEXISTING`` allocation in a segment of its own after the traced ones.

Traces without addresses (PyTorch's 2021 profiler schema, its memory timeline) go through
``Unaddressed``: synthetic addresses, one segment per allocation, frees paired LIFO.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import NamedTuple

from gpuviz.importers.builder import HeapBuilder, HeapConflict, infer_segments
from gpuviz.log.eventlog import NO_INDEX

__all__ = ["Change", "PREEXISTING", "prepare", "apply", "Unaddressed", "unmatched_frees"]

PREEXISTING = "PREEXISTING"
_SEGMENT_ALIGN = 2 << 20  # the synthetic preexisting segment starts on a 2 MiB boundary


class Change(NamedTuple):
    """One traced allocation (``delta`` > 0 bytes) or free (``delta`` < 0) at ``address``; time in ns."""

    time_ns: int
    address: int
    delta: int
    thread: int = 0
    tag: int = -1  # an allocation's tag (string index), -1 none
    stack: int = -1  # an allocation's stack (stack index), -1 none


def prepare(
    heap: HeapBuilder, changes: Iterable[Change], *, start_ns: int, in_use_before: int | None = None
) -> list[str]:
    """Reserve the inferred segments and seed the allocations live before the trace, at ``start_ns``.

    ``changes`` are the device's allocations and frees in time order; ``in_use_before`` is the
    bytes the source says were in use before its first change (None when it does not say).
    Returns notes (in words) on what was inferred.
    """
    live: dict[int, int] = {}
    seeds: list[tuple[int, int]] = []
    extent: dict[int, int] = {}  # address -> the largest size ever used there
    for change in changes:
        size = abs(change.delta)
        if change.delta > 0:
            live[change.address] = size
        elif change.delta < 0 and live.pop(change.address, None) is None:
            seeds.append((change.address, size))
        if size > extent.get(change.address, 0):
            extent[change.address] = size
    segments = infer_segments(extent.items())
    tag = heap.log.intern_string(PREEXISTING)
    for base, size in segments:
        heap.segment_alloc(start_ns, base, size)
    for address, size in seeds:
        heap.alloc(start_ns, address, size, size, tag=tag)
    name = heap.log.devices[heap.device].name
    notes = []
    if seeds:
        notes.append(
            f"{name}: {len(seeds)} allocations freed in the trace were made before it began;"
            f" seeded as {PREEXISTING} at their addresses"
        )
    rest = 0 if in_use_before is None else in_use_before - sum(size for _, size in seeds)
    if rest > 0:
        end = max((base + size for base, size in segments), default=0)
        base = -(-end // _SEGMENT_ALIGN) * _SEGMENT_ALIGN + _SEGMENT_ALIGN
        heap.segment_alloc(start_ns, base, rest)
        heap.alloc(start_ns, base, rest, rest, tag=tag)
        notes.append(
            f"{name}: {rest} bytes were in use before the trace began and never freed in it; shown as one"
            f" {PREEXISTING} allocation in a segment of its own at {base:#x} (their addresses are unknown)"
        )
    return notes


def apply(heap: HeapBuilder, change: Change) -> bool:
    """Feed one change to ``heap`` (chunk size = requested = the traced bytes); False when it
    contradicts the heap (nothing changed)."""
    try:
        if change.delta > 0:
            heap.alloc(change.time_ns, change.address, change.delta, change.delta, thread=change.thread,
                       tag=change.tag, stack=change.stack)  # fmt: skip
        elif change.delta < 0:
            heap.free(change.time_ns, change.address, thread=change.thread)
    except HeapConflict:
        return False
    return True


class Unaddressed:
    """A device's allocations known by size only (no addresses): each gets a synthetic address
    (from ``base`` up, 512-byte aligned, never reused) in a segment of its own, so reserved
    equals in use and no fragmentation is invented; a free is paired with the latest live
    allocation of the same ``key`` (LIFO; the key is the size, or the size and a category)."""

    ALIGN = 512

    def __init__(self, heap: HeapBuilder, *, base: int = 1 << 40) -> None:
        self.heap = heap
        self._next = base
        self._live: dict[Hashable, list[int]] = {}

    def alloc(self, time_ns: int, size: int, key: Hashable, *, tag: int = NO_INDEX, thread: int = 0,
              stack: int = NO_INDEX) -> int:  # fmt: skip
        """Allocate ``size`` bytes (> 0); returns the synthetic address."""
        address = self._next
        self._next += -(-size // self.ALIGN) * self.ALIGN
        self.heap.segment_alloc(time_ns, address, size, thread=thread)
        self.heap.alloc(time_ns, address, size, size, thread=thread, tag=tag, stack=stack)
        self._live.setdefault(key, []).append(address)
        return address

    def free(self, time_ns: int, key: Hashable, *, thread: int = 0) -> bool:
        """Free the latest live allocation of ``key``; False when none is live."""
        stack = self._live.get(key)
        if not stack:
            return False
        address = stack.pop()
        self.heap.free(time_ns, address, thread=thread)
        self.heap.segment_free(time_ns, address, thread=thread)
        return True

    def rekey(self, old: Hashable, new: Hashable) -> bool:
        """The latest live allocation of ``old`` is now one of ``new`` (no event); False when none is live."""
        stack = self._live.get(old)
        if not stack:
            return False
        self._live.setdefault(new, []).append(stack.pop())
        return True


def unmatched_frees(deltas: Iterable[tuple[Hashable, int]]) -> list[tuple[Hashable, int]]:
    """``(key, bytes)`` of the frees (negative deltas) that no earlier allocation of the same key matches:
    allocations made before the trace began."""
    live: dict[Hashable, int] = {}
    unmatched = []
    for key, delta in deltas:
        if delta > 0:
            live[key] = live.get(key, 0) + 1
        elif delta < 0:
            if live.get(key):
                live[key] -= 1
            else:
                unmatched.append((key, -delta))
    return unmatched
