"""Writing another allocator's decisions as replayable heap events: rows by keyword, and ``HeapBuilder``.

Foreign traces and what-if policies decide allocations and frees at addresses; gpuviz's log
also records how chunks are cut and joined (``split``, ``merge``) so that replay can rebuild
every segment exactly. ``HeapBuilder`` keeps one device's segments and chunks while an
importer or a policy feeds it decisions, and emits the events that replay needs:

    alloc(a, n) inside the free chunk [f, f+S):
        split(f, a-f)          when a > f        -> [f, a) free, [a, f+S) free
        split(a, n)            when a+n < f+S    -> [a, a+n) free, [a+n, f+S) free
        alloc(a, n)                              -> [a, a+n) in use
    free(a):
        free(a)                                  -> [a, a+n) free
        merge(a, n+m)          when [a+n, a+n+m) is free (the next neighbour first)
        merge(p, p_n+...)      when the previous chunk [p, a) is free
    segment_alloc(b, s) / segment_free(b)        -> one free chunk [b, b+s) / none
    segment_map(a, n):                           (a range mapped into a growing segment)
        segment_map(a, n)                        -> [a, a+n) free; touching segments join
        merge(a, n+m)          when the segment above began with a free chunk [a+n, a+n+m)
        merge(p, p_n+...)      when the segment below ended with a free chunk [p, a)
    segment_unmap(a, n) inside the free chunk [f, f+S):
        split(f, a-f)          when a > f
        split(a, n)            when a+n < f+S
        segment_unmap(a, n)                      -> [a, a+n) gone; its segment shrinks or splits

Invariants (``check``): within each segment chunks tile ``[base, base+size)`` in address
order; no two adjacent chunks are both free after a public operation; ``largest_free`` of
every emitted event equals the largest free chunk replay finds right after that event.

A trace that contradicts itself (an allocation over memory in use, a free of an unknown
address, an allocation outside every segment) raises ``HeapConflict`` and changes nothing;
the caller decides what to do (an importer may seed it, infer a segment, or skip it and say so in ``meta``).

``HeapBuilder`` is ``NativeHeapBuilder`` (the heap in C, ``gpuviz.log._heapcore``, built at
install time where a C compiler exists) unless it is not built or ``GPUVIZ_NATIVE=0``; then
it is ``PythonHeapBuilder``. Both make the same decisions and write the same rows.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right, insort
from typing import TYPE_CHECKING, Any

from gpuviz.base import native as registry
from gpuviz.base.heapstate import ChunkState, HeapState, SegmentState
from gpuviz.log.eventlog import NO_INDEX, EventLog
from gpuviz.log.schema import Kind

__all__ = ["HeapBuilder", "PythonHeapBuilder", "NativeHeapBuilder", "HeapConflict", "event_row"]
__all__ += ["native_heap_available"]

_SEGMENT_ALLOC, _SEGMENT_FREE, _ALLOC, _FREE, _SPLIT, _MERGE, _OOM = (
    int(Kind.SEGMENT_ALLOC), int(Kind.SEGMENT_FREE), int(Kind.ALLOC), int(Kind.FREE),
    int(Kind.SPLIT), int(Kind.MERGE), int(Kind.OOM),
)  # fmt: skip
_SEGMENT_MAP, _SEGMENT_UNMAP = int(Kind.SEGMENT_MAP), int(Kind.SEGMENT_UNMAP)


class HeapConflict(ValueError):
    """The trace contradicts the heap built so far (nothing was emitted or changed)."""


def event_row(
    *,
    time_ns: int,
    kind: int,
    flags: int = 0,
    device: int = NO_INDEX,
    peer: int = NO_INDEX,
    thread: int = 0,
    address: int = 0,
    size: int = 0,
    requested: int = 0,
    segment: int = -1,
    largest_free: int = -1,
    duration_ns: int = 0,
    tag: int = NO_INDEX,
    stack: int = NO_INDEX,
) -> tuple[int, ...]:
    """One row in ``schema.ROW_COLUMNS`` order, for ``EventLog.append`` (see schema.py for each column)."""
    return (time_ns, kind, flags, device, peer, thread, address, size, requested, segment,
            largest_free, duration_ns, tag, stack)  # fmt: skip


_Layout = list[tuple[int, int, list[tuple[int, int, int, int, int]]]]  # see PythonHeapBuilder._layout


class _FreeSizes:
    """A multiset of free chunk sizes with the largest in O(log n) (lazy-deletion max-heap)."""

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self._heap: list[int] = []

    def add(self, size: int) -> None:
        count = self._counts.get(size, 0)
        self._counts[size] = count + 1
        if count == 0:
            heapq.heappush(self._heap, -size)

    def remove(self, size: int) -> None:
        count = self._counts[size] - 1
        if count:
            self._counts[size] = count
        else:
            del self._counts[size]

    def largest(self) -> int:
        heap = self._heap
        while heap and -heap[0] not in self._counts:
            heapq.heappop(heap)
        return -heap[0] if heap else 0


class PythonHeapBuilder:
    """One device's heap, fed with a foreign allocator's decisions, writing gpuviz events into ``log``.

    ``device`` is the index in ``log``'s device table. Times are ns; sizes and addresses bytes.
    ``tag``/``stack`` are indices into the log's string and stack tables (``NO_INDEX`` for none).
    """

    def __init__(self, log: EventLog, device: int) -> None:
        self.log = log
        self.device = device
        self._segments: dict[int, int] = {}  # base -> size
        self._bases: list[int] = []  # sorted segment bases
        self._starts: dict[int, list[int]] = {}  # segment base -> its sorted chunk addresses
        # chunk address -> [size, requested (0 = free), segment base, tag, stack]
        self._chunks: dict[int, list[int]] = {}
        self._free = _FreeSizes()

    # ----------------------------------------------------------------- queries
    def segment_of(self, address: int) -> int | None:
        """Base of the segment holding ``address``, or None."""
        i = bisect_right(self._bases, address) - 1
        if i >= 0:
            base = self._bases[i]
            if address < base + self._segments[base]:
                return base
        return None

    def chunk_at(self, address: int) -> tuple[int, int, int] | None:
        """``(chunk address, size, requested)`` of the chunk containing ``address`` (requested 0: free)."""
        segment = self.segment_of(address)
        if segment is None:
            return None
        starts = self._starts[segment]
        start = starts[bisect_right(starts, address) - 1]
        size, requested, *_ = self._chunks[start]
        return (start, size, requested) if address < start + size else None

    def is_live(self, address: int) -> bool:
        """True when an allocation starts at ``address``."""
        chunk = self._chunks.get(address)
        return chunk is not None and chunk[1] > 0

    def live_size(self, address: int) -> int:
        """Chunk size of the live allocation at ``address`` (``HeapConflict`` when none)."""
        chunk = self._chunks.get(address)
        if chunk is None or chunk[1] == 0:
            raise HeapConflict(f"no live allocation at {address:#x}")
        return chunk[0]

    @property
    def largest_free(self) -> int:
        return self._free.largest()

    @property
    def segments(self) -> dict[int, int]:
        """Segment base -> size (a copy)."""
        return dict(self._segments)

    # ------------------------------------------------------------------ output
    def _emit(self, time_ns: int, kind: int, address: int, size: int, requested: int, segment: int,
              *, thread: int, tag: int = NO_INDEX, stack: int = NO_INDEX, duration_ns: int = 0) -> None:  # fmt: skip
        # the row of event_row(...), built directly: this runs once per imported event
        self.log.append((time_ns, kind, 0, self.device, NO_INDEX, thread, address, size, requested, segment,
                         self._free.largest(), duration_ns, tag, stack))  # fmt: skip

    def _set_free(self, address: int, size: int, segment: int) -> None:
        self._chunks[address] = [size, 0, segment, NO_INDEX, NO_INDEX]
        self._free.add(size)

    # ---------------------------------------------------------------- segments
    def _place(self, address: int, size: int, what: str) -> int:
        """Where a new range ``[address, address+size)`` goes among the sorted segment bases;
        ``HeapConflict`` (``what`` names the operation) when it is empty or overlaps a segment."""
        if size <= 0:
            raise HeapConflict(f"{what} at {address:#x} has size {size}")
        i = bisect_right(self._bases, address)
        if i > 0 and self._bases[i - 1] + self._segments[self._bases[i - 1]] > address:
            raise HeapConflict(f"{what} [{address:#x}, +{size}) overlaps the segment at {self._bases[i - 1]:#x}")
        if i < len(self._bases) and address + size > self._bases[i]:
            raise HeapConflict(f"{what} [{address:#x}, +{size}) overlaps the segment at {self._bases[i]:#x}")
        return i

    def segment_alloc(self, time_ns: int, base: int, size: int, *, thread: int = 0, stack: int = NO_INDEX) -> None:
        """A segment of ``size`` bytes at ``base`` was reserved: one free chunk."""
        i = self._place(base, size, "segment")
        self._bases.insert(i, base)
        self._segments[base] = size
        self._starts[base] = [base]
        self._set_free(base, size, base)
        self._emit(time_ns, _SEGMENT_ALLOC, base, size, 0, base, thread=thread, stack=stack)

    def segment_free(self, time_ns: int, base: int, *, thread: int = 0, stack: int = NO_INDEX) -> None:
        """The segment at ``base`` was returned upstream; it must be wholly free."""
        size = self._segments.get(base)
        if size is None:
            raise HeapConflict(f"no segment at {base:#x}")
        chunk = self._chunks[base]
        if chunk[0] != size or chunk[1]:
            raise HeapConflict(f"segment at {base:#x} is not wholly free")
        del self._segments[base]
        self._bases.remove(base)
        del self._starts[base]
        del self._chunks[base]
        self._free.remove(size)
        self._emit(time_ns, _SEGMENT_FREE, base, size, 0, base, thread=thread, stack=stack)

    def segment_map(self, time_ns: int, address: int, size: int, *, thread: int = 0, stack: int = NO_INDEX) -> None:
        """``size`` bytes at ``address`` were mapped (a growing segment): one free chunk, joined
        with the segments that end at ``address`` or start at ``address + size``."""
        i = self._place(address, size, "mapping")
        below = self._bases[i - 1] if i > 0 else None
        above = self._bases[i] if i < len(self._bases) else None
        if below is not None and below + self._segments[below] == address:
            base = below
            self._segments[base] += size
            self._starts[base].append(address)
        else:
            base = address
            self._bases.insert(i, base)
            self._segments[base] = size
            self._starts[base] = [address]
        self._set_free(address, size, base)
        if above is not None and above == address + size:  # the segment above joins this one
            self._segments[base] += self._segments.pop(above)
            self._bases.remove(above)
            for start in self._starts[above]:
                self._chunks[start][2] = base
            self._starts[base] += self._starts.pop(above)
        self._emit(time_ns, _SEGMENT_MAP, address, size, 0, base, thread=thread, stack=stack)
        end = address + size
        if end < base + self._segments[base] and self._chunks[end][1] == 0:
            self._merge(time_ns, address, thread)
        if address > base:
            starts = self._starts[base]
            previous = starts[bisect_right(starts, address) - 2]
            if self._chunks[previous][1] == 0:
                self._merge(time_ns, previous, thread)

    def segment_unmap(self, time_ns: int, address: int, size: int, *, thread: int = 0, stack: int = NO_INDEX) -> None:
        """``size`` bytes at ``address`` were unmapped; the range must lie in one free chunk. Its
        segment shrinks, or splits in two when the range is inside it."""
        self._cut_out(time_ns, address, size, thread, "unmapping")
        base = self._chunks.pop(address)[2]
        self._free.remove(size)
        starts = self._starts[base]
        k = bisect_right(starts, address) - 1
        upper_starts = starts[k + 1 :]
        del starts[k:]
        end = base + self._segments[base]
        if address > base:
            self._segments[base] = address - base
        else:
            del self._segments[base]
            del self._starts[base]
            self._bases.remove(base)
        if address + size < end:
            upper = address + size
            insort(self._bases, upper)
            self._segments[upper] = end - upper
            self._starts[upper] = upper_starts
            for chunk in upper_starts:
                self._chunks[chunk][2] = upper
        self._emit(time_ns, _SEGMENT_UNMAP, address, size, 0, base, thread=thread, stack=stack)

    # ---------------------------------------------------------------- chunks
    def _split(self, time_ns: int, address: int, first: int, thread: int) -> None:
        size, _, segment, *_ = self._chunks[address]
        self._free.remove(size)
        self._set_free(address, first, segment)
        self._set_free(address + first, size - first, segment)
        insort(self._starts[segment], address + first)
        self._emit(time_ns, _SPLIT, address, first, 0, segment, thread=thread)

    def _cut_out(self, time_ns: int, address: int, size: int, thread: int, what: str) -> None:
        """Split the free chunk holding ``[address, address+size)`` so that the range is one free
        chunk; ``HeapConflict`` (nothing changed) when it is not inside one free chunk. ``what``
        names the operation in the messages."""
        if size <= 0:
            raise HeapConflict(f"{what} at {address:#x} has size {size}")
        found = self.chunk_at(address)
        if found is None:
            raise HeapConflict(f"{what} [{address:#x}, +{size}) lies outside every segment")
        start, free_size, used = found
        if used:
            raise HeapConflict(f"{what} at {address:#x} overlaps the live allocation at {start:#x}")
        if address + size > start + free_size:
            raise HeapConflict(f"{what} [{address:#x}, +{size}) runs past the free chunk at {start:#x}")
        if address > start:
            self._split(time_ns, start, address - start, thread)
        if size < self._chunks[address][0]:
            self._split(time_ns, address, size, thread)

    def alloc(self, time_ns: int, address: int, size: int, requested: int, *, thread: int = 0,
              tag: int = NO_INDEX, stack: int = NO_INDEX) -> None:  # fmt: skip
        """``size`` bytes (the chunk) at ``address`` were handed out for a request of ``requested`` bytes.

        The range must lie inside one free chunk of a segment (``HeapConflict`` otherwise).
        ``requested`` is stored as at least 1 so that an in-use chunk is never mistaken for free.
        """
        self._cut_out(time_ns, address, size, thread, "allocation")
        chunk = self._chunks[address]
        self._free.remove(size)
        chunk[1], chunk[3], chunk[4] = max(requested, 1), tag, stack
        self._emit(time_ns, _ALLOC, address, size, chunk[1], chunk[2], thread=thread, tag=tag, stack=stack)

    def free(self, time_ns: int, address: int, *, thread: int = 0, duration_ns: int = 0,
             stack: int | None = None) -> int:  # fmt: skip
        """The allocation at ``address`` was freed; coalesces with free neighbours. Returns its chunk size.

        ``duration_ns``: how long the free took, where the source says (e.g. from PyTorch's
        free request to its completion); ``stack``: the freeing call site, where the source
        records one (as gpuviz's own capture does), else the allocation's.
        """
        chunk = self._chunks.get(address)
        if chunk is None or chunk[1] == 0:
            raise HeapConflict(f"free of {address:#x}, which is not a live allocation")
        size, requested, segment, tag, alloc_stack = chunk
        stack = alloc_stack if stack is None else stack
        self._set_free(address, size, segment)
        self._emit(
            time_ns,
            _FREE,
            address,
            size,
            requested,
            segment,
            thread=thread,
            tag=tag,
            stack=stack,
            duration_ns=duration_ns,
        )
        end = segment + self._segments[segment]
        nxt = address + size
        if nxt < end and self._chunks[nxt][1] == 0:
            self._merge(time_ns, address, thread)
        starts = self._starts[segment]
        i = bisect_right(starts, address) - 1
        if i > 0:
            previous = starts[i - 1]
            if self._chunks[previous][1] == 0:
                self._merge(time_ns, previous, thread)
        return size

    def _merge(self, time_ns: int, address: int, thread: int) -> None:
        """Join the free chunk at ``address`` with its free upper neighbour."""
        size, _, segment, *_ = self._chunks[address]
        upper = address + size
        upper_size = self._chunks.pop(upper)[0]
        starts = self._starts[segment]
        starts.pop(bisect_right(starts, upper) - 1)
        self._free.remove(size)
        self._free.remove(upper_size)
        self._set_free(address, size + upper_size, segment)
        self._emit(time_ns, _MERGE, address, size + upper_size, 0, segment, thread=thread)

    def oom(self, time_ns: int, requested: int, rounded: int, *, thread: int = 0, tag: int = NO_INDEX,
            stack: int = NO_INDEX) -> None:  # fmt: skip
        """An allocation of ``requested`` bytes (``rounded`` after the source's rounding) failed."""
        self._emit(time_ns, _OOM, 0, rounded, requested, -1, thread=thread, tag=tag, stack=stack)

    # ---------------------------------------------------------------- checking
    def _layout(self) -> _Layout:
        """Each segment (base, size, its chunks as (address, size, requested, tag, stack)) in address order."""
        layout: _Layout = []
        for base in self._bases:
            chunks = []
            for address in self._starts[base]:
                size, requested, _, tag, stack = self._chunks[address]
                chunks.append((address, size, requested, tag, stack))
            layout.append((base, self._segments[base], chunks))
        return layout

    def state(self) -> HeapState:
        """The heap built so far, as replay would show it."""
        return _state(self.log, self.device, self._layout())

    def check(self) -> None:
        """Raise ``InvariantError`` if the heap breaks an invariant (see the module docstring)."""
        self.state().check()


def _state(log: EventLog, device: int, layout: _Layout) -> HeapState:
    strings = log.strings
    segments = []
    for base, size, chunks in layout:
        states = tuple(
            ChunkState(address, chunk, requested, requested > 0, strings[tag] if tag >= 0 else None, stack)
            for address, chunk, requested, tag, stack in chunks
        )
        segments.append(SegmentState(base, size, states))
    return HeapState(log.devices[device].name, tuple(segments))


_MODULE = "gpuviz.log._heapcore"
_core_module = registry.load(_MODULE)  # None where it was not built
_Core: Any = None if _core_module is None else _core_module.Core


class NativeHeapBuilder(_Core if _Core is not None else object):  # type: ignore[misc]
    """``PythonHeapBuilder`` with the heap in C: the same methods, decisions, rows and errors."""

    def __init__(self, log: EventLog, device: int) -> None:
        if _Core is None:
            raise RuntimeError("the native heap builder is not built (gpuviz was installed without a C compiler)")
        staged, limit = log.row_sink()
        super().__init__(staged, limit, log.flush_staged, device, HeapConflict)
        self.log = log
        self.device = device

    @property
    def largest_free(self) -> int:
        return int(self._largest_free())

    @property
    def segments(self) -> dict[int, int]:
        """Segment base -> size (a copy)."""
        return {base: size for base, size, _ in self._layout()}

    def state(self) -> HeapState:
        """The heap built so far, as replay would show it."""
        return _state(self.log, self.device, self._layout())

    def check(self) -> None:
        """Raise ``InvariantError`` if the heap breaks an invariant (see the module docstring)."""
        self.state().check()


def native_heap_available() -> bool:
    """Whether ``HeapBuilder`` is the native one (built, loaded, not switched off: ``gpuviz.base.native``)."""
    return _Core is not None and registry.available(_MODULE)


if TYPE_CHECKING:
    HeapBuilder = PythonHeapBuilder
else:
    HeapBuilder = NativeHeapBuilder if native_heap_available() else PythonHeapBuilder
