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
(``snapshot_reader``: a pickle streamed entry by entry where the C reader is built), and each
device's trace becomes events in ``snapshot_trace``.
"""

from __future__ import annotations

import heapq
import re
import reprlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from gpuviz.base.errors import LogFormatError
from gpuviz.base.torch_rules import CachingRules
from gpuviz.importers.builder import event_row, finish, set_source_meta
from gpuviz.importers.jsontop import JsonTop
from gpuviz.importers.snapshot_reader import (
    ACTIONS,
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
from gpuviz.importers.snapshot_trace import ALLOCATOR, US, DeviceTrace, trace_times
from gpuviz.importers.source import Progress, Source
from gpuviz.log.eventlog import NO_INDEX, EventLog
from gpuviz.log.schema import Kind, MarkPhase

__all__ = ["NAME", "DESCRIPTION", "sniff", "sniff_keys", "read", "from_snapshot", "load_snapshot", "ALLOCATOR"]

NAME = "pytorch-snapshot"
DESCRIPTION = "a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot pickle, or its JSON form)"
_KEYS = (b"segments", b"device_traces")
_JSON_FIRST_KEY = re.compile(rb'\s*\{\s*"(segments|device_traces|allocator_settings|external_annotations)"\s*:')
_MARK = int(Kind.MARK)
_ALLOC = ACTIONS.index("alloc")
_BEFORE, _AFTER = -1, 1 << 16  # merge ranks of annotations beside device indices


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
        i: DeviceTrace(log, i, traces[i] if i < len(traces) else empty,
                   [s for s in segments if int(s.get("device", 0)) == i], rules, stacks)
        for i in indices
    }  # fmt: skip
    timed = {i: trace_times(d.trace) for i, d in devices.items()}
    all_exact = all(exact for _, exact in timed.values()) and any(len(d.trace) for d in devices.values())
    for index, device in devices.items():
        device.timed = all_exact
        device.prepare(timed[index][0])
    marks: list[tuple[int, int, int, Any]] = []
    if all_exact:
        for position, note in enumerate(annotations):
            if isinstance(note.get("time_us"), int):  # at equal times: START before entries, END after
                order = _AFTER if text_of(note.get("stage", "")).upper() == "END" else _BEFORE
                marks.append((note["time_us"] * US, order, position, note))
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
            _annotation(log, last + (position + 1) * US, note)
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


def _describe(log: EventLog, devices: Mapping[int, DeviceTrace], snapshot: Mapping[str, Any], settings: Any, *,
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
