"""PyTorch memory snapshots (``torch.cuda.memory._dump_snapshot``): the pickle and its JSON form.

A snapshot is plain data: ``segments`` (the allocator's state when it was taken: every
segment with its blocks) and ``device_traces`` (per device index, the ring buffer of the
allocator's recent actions), newer ones also ``allocator_settings`` and
``external_annotations``. This importer turns it into an ordinary EventLog:

- devices ``GPU:<index>``; every trace action: ``alloc`` -> alloc, ``free_completed`` -> free
  (``free_requested`` directly followed by its ``free_completed`` is the same free; one whose
  completion waits on a stream, or never came, is a ``mark`` tagged ``free_requested``
  carrying the address and size), ``segment_alloc``/``segment_map`` -> segment_alloc,
  ``segment_free``/``segment_unmap`` -> segment_free, ``oom`` -> oom, ``snapshot`` -> a mark;
- the trace records requested bytes; the block (chunk) size follows PyTorch's policy
  (``gpuviz.base.torch_rules``) applied to the free block found at the address;
- the trace is a ring buffer: what was alive when it began is taken from ``segments``, as
  PyTorch's viewer does (frees without an alloc and active blocks without an alloc were
  allocated at the start; the segments at the start are the final ones minus those the trace
  allocates plus those it frees);
- ``time_us`` -> ``time_ns``; without it the entries keep their order one µs apart
  (``time_ns`` inferred); ``external_annotations`` -> marks (START -> begin, END -> end);
- frames -> stacks of the Python frames (innermost first), as gpuviz records its own;
- ``allocator_settings`` -> ``meta["source"]["allocator_settings"]``.

Pickles are untrusted: they are read with every class and function refused, so a pickle
naming any global is rejected before anything of it runs.
"""

from __future__ import annotations

import heapq
import json
import pickle
import re
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gpuviz.base.errors import LogFormatError
from gpuviz.base.torch_rules import FREE_REQUESTED_MARK, CachingRules
from gpuviz.importers.builder import HeapBuilder, HeapConflict, event_row, finish, set_source_meta
from gpuviz.importers.source import Progress, Source
from gpuviz.log.eventlog import NO_INDEX, EventLog, Frame
from gpuviz.log.schema import Kind, MarkPhase

__all__ = ["NAME", "DESCRIPTION", "sniff", "read", "from_snapshot", "load_snapshot", "ALLOCATOR"]

NAME = "pytorch-snapshot"
DESCRIPTION = "a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot pickle, or its JSON form)"
ALLOCATOR = "pytorch-caching"  # the ``allocator`` option of every device of an imported snapshot
_US = 1000  # ns per µs: time_us -> time_ns, and the spacing of entries without times
_KEYS = (b"segments", b"device_traces")
_JSON_FIRST_KEY = re.compile(rb'\s*\{\s*"(segments|device_traces|allocator_settings|external_annotations)"\s*:')
_MARK = int(Kind.MARK)
_BEFORE, _AFTER = -1, 1 << 16  # merge ranks of annotations beside device indices


def sniff(head: bytes) -> bool:
    """A pickle (protocol 2+) whose first dict key is a snapshot key, or a JSON object that starts with one."""
    if head[:1] == b"\x80":
        start = head[:64]
        return any(key in start for key in _KEYS)
    return _JSON_FIRST_KEY.match(head) is not None


class _Refused(pickle.UnpicklingError):
    """The pickle names a global (a class or function); nothing of it was run."""


class _DataOnlyUnpickler(pickle.Unpickler):
    """Unpickles plain data only: every global (class, function) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(f"{module}.{name}")


def load_snapshot(source: Source) -> dict[str, Any]:
    """The snapshot dict of ``source`` (pickle or JSON), checked for the keys the importer needs.

    Raises ``LogFormatError`` for a pickle naming any global (nothing of it is executed), a
    truncated or corrupt pickle (a pickle is one object: no prefix of it can be read), invalid
    JSON, or data that is not a snapshot.
    """
    with source.open() as stream:
        if source.head[:1] == b"\x80":
            try:
                data = _DataOnlyUnpickler(stream).load()
            except _Refused as exc:
                raise LogFormatError(
                    f"{source.path}: the pickle names the global {exc}, so it is refused and nothing of it was run "
                    "(gpuviz unpickles snapshots with every class and function refused; a PyTorch snapshot holds "
                    "only dicts, lists, numbers and strings)"
                ) from None
            except (EOFError, pickle.UnpicklingError, ValueError, OSError) as exc:
                raise LogFormatError(
                    f"{source.path}: the pickle is truncated or corrupt ({type(exc).__name__}: {exc}); a pickle is "
                    "one object, so no readable prefix of it can be imported"
                ) from None
        else:
            try:
                data = json.load(stream)
            except (ValueError, EOFError, OSError) as exc:
                raise LogFormatError(
                    f"{source.path}: the snapshot's JSON is truncated or invalid ({type(exc).__name__}: {exc})"
                ) from None
    _check(data, source)
    return data  # type: ignore[no-any-return]


def _check(data: Any, source: Source) -> None:
    if not isinstance(data, dict):
        raise LogFormatError(f"{source.path}: a PyTorch snapshot is a dict, this holds a {type(data).__name__}")
    for key in ("segments", "device_traces"):
        if not isinstance(data.get(key, []), list):
            raise LogFormatError(f"{source.path}: the snapshot's {key!r} is not a list")
    if "segments" not in data and "device_traces" not in data:
        raise LogFormatError(f"{source.path}: the dict has neither 'segments' nor 'device_traces'")


def read(source: Source, *, progress: Progress) -> EventLog:
    snapshot = load_snapshot(source)
    return from_snapshot(snapshot, file=str(source.path), version="json" if source.head[:1] != b"\x80" else None)


class _Stacks:
    """Frames lists -> stack indices (Python frames only, innermost first), cached by the identity
    of the frame dicts: a snapshot shares its frame dicts between entries, so lists with the same
    frames are converted once (the snapshot keeps the dicts alive while the cache is used)."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self._stacks: dict[tuple[int, ...], int] = {}
        self._lists: dict[int, int] = {}  # id of a frames list -> stack (entries often share lists)
        self._frames: dict[int, Frame | None] = {}

    def index(self, frames: Any) -> int:
        if not frames:
            return NO_INDEX
        found = self._lists.get(id(frames))
        if found is not None:
            return found
        key = tuple(map(id, frames))
        found = self._stacks.get(key)
        if found is not None:
            self._lists[id(frames)] = found
            return found
        converted: list[Frame] = []
        cache = self._frames
        for frame in frames:
            if id(frame) in cache:
                python = cache[id(frame)]
            else:
                python = cache[id(frame)] = _python_frame(frame)
            if python is not None:
                converted.append(python)
        stack = self.log.intern_stack(tuple(converted)) if converted else NO_INDEX
        self._stacks[key] = self._lists[id(frames)] = stack
        return stack


def _python_frame(frame: Any) -> Frame | None:
    """The frame as a gpuviz Frame when it is a Python frame, else None (C/C++ frames)."""
    if not isinstance(frame, Mapping):
        return None
    filename = str(frame.get("filename", ""))
    if filename.endswith(".py") or (filename.startswith("<") and filename.endswith(">")):
        return Frame(filename, int(frame.get("line", 0)), str(frame.get("name", "")))
    return None


class _Device:
    """One device's trace, fed into a HeapBuilder."""

    def __init__(self, log: EventLog, index: int, trace: Sequence[Any], segments: list[dict[str, Any]],
                 rules: CachingRules, stacks: _Stacks) -> None:  # fmt: skip
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

    # ----------------------------------------------------------- the start
    def seed(self, time_ns: int) -> None:
        """Emit the segments and allocations alive when the trace began (see the module docstring)."""
        live: set[int] = set()
        seen_alloc: set[int] = set()
        initial: dict[int, tuple[int, int | None, int]] = {}  # address -> (requested, block size or None, stack)
        first_segment_event: dict[int, Mapping[str, Any]] = {}
        for entry in self.trace:
            action = entry.get("action")
            if action == "alloc":
                live.add(entry["addr"])
                seen_alloc.add(entry["addr"])
            elif action == "free_completed":
                address = entry["addr"]
                if address in live:
                    live.discard(address)
                elif address not in seen_alloc and address not in initial:
                    initial[address] = (int(entry["size"]), None, NO_INDEX)
            elif action in ("segment_alloc", "segment_free", "segment_map", "segment_unmap"):
                first_segment_event.setdefault(entry["addr"], entry)
        segments = {
            int(s["address"]): int(s["total_size"])
            for s in self.final_segments
            if s["address"] not in first_segment_event
        }
        for address, entry in first_segment_event.items():
            if entry["action"] in ("segment_free", "segment_unmap"):
                segments[address] = int(entry["size"])
        for segment in self.final_segments:
            for block in segment.get("blocks", ()):
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

    # ------------------------------------------------------------ the trace
    def entries(self, times: list[int]) -> Iterator[tuple[int, int, int, Any]]:
        """``(time_ns, device index, position, entry)`` in trace order."""
        index = self.index
        for position, (time_ns, entry) in enumerate(zip(times, self.trace, strict=True)):
            yield time_ns, index, position, entry

    def apply(self, time_ns: int, position: int, entry: Mapping[str, Any]) -> None:
        action = entry.get("action")
        heap = self.heap
        try:
            if action == "alloc":
                address, requested = entry["addr"], int(entry["size"])
                found = heap.chunk_at(address)
                if found is None or found[2]:
                    raise HeapConflict(f"alloc at {address:#x}: no free block there")
                start, free_size, _ = found
                size = entry.get("block_size")  # written by gpuviz's exporter: the chunk as gpuviz recorded it
                if isinstance(size, int) and size > 0:
                    self.exact_sizes += 1
                else:
                    size = self.rules.block_size(start + free_size - address, requested)
                heap.alloc(time_ns, address, size, requested, stack=self.stacks.index(entry.get("frames")))
            elif action == "free_completed":
                heap.free(time_ns, entry["addr"], duration_ns=self._wait(time_ns, position, entry),
                          stack=self.stacks.index(entry.get("frames")))  # fmt: skip
            elif action == "free_requested":
                trace = self.trace
                following = trace[position + 1] if position + 1 < len(trace) else None
                if (following is None or following.get("action") != "free_completed"
                        or following.get("addr") != entry["addr"]):  # fmt: skip
                    self.pending_frees += 1
                    self._mark(time_ns, FREE_REQUESTED_MARK, MarkPhase.POINT, entry)
            elif action in ("segment_alloc", "segment_map"):
                heap.segment_alloc(time_ns, entry["addr"], int(entry["size"]),
                                   stack=self.stacks.index(entry.get("frames")))  # fmt: skip
            elif action in ("segment_free", "segment_unmap"):
                heap.segment_free(time_ns, entry["addr"])
            elif action == "oom":
                requested = int(entry.get("size", 0))
                heap.oom(time_ns, requested, self.rules.round_size(requested),
                         stack=self.stacks.index(entry.get("frames")))  # fmt: skip
            elif action == "snapshot":
                self._mark(time_ns, "snapshot", MarkPhase.POINT, entry)
            else:
                self.skipped_actions[str(action)] = self.skipped_actions.get(str(action), 0) + 1
        except HeapConflict as exc:
            self._conflict(f"trace entry {position} ({action})", exc)

    def _wait(self, time_ns: int, position: int, entry: Mapping[str, Any]) -> int:
        """ns from the free's ``free_requested`` right before it (if any) to its completion."""
        if position == 0:
            return 0
        before = self.trace[position - 1]
        if before.get("action") != "free_requested" or before.get("addr") != entry["addr"]:
            return 0
        requested_us = before.get("time_us")
        return max(0, time_ns - requested_us * _US) if isinstance(requested_us, int) and self.timed else 0

    def _mark(self, time_ns: int, label: str, phase: MarkPhase, entry: Mapping[str, Any]) -> None:
        self.log.append(
            event_row(time_ns=time_ns, kind=_MARK, flags=int(phase), device=self.device,
                      tag=self.log.intern_string(label), address=int(entry.get("addr", 0)),
                      requested=int(entry.get("size", 0)), stack=self.stacks.index(entry.get("frames")))
        )  # fmt: skip

    def _conflict(self, what: str, exc: HeapConflict) -> None:
        self.conflicts.append(f"GPU:{self.index} {what}: {exc}")


def _times(trace: Sequence[Any]) -> tuple[list[int], bool]:
    """Per entry ``time_ns`` (non-decreasing) and whether every entry had ``time_us``."""
    times: list[int] = []
    exact = True
    last = 0
    for entry in trace:
        if type(entry) is not dict:
            raise LogFormatError(f"a trace entry is a {type(entry).__name__}, not a dict: {str(entry)[:200]}")
        time_us = entry.get("time_us")
        if type(time_us) is int and time_us > 0:
            last = max(last, time_us * _US)
        else:
            exact = False
            last += _US
        times.append(last)
    return times, exact


def from_snapshot(snapshot: Mapping[str, Any], *, file: str = "", version: str | None = None) -> EventLog:
    """An EventLog of a PyTorch snapshot dict (as ``torch.cuda.memory._snapshot()`` returns it)."""
    segments = list(snapshot.get("segments") or [])
    traces = list(snapshot.get("device_traces") or [])
    settings = snapshot.get("allocator_settings") or {}
    annotations = [a for a in snapshot.get("external_annotations") or [] if isinstance(a, Mapping)]
    for segment in segments:
        if not isinstance(segment, Mapping) or "address" not in segment or "total_size" not in segment:
            raise LogFormatError(f"{file}: a snapshot segment lacks 'address' or 'total_size': {str(segment)[:200]}")
    indices = sorted({int(s.get("device", 0)) for s in segments} | {i for i, t in enumerate(traces) if t})
    rules = CachingRules.from_settings(settings if isinstance(settings, Mapping) else None)
    log = EventLog()
    stacks = _Stacks(log)
    devices = {
        i: _Device(log, i, traces[i] if i < len(traces) else [], [s for s in segments if int(s.get("device", 0)) == i],
                   rules, stacks)
        for i in indices
    }  # fmt: skip
    timed = {i: _times(d.trace) for i, d in devices.items()}
    all_exact = all(exact for _, exact in timed.values()) and any(d.trace for d in devices.values())
    if not any(d.trace for d in devices.values()):
        all_exact = False
    for device in devices.values():
        device.timed = all_exact
    marks: list[tuple[int, int, int, Any]] = []
    if all_exact:
        for position, note in enumerate(annotations):
            if isinstance(note.get("time_us"), int):  # at equal times: START before entries, END after
                order = _AFTER if str(note.get("stage", "")).upper() == "END" else _BEFORE
                marks.append((note["time_us"] * _US, order, position, note))
        marks.sort(key=lambda m: m[0])
    firsts = [times[0] for times, _ in timed.values() if times] + [m[0] for m in marks]
    start = min(firsts) if firsts else 0
    for device in devices.values():
        device.seed(start)
    trace_start = len(log)  # the first event of the trace itself, after every device's seed
    last = start
    if len(devices) == 1 and not marks:  # one trace: no merge
        ((index, device),) = devices.items()
        apply = device.apply
        times = timed[index][0]
        for position, entry in enumerate(device.trace):
            apply(times[position], position, entry)
        last = times[-1] if times else start
    else:
        streams = [device.entries(timed[i][0]) for i, device in devices.items()]
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


def _merge_key(item: tuple[int, int, int, Any]) -> tuple[int, int]:
    return item[0], item[1]


def _annotation(log: EventLog, time_ns: int, note: Mapping[str, Any]) -> None:
    stage = str(note.get("stage", "")).upper()
    phase = MarkPhase.BEGIN if stage == "START" else MarkPhase.END if stage == "END" else MarkPhase.POINT
    device = NO_INDEX
    if isinstance(note.get("device"), int):
        name = f"GPU:{note['device']}"
        device = log.device_index(name) if name in log.device_names else NO_INDEX
    log.append(event_row(time_ns=time_ns, kind=_MARK, flags=int(phase), device=device,
                         tag=log.intern_string(str(note.get("name", "")))))  # fmt: skip


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
    if initial:
        notes.append(f"{initial} allocations alive before the trace began were taken from the snapshot's segments "
                     "(as PyTorch's viewer does); their times are the trace's start")  # fmt: skip
    if not exact_times:
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
    trace_allocs = sum(1 for d in devices.values() for e in d.trace if e.get("action") == "alloc")
    if exact_sizes:
        notes.append(f"{exact_sizes} of {trace_allocs} allocations carry their block size (a snapshot gpuviz wrote)")
    set_source_meta(
        log, format=NAME, file=file, version=version, tool="torch.cuda.memory._dump_snapshot",
        columns={
            "time_ns": "exact" if exact_times else "inferred", "address": "exact",
            "size": "exact" if exact_sizes == trace_allocs else "inferred",
            "requested": "exact", "segment": "exact", "largest_free": "inferred", "thread": "absent",
            "tag": "absent", "stack": "exact" if has_stacks else "absent",
            "duration_ns": "exact" if exact_times else "absent",
        },
        notes=notes, extra=extra,
    )  # fmt: skip
