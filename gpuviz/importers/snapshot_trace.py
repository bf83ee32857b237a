"""One device's trace of a PyTorch snapshot turned into events (``DeviceTrace``): the heap alive
when the trace began, seeded from the final segments; each action of the trace, in order, fed
into a ``HeapBuilder`` (block sizes by PyTorch's rules); and the entries' times
(``trace_times``). ``gpuviz.importers.torch_snapshot`` reads the file and builds the log.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

import numpy as np

from gpuviz.base.errors import LogFormatError
from gpuviz.base.torch_rules import FREE_REQUESTED_MARK, CachingRules
from gpuviz.importers.builder import HeapBuilder, HeapConflict, event_row
from gpuviz.importers.snapshot_reader import (
    ACTIONS,
    HAS_ADDR,
    HAS_BLOCK_SIZE,
    HAS_SIZE,
    HAS_TIME,
    OTHER,
    Stacks,
    TraceColumns,
)
from gpuviz.log.eventlog import NO_INDEX, EventLog
from gpuviz.log.schema import Kind, MarkPhase
from gpuviz.log.segments import map_range, unmap_range

__all__ = ["ALLOCATOR", "US", "DeviceTrace", "trace_times"]

ALLOCATOR = "pytorch-caching"  # the ``allocator`` option of every device of an imported snapshot
US = 1000  # ns per µs: time_us -> time_ns, and the spacing of entries without times
_MARK = int(Kind.MARK)
(_ALLOC, _FREE_REQUESTED, _FREE_COMPLETED, _SEGMENT_ALLOC, _SEGMENT_FREE, _SEGMENT_MAP, _SEGMENT_UNMAP, _OOM,
 _SNAPSHOT) = range(len(ACTIONS))  # fmt: skip
_SEGMENT_ACTIONS = (_SEGMENT_ALLOC, _SEGMENT_FREE, _SEGMENT_MAP, _SEGMENT_UNMAP)
_NEEDS_ADDR = (_ALLOC, _FREE_REQUESTED, _FREE_COMPLETED, *_SEGMENT_ACTIONS)
_NEEDS_SIZE = (_ALLOC, _SEGMENT_ALLOC, _SEGMENT_MAP, _SEGMENT_UNMAP)
_BLOCK = 1 << 10  # entries turned into Python values at a time (their ints: ~0.2 MB)
_BLOCK_SIZES = 1 << 16  # block sizes remembered per device (the same requests and free blocks recur)


def _require(trace: TraceColumns, actions: tuple[int, ...], bit: int, key: str, device: int) -> None:
    """``LogFormatError`` naming the first entry of ``actions`` without ``key``."""
    missing = np.flatnonzero(np.isin(trace.action, actions) & ((trace.flags & bit) == 0))
    if len(missing):
        position = int(missing[0])
        raise LogFormatError(f"trace entry {position} of device {device} ({ACTIONS[trace.action[position]]}) "
                             f"has no {key!r}")  # fmt: skip


class DeviceTrace:
    """One device's trace (columns), fed into a HeapBuilder."""

    def __init__(self, log: EventLog, index: int, trace: TraceColumns, segments: list[dict[str, Any]],
                 rules: CachingRules, stacks: Stacks) -> None:  # fmt: skip
        _require(trace, _NEEDS_ADDR, HAS_ADDR, "addr", index)
        _require(trace, _NEEDS_SIZE, HAS_SIZE, "size", index)
        self.log = log
        self.index = index
        self.trace = trace
        self.final_segments = segments
        self.rules = rules
        self.stacks = stacks
        self.device = log.add_device(f"GPU:{index}", allocator=ALLOCATOR)
        self.heap = HeapBuilder(log, self.device)
        self.conflicts: list[str] = []
        self.initial_blocks = 0
        self.initial_segments = 0
        self.pending_frees = 0
        self.exact_sizes = 0  # allocs whose entry carried the block size
        self.timed = False  # whether the entries' time_us are the log's times
        self.skipped_actions: dict[str, int] = {}
        self.follow = np.zeros(0, np.int64)
        self._block_sizes: dict[tuple[int, int], int] = {}  # (free block, requested) -> block size

    # ----------------------------------------------------------- the start
    def seed(self, time_ns: int) -> None:
        """Emit the segments and allocations alive when the trace began (see the module docstring)."""
        trace = self.trace
        initial: dict[int, tuple[int, int | None, int]] = {}  # address -> (requested, block size or None, stack)
        # allocations and frees: an address whose first event is a free was allocated before the trace;
        # one whose last event is an alloc is live at its end
        used = np.flatnonzero((trace.action == _ALLOC) | (trace.action == _FREE_COMPLETED))
        used_addresses, first_use = np.unique(trace.addr[used], return_index=True)
        _, from_end = np.unique(trace.addr[used][::-1], return_index=True)
        last_use = len(used) - 1 - from_end
        live = set(used_addresses[trace.action[used[last_use]] == _ALLOC].tolist())
        freed_first = used[first_use[trace.action[used[first_use]] == _FREE_COMPLETED]]
        unsized = freed_first[(trace.flags[freed_first] & HAS_SIZE) == 0]
        if len(unsized):
            position = int(unsized.min())
            raise LogFormatError(f"trace entry {position} of device {self.index} (free_completed) has no 'size'")
        for address, size in zip(trace.addr[freed_first].tolist(), trace.size[freed_first].tolist(), strict=True):
            initial[address] = (size, None, NO_INDEX)
        segments = self._initial_segments()
        seen: set[int] = set()  # the block lists read: one that several segments share is read once
        for segment in self.final_segments:
            blocks = segment.get("blocks", ())
            if id(blocks) in seen:
                continue
            seen.add(id(blocks))
            for block in blocks:
                if block.get("state", "inactive") != "inactive" and block["address"] not in live:
                    stack = self.stacks.index(block.get("frames"))
                    initial[int(block["address"])] = (int(block.get("requested_size", 0)), int(block["size"]), stack)
        addresses = sorted(initial)
        placed = 0
        for base in sorted(segments):
            end = base + segments[base]
            self.heap.segment_alloc(time_ns, base, segments[base])
            first = bisect_left(addresses, base)
            last = bisect_left(addresses, end)
            for i in range(first, last):
                address = addresses[i]
                requested, size, stack = initial[address]
                boundary = addresses[i + 1] if i + 1 < last else end
                if size is None:
                    size = self.rules.block_size(boundary - address, requested)
                try:
                    self.heap.alloc(time_ns, address, size, requested, stack=stack)
                except HeapConflict as exc:
                    self._conflict("initially allocated block", exc)
                    continue
                placed += 1
        if placed < len(initial):
            self.conflicts.append(f"{len(initial) - placed} allocations alive at the start lie outside every segment")
        self.initial_blocks = placed
        self.initial_segments = len(segments)

    def _initial_segments(self) -> dict[int, int]:
        """Segment base -> size (bytes) when the trace began."""
        trace = self.trace
        segment_events = np.flatnonzero(np.isin(trace.action, _SEGMENT_ACTIONS))
        final = {int(s["address"]): int(s["total_size"]) for s in self.final_segments}
        if np.isin(trace.action[segment_events], (_SEGMENT_MAP, _SEGMENT_UNMAP)).any():
            # ranges mapped and unmapped: undo every segment action, from the last, on the final segments
            segments = dict(final)
            for position in segment_events[::-1].tolist():
                action, address, size = (
                    int(trace.action[position]),
                    int(trace.addr[position]),
                    int(trace.size[position]),
                )
                if action == _SEGMENT_FREE and not trace.flags[position] & HAS_SIZE:
                    raise LogFormatError(f"trace entry {position} of device {self.index} has no 'size'")
                try:
                    if action == _SEGMENT_ALLOC:
                        del segments[address]
                    elif action == _SEGMENT_FREE:
                        segments[address] = size
                    elif action == _SEGMENT_MAP:
                        unmap_range(segments, address, size)
                    else:
                        map_range(segments, address, size)
                except KeyError:
                    self.conflicts.append(
                        f"GPU:{self.index} trace entry {position} ({ACTIONS[action]}) does not match the segments "
                        "after it; the segments at the start may be wrong"
                    )
            return segments
        bases, first_event = np.unique(trace.addr[segment_events], return_index=True)
        first_segment_event = dict(zip(bases.tolist(), segment_events[first_event].tolist(), strict=True))
        segments = {base: size for base, size in final.items() if base not in first_segment_event}
        for address, position in first_segment_event.items():
            if trace.action[position] == _SEGMENT_FREE:
                if not trace.flags[position] & HAS_SIZE:
                    raise LogFormatError(f"trace entry {position} of device {self.index} has no 'size'")
                segments[address] = int(trace.size[position])
        return segments

    # ------------------------------------------------------------ the trace
    def _follow(self, times: np.ndarray) -> np.ndarray:
        """Per entry: for a free_requested, 1 when its free_completed comes next (same address);
        for a free_completed, ns since the free_requested right before it (0 when none or untimed)."""
        t = self.trace
        follow = np.zeros(len(t), np.int64)
        if len(t) < 2:
            return follow
        same = (t.addr[1:] == t.addr[:-1]) & ((t.flags[1:] & t.flags[:-1] & HAS_ADDR) != 0)
        requested = t.action[:-1] == _FREE_REQUESTED
        completed = t.action[1:] == _FREE_COMPLETED
        follow[:-1][requested & completed & same] = 1
        if self.timed:
            pairs = np.flatnonzero(requested & completed & same & ((t.flags[:-1] & HAS_TIME) != 0)) + 1
            follow[pairs] = np.maximum(0, times[pairs] - t.time_us[pairs - 1] * US)
        return follow

    def prepare(self, times: np.ndarray) -> None:
        """Derive what ``rows`` needs from the entries' times, then drop the columns it does not need."""
        t = self.trace
        self.follow = self._follow(times)
        t.time_us = t.time_us[:0]
        if not (t.flags & HAS_BLOCK_SIZE).any():
            t.block_size = np.broadcast_to(np.int64(0), t.block_size.shape)

    def blocks(self, times: np.ndarray) -> Iterator[Iterator[tuple[int, int, tuple[int, ...]]]]:
        """The entries in blocks of ``(position, time_ns, row)``, a row being the entry's action,
        flags, addr, size, block_size, stack and follow (see ``_follow``); after ``prepare``."""
        t = self.trace
        follow = self.follow
        for start in range(0, len(t), _BLOCK):
            end = start + _BLOCK
            columns = (t.action[start:end].tolist(), t.flags[start:end].tolist(), t.addr[start:end].tolist(),
                       t.size[start:end].tolist(), t.block_size[start:end].tolist(), t.stack[start:end].tolist(),
                       follow[start:end].tolist())  # fmt: skip
            yield zip(range(start, end), times[start:end].tolist(), zip(*columns, strict=True), strict=False)

    def rows(self, times: np.ndarray) -> Iterator[tuple[int, int, int, tuple[int, ...]]]:
        """``(time_ns, device index, position, row)`` in trace order (for merging devices)."""
        index = self.index
        for block in self.blocks(times):
            for position, time_ns, row in block:
                yield time_ns, index, position, row

    def apply(self, time_ns: int, position: int, row: tuple[int, ...]) -> None:
        action, flags, address, size, block_size, stack, follow = row
        heap = self.heap
        try:
            if action == _ALLOC:
                found = heap.chunk_at(address)
                if found is None or found[2]:
                    raise HeapConflict(f"alloc at {address:#x}: no free block there")
                start, free_size, _ = found
                if flags & HAS_BLOCK_SIZE and block_size > 0:  # written by gpuviz's exporter: the chunk it recorded
                    self.exact_sizes += 1
                    chunk = block_size
                else:
                    key = (start + free_size - address, size)
                    chunk = self._block_sizes.get(key, 0)
                    if not chunk:
                        if len(self._block_sizes) > _BLOCK_SIZES:
                            self._block_sizes.clear()
                        chunk = self._block_sizes[key] = self.rules.block_size(*key)
                heap.alloc(time_ns, address, chunk, size, stack=self.stacks.final(stack))
            elif action == _FREE_COMPLETED:
                heap.free(time_ns, address, duration_ns=follow, stack=self.stacks.final(stack))
            elif action == _FREE_REQUESTED:
                if not follow:
                    self.pending_frees += 1
                    self._mark(time_ns, FREE_REQUESTED_MARK, flags, address, size, stack)
            elif action == _SEGMENT_ALLOC:
                heap.segment_alloc(time_ns, address, size, stack=self.stacks.final(stack))
            elif action == _SEGMENT_FREE:
                heap.segment_free(time_ns, address)
            elif action == _SEGMENT_MAP:
                heap.segment_map(time_ns, address, size, stack=self.stacks.final(stack))
            elif action == _SEGMENT_UNMAP:
                heap.segment_unmap(time_ns, address, size, stack=self.stacks.final(stack))
            elif action == _OOM:
                requested = size if flags & HAS_SIZE else 0
                heap.oom(time_ns, requested, self.rules.round_size(requested), stack=self.stacks.final(stack))
            elif action == _SNAPSHOT:
                self._mark(time_ns, "snapshot", flags, address, size, stack)
            else:
                name = self.trace.other_actions.get(position, str(action))
                self.skipped_actions[name] = self.skipped_actions.get(name, 0) + 1
        except HeapConflict as exc:
            self._conflict(f"trace entry {position} ({_action_name(self.trace, position)})", exc)

    def _mark(self, time_ns: int, label: str, flags: int, address: int, size: int, stack: int) -> None:
        self.log.append(
            event_row(time_ns=time_ns, kind=_MARK, flags=int(MarkPhase.POINT), device=self.device,
                      tag=self.log.intern_string(label), address=address if flags & HAS_ADDR else 0,
                      requested=size if flags & HAS_SIZE else 0, stack=self.stacks.final(stack))
        )  # fmt: skip

    def _conflict(self, what: str, exc: HeapConflict) -> None:
        self.conflicts.append(f"GPU:{self.index} {what}: {exc}")


def _action_name(trace: TraceColumns, position: int) -> str:
    code = int(trace.action[position])
    return trace.other_actions.get(position, "") if code == OTHER else ACTIONS[code]


def trace_times(trace: TraceColumns) -> tuple[np.ndarray, bool]:
    """Per entry ``time_ns`` (non-decreasing) and whether every entry had a positive int ``time_us``."""
    exact_each = ((trace.flags & HAS_TIME) != 0) & (trace.time_us > 0)
    if bool(exact_each.all()):
        return np.maximum.accumulate(trace.time_us * US), True
    times: list[int] = []
    last = 0
    for exact, time_us in zip(exact_each.tolist(), trace.time_us.tolist(), strict=True):
        last = max(last, time_us * US) if exact else last + US
        times.append(last)
    return np.array(times, dtype=np.int64), False
