"""PyTorch memory snapshots (``torch.cuda.memory._dump_snapshot``): the pickle and its JSON form.

A snapshot is plain data: ``segments`` (the allocator's state when it was taken: every
segment with its blocks) and ``device_traces`` (per device index, the ring buffer of the
allocator's recent actions), newer ones also ``allocator_settings`` and
``external_annotations``. This importer turns it into an ordinary EventLog:

- devices ``GPU:<index>``; every trace action: ``alloc`` -> alloc, ``free_completed`` -> free
  (``free_requested`` directly followed by its ``free_completed`` is the same free; one whose
  completion waits on a stream, or never came, is a ``mark`` tagged ``free_requested``
  carrying the address and size), ``segment_alloc`` -> segment_alloc, ``segment_free`` ->
  segment_free, ``segment_map``/``segment_unmap`` (expandable segments: a range mapped into or
  unmapped from a growing segment) -> segment_map/segment_unmap, ``oom`` -> oom, ``snapshot``
  -> a mark;
- the trace records requested bytes; the block (chunk) size follows PyTorch's policy
  (``gpuviz.base.torch_rules``) applied to the free block found at the address;
- the trace is a ring buffer: what was alive when it began is taken from ``segments``, as
  PyTorch's viewer does (frees without an alloc and active blocks without an alloc were
  allocated at the start; the segments at the start are the final ones minus those the trace
  allocates plus those it frees; with mapped ranges, the trace's segment actions undone from
  the last to the first on the final segments);
- ``time_us`` -> ``time_ns``; without it the entries keep their order one µs apart
  (``time_ns`` inferred); ``external_annotations`` -> marks (START -> begin, END -> end);
- frames -> stacks of the Python frames (innermost first), as gpuviz records its own;
- ``allocator_settings`` -> ``meta["source"]["allocator_settings"]``;
- a snapshot without a trace, or the list of segments ``torch.cuda.memory_snapshot()`` returns,
  is the heap at that moment: its segments and blocks, at time 0, with no history.

Pickles are untrusted: they are read with every class and function refused, so a pickle
naming any global is rejected before anything of it runs. Each trace is read as columns
(``snapshot_reader``: a pickle streamed entry by entry where the C reader is built).
"""

from __future__ import annotations

import heapq
import re
import reprlib
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from gpuviz.base.errors import LogFormatError
from gpuviz.base.torch_rules import FREE_REQUESTED_MARK, CachingRules
from gpuviz.importers.builder import HeapBuilder, HeapConflict, event_row, finish, set_source_meta
from gpuviz.importers.jsontop import JsonTop
from gpuviz.importers.snapshot_reader import (
    ACTIONS,
    HAS_ADDR,
    HAS_BLOCK_SIZE,
    HAS_SIZE,
    HAS_TIME,
    OTHER,
    Stacks,
    TraceColumns,
    as_snapshot,
    is_segments_list,
    load_snapshot,
    read_snapshot,
    segments_list_head,
    text_of,
    traces_of,
)
from gpuviz.importers.source import Progress, Source
from gpuviz.log.eventlog import NO_INDEX, EventLog
from gpuviz.log.schema import Kind, MarkPhase
from gpuviz.log.segments import map_range, unmap_range

__all__ = ["NAME", "DESCRIPTION", "sniff", "sniff_keys", "read", "from_snapshot", "load_snapshot", "ALLOCATOR"]

NAME = "pytorch-snapshot"
DESCRIPTION = "a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot pickle, or its JSON form)"
ALLOCATOR = "pytorch-caching"  # the ``allocator`` option of every device of an imported snapshot
_US = 1000  # ns per µs: time_us -> time_ns, and the spacing of entries without times
_KEYS = (b"segments", b"device_traces")
_JSON_FIRST_KEY = re.compile(rb'\s*\{\s*"(segments|device_traces|allocator_settings|external_annotations)"\s*:')
_MARK = int(Kind.MARK)
_BEFORE, _AFTER = -1, 1 << 16  # merge ranks of annotations beside device indices
(_ALLOC, _FREE_REQUESTED, _FREE_COMPLETED, _SEGMENT_ALLOC, _SEGMENT_FREE, _SEGMENT_MAP, _SEGMENT_UNMAP, _OOM,
 _SNAPSHOT) = range(len(ACTIONS))  # fmt: skip
_SEGMENT_ACTIONS = (_SEGMENT_ALLOC, _SEGMENT_FREE, _SEGMENT_MAP, _SEGMENT_UNMAP)
_NEEDS_ADDR = (_ALLOC, _FREE_REQUESTED, _FREE_COMPLETED, *_SEGMENT_ACTIONS)
_NEEDS_SIZE = (_ALLOC, _SEGMENT_ALLOC, _SEGMENT_MAP, _SEGMENT_UNMAP)
_BLOCK = 1 << 10  # entries turned into Python values at a time (their ints: ~0.2 MB)
_BLOCK_SIZES = 1 << 16  # block sizes remembered per device (the same requests and free blocks recur)


def sniff(head: bytes) -> bool:
    """A pickle (protocol 2+) whose first dict key is a snapshot key, a pickle of a list whose
    first item is a segment (``torch.cuda.memory_snapshot()``), or a JSON object that starts
    with a snapshot key."""
    if head[:1] == b"\x80":
        start = head[:64]
        return any(key in start for key in _KEYS) or segments_list_head(head)
    return _JSON_FIRST_KEY.match(head) is not None


def sniff_keys(top: JsonTop) -> bool:
    """A JSON object with ``segments`` and ``device_traces`` at its top level, wherever they sit."""
    return "segments" in top.keys and "device_traces" in top.keys


def read(source: Source, *, progress: Progress) -> EventLog:
    log = EventLog(arena=False)  # built at once, then read whole
    stacks = Stacks(log)
    snapshot, traces = read_snapshot(source, stacks)
    version = "json" if source.head[:1] != b"\x80" else None
    if "device_traces" not in snapshot and segments_list_head(source.head):
        version = "segments list (torch.cuda.memory_snapshot())"
    return _build(log, stacks, snapshot, traces, file=str(source.path), version=version, owned=True)


def from_snapshot(snapshot: Mapping[str, Any] | list[Any], *, file: str = "", version: str | None = None) -> EventLog:
    """An EventLog of a PyTorch snapshot dict (as ``torch.cuda.memory._snapshot()`` returns it), or
    of a list of segments (as ``torch.cuda.memory_snapshot()`` returns it: the heap at that moment)."""
    if is_segments_list(snapshot):
        snapshot = as_snapshot(snapshot)
        version = version or "segments list (torch.cuda.memory_snapshot())"
    if not isinstance(snapshot, Mapping):
        raise LogFormatError(f"a PyTorch snapshot is a dict or a list of segments, not a {type(snapshot).__name__}")
    log = EventLog(arena=False)  # built at once, then read whole
    stacks = Stacks(log)
    traces = traces_of(snapshot, stacks)
    return _build(log, stacks, dict(snapshot), traces, file=file, version=version, owned=False)


def _require(trace: TraceColumns, actions: tuple[int, ...], bit: int, key: str, device: int) -> None:
    """``LogFormatError`` naming the first entry of ``actions`` without ``key``."""
    missing = np.flatnonzero(np.isin(trace.action, actions) & ((trace.flags & bit) == 0))
    if len(missing):
        position = int(missing[0])
        raise LogFormatError(f"trace entry {position} of device {device} ({ACTIONS[trace.action[position]]}) "
                             f"has no {key!r}")  # fmt: skip


class _Device:
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
            follow[pairs] = np.maximum(0, times[pairs] - t.time_us[pairs - 1] * _US)
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


def _times(trace: TraceColumns) -> tuple[np.ndarray, bool]:
    """Per entry ``time_ns`` (non-decreasing) and whether every entry had a positive int ``time_us``."""
    exact_each = ((trace.flags & HAS_TIME) != 0) & (trace.time_us > 0)
    if bool(exact_each.all()):
        return np.maximum.accumulate(trace.time_us * _US), True
    times: list[int] = []
    last = 0
    for exact, time_us in zip(exact_each.tolist(), trace.time_us.tolist(), strict=True):
        last = max(last, time_us * _US) if exact else last + _US
        times.append(last)
    return np.array(times, dtype=np.int64), False


def _build(log: EventLog, stacks: Stacks, snapshot: dict[str, Any], traces: list[TraceColumns], *, file: str,
           version: str | None, owned: bool) -> EventLog:  # fmt: skip
    """The log of ``snapshot`` with its ``traces``; ``owned``: the snapshot is the importer's own, to
    drop parts of once used (memory)."""
    segments = list(snapshot.get("segments") or [])
    settings = snapshot.get("allocator_settings") or {}
    annotations = [a for a in snapshot.get("external_annotations") or [] if isinstance(a, Mapping)]
    for segment in segments:
        if not isinstance(segment, Mapping) or "address" not in segment or "total_size" not in segment:
            raise LogFormatError(f"{file}: a snapshot segment lacks 'address' or 'total_size': {reprlib.repr(segment)}")
    indices = sorted({int(s.get("device", 0)) for s in segments} | {i for i, t in enumerate(traces) if len(t)})
    rules = CachingRules.from_settings(settings if isinstance(settings, Mapping) else None)
    empty = TraceColumns.from_bytes([b""] * 7)
    devices = {
        i: _Device(log, i, traces[i] if i < len(traces) else empty,
                   [s for s in segments if int(s.get("device", 0)) == i], rules, stacks)
        for i in indices
    }  # fmt: skip
    timed = {i: _times(d.trace) for i, d in devices.items()}
    all_exact = all(exact for _, exact in timed.values()) and any(len(d.trace) for d in devices.values())
    for index, device in devices.items():
        device.timed = all_exact
        device.prepare(timed[index][0])
    marks: list[tuple[int, int, int, Any]] = []
    if all_exact:
        for position, note in enumerate(annotations):
            if isinstance(note.get("time_us"), int):  # at equal times: START before entries, END after
                order = _AFTER if text_of(note.get("stage", "")).upper() == "END" else _BEFORE
                marks.append((note["time_us"] * _US, order, position, note))
        marks.sort(key=lambda m: m[0])
    firsts = [int(times[0]) for times, _ in timed.values() if len(times)] + [m[0] for m in marks]
    start = min(firsts) if firsts else 0
    for device in devices.values():
        device.seed(start)
        device.final_segments = []
    stacks.forget_identities()  # the frames lists of the segments' blocks: converted, no longer held
    if owned:  # the segments are in the heaps now: let them go before the trace's events are written
        segments.clear()
        snapshot.pop("segments", None)
    trace_start = len(log)  # the first event of the trace itself, after every device's seed
    last = start
    if len(devices) == 1:  # one trace: annotations go where heapq.merge below would put them
        ((index, device),) = devices.items()
        apply = device.apply
        times = timed[index][0]
        points = [*_merge_points(times, marks), len(times) + 1]
        k = 0
        for block in device.blocks(times):
            for position, time_ns, row in block:
                if points[k] <= position:
                    while points[k] <= position:
                        last = marks[k][0]
                        _annotation(log, last, marks[k][3])
                        k += 1
                apply(time_ns, position, row)
                last = time_ns
        for mark in marks[k:]:
            last = mark[0]
            _annotation(log, last, mark[3])
    else:
        streams = [device.rows(timed[i][0]) for i, device in devices.items()]
        for time_ns, index, position, entry in heapq.merge(*streams, iter(marks), key=_merge_key):
            last = time_ns
            if index in (_BEFORE, _AFTER):
                _annotation(log, time_ns, entry)
            else:
                devices[index].apply(time_ns, position, entry)
    if not all_exact:  # annotations cannot be placed among entries without times: after them, in order
        for position, note in enumerate(annotations):
            _annotation(log, last + (position + 1) * _US, note)
    _describe(log, devices, snapshot, settings, file=file, version=version, exact_times=all_exact)
    log.meta["source"]["trace_start"] = {log.devices[d.device].name: trace_start for d in devices.values()}
    return finish(log)


def _merge_points(times: np.ndarray, marks: list[tuple[int, int, int, Any]]) -> list[int]:
    """For each annotation, the position of the entry it comes before in ``heapq.merge`` order (by
    ``_merge_key``: a START at the time of entries before them, an END after), annotations in their order."""
    points: list[int] = []
    for time_ns, order, _, _ in marks:
        point = int(np.searchsorted(times, time_ns, side="left" if order == _BEFORE else "right"))
        points.append(max(point, points[-1]) if points else point)
    return points


def _merge_key(item: tuple[int, int, int, Any]) -> tuple[int, int]:
    return item[0], item[1]


def _annotation(log: EventLog, time_ns: int, note: Mapping[str, Any]) -> None:
    stage = text_of(note.get("stage", "")).upper()
    phase = MarkPhase.BEGIN if stage == "START" else MarkPhase.END if stage == "END" else MarkPhase.POINT
    device = NO_INDEX
    if isinstance(note.get("device"), int):
        name = f"GPU:{note['device']}"
        device = log.device_index(name) if name in log.device_names else NO_INDEX
    log.append(event_row(time_ns=time_ns, kind=_MARK, flags=int(phase), device=device,
                         tag=log.intern_string(text_of(note.get("name", "")))))  # fmt: skip


def _describe(log: EventLog, devices: Mapping[int, _Device], snapshot: Mapping[str, Any], settings: Any, *,
              file: str, version: str | None, exact_times: bool) -> None:  # fmt: skip
    entries = sum(len(d.trace) for d in devices.values())
    notes = [
        "block (chunk) sizes follow PyTorch's caching-allocator policy (512 B rounding, roundup_power2_divisions, "
        "splits of the free block found at the address: remainder >= 512 B in the small pool, > 1 MiB in the large "
        "pool, oversize blocks whole); the trace records requested bytes only",
        "stacks keep the Python frames of each entry (C++ frames left out), innermost first",
    ]
    initial = sum(d.initial_blocks for d in devices.values())
    if not entries:
        notes.append("the snapshot has no trace: the log is the allocator's heap at the moment the snapshot was "
                     "taken (its segments and blocks, all at time 0), with no history")  # fmt: skip
    elif initial:
        notes.append(f"{initial} allocations alive before the trace began were taken from the snapshot's segments "
                     "(as PyTorch's viewer does); their times are the trace's start")  # fmt: skip
    if not exact_times and entries:
        notes.append("the trace has no time_us: entries keep their order, 1 µs apart (time_ns inferred)")
    pending = sum(d.pending_frees for d in devices.values())
    if pending:
        notes.append(f"{pending} free_requested entries without their free_completed next are 'free_requested' marks")
    skipped: dict[str, int] = {}
    for d in devices.values():
        for action, count in d.skipped_actions.items():
            skipped[action] = skipped.get(action, 0) + count
    if skipped:
        notes.append(f"trace actions gpuviz does not know were skipped: {skipped}")
    conflicts = [c for d in devices.values() for c in d.conflicts]
    if conflicts:
        notes.append(f"{len(conflicts)} entries contradict the heap and were skipped; first: {conflicts[0]}")
    extra = {
        "entries": entries,
        "initially_allocated": initial,
        "initial_segments": sum(d.initial_segments for d in devices.values()),
        "conflicts": len(conflicts),
        "allocator_settings": dict(settings) if isinstance(settings, Mapping) else {},
        "annotations": len(snapshot.get("external_annotations") or []),
    }
    has_stacks = bool(log.stacks)
    exact_sizes = sum(d.exact_sizes for d in devices.values())
    trace_allocs = sum(int(np.count_nonzero(d.trace.action == _ALLOC)) for d in devices.values())
    if exact_sizes:
        notes.append(f"{exact_sizes} of {trace_allocs} allocations carry their block size (a snapshot gpuviz wrote)")
    tool = "torch.cuda.memory_snapshot" if version and version.startswith("segments list") else (
        "torch.cuda.memory._dump_snapshot")  # fmt: skip
    set_source_meta(
        log, format=NAME, file=file, version=version, tool=tool,
        columns={
            "time_ns": "exact" if exact_times else "inferred", "address": "exact",
            "size": "exact" if exact_sizes == trace_allocs else "inferred",
            "requested": "exact", "segment": "exact", "largest_free": "inferred", "thread": "absent",
            "tag": "absent", "stack": "exact" if has_stacks else "absent",
            "duration_ns": "exact" if exact_times else "absent",
        },
        notes=notes, extra=extra,
    )  # fmt: skip
