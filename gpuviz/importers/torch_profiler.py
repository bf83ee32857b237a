"""PyTorch profiler Chrome traces (``prof.export_chrome_trace``, TensorBoard's ``*.pt.trace.json[.gz]``).

With ``torch.profiler.profile(profile_memory=True)`` PyTorch writes one instant event per
allocation and free of its caching allocator (CUDA) and of the CPU allocator::

    {"ph": "i", "s": "t", "name": "[memory]", "pid": .., "tid": .., "ts": <µs>,
     "args": {"Device Type": 1, "Device Id": 0, "Addr": .., "Bytes": <negative = free>,
              "Total Allocated": <bytes after the event>, "Total Reserved": <bytes after the event>}}

The 2021 schema has only ``Device Type``, ``Device Id`` and ``Bytes``. Mapping:

- time: ``ts`` µs -> ns (fractional µs kept to the ns); events sorted by ``(ts, Ev Idx, position)``.
- device: Device Type 1 (CUDA) -> ``GPU:<id>``, 0 -> ``CPU:0``; ``deviceProperties`` -> device
  options (``name``, ``total_memory`` bytes); ``distributedInfo`` -> ``meta["source"]``.
- chunk size = requested = ``Bytes`` (the trace says nothing about rounding or requests).
- segments: not recorded; inferred (``infer_segments``) as the connected address ranges ever
  allocated, all reserved at the first event's time.
- memory allocated before profiling: a free of an address never allocated in the trace was
  live at the start (seeded at its address); the rest of the first event's ``Total Allocated``
  is one allocation tagged ``PREEXISTING`` in a segment of its own after the traced ones
  (its addresses are unknown). So bytes requested in use equal ``Total Allocated`` after
  every event. ``Total Reserved`` goes to ``meta["source"]["total_reserved"]`` per device
  as ``[[time_ns, bytes], ...]`` at each change.
- 2021 schema (no ``Addr``): a free is paired with the most recent live allocation of the same
  size (LIFO); addresses are synthetic and every allocation is its own segment, so reserved
  equals in use and no fragmentation is shown: ``address``/``segment`` are ``absent``.

- names: each allocation is attributed to the innermost op running on its thread at its time
  (the trace's ``cpu_op`` events, ``Operator`` in the 2021 schema): its tag is that op's name
  (``aten::empty``), and its stack holds the ops and annotations (``user_annotation``:
  ``Optimizer.step#SGD.step``, ``## forward ##``) that enclosed it, innermost first, as frames
  whose file name is ``<op>`` (``base.tags.OP_FRAME``) and whose function is the name.

Only the ``[memory]`` and op events are decoded (located by byte search, each parsed alone), so a
54 MB trace imports without building its other events; the file is read in blocks.
"""

from __future__ import annotations

import json
import re
import zlib
from collections import defaultdict
from collections.abc import Iterator
from decimal import Decimal
from typing import Any, NamedTuple

from gpuviz.base.errors import LogFormatError
from gpuviz.importers.addressed import PREEXISTING, Change, Unaddressed, apply, prepare, unmatched_frees
from gpuviz.importers.builder import HeapBuilder, finish, set_source_meta
from gpuviz.importers.jsontop import JsonTop
from gpuviz.importers.profiler_ops import OP_FIELDS, OpEvent, attribute, decode_op, op_from_fields
from gpuviz.importers.source import Progress, Source
from gpuviz.log.eventlog import EventLog

__all__ = ["NAME", "DESCRIPTION", "sniff", "sniff_keys", "read", "read_events", "MemoryEvent", "OpEvent", "PREEXISTING"]

NAME = "pytorch-profiler"
DESCRIPTION = "a PyTorch profiler Chrome trace (.pt.trace.json[.gz], [memory] events from profile_memory=True)"

_MARKER = b'"[memory]"'
_MARKERS = re.compile(rb'"\[memory\]"|"cpu_op"|"user_annotation"|"Operator"')  # a memory event or an op's category
_NAMES_NOTE = (
    "tags: the innermost op running on the allocating thread (the trace's cpu_op events); "
    "stacks: the ops and annotations enclosing it, innermost first"
)
_BLOCK = 1 << 20  # decompressed bytes read at a time
_MAX_EVENT = 1 << 16  # a [memory] event is far smaller than this
# c10::DeviceType codes (c10/core/DeviceType.h)
_DEVICE_TYPES = {0: "CPU", 1: "GPU", 6: "GPU", 9: "XLA", 12: "XPU", 13: "MPS", 15: "HPU", 19: "MTIA"}


class MemoryEvent(NamedTuple):
    """One ``[memory]`` event: times in ns, sizes in bytes (``bytes_`` negative for a free);
    ``address``/``total_allocated``/``total_reserved`` are None where the schema lacks them."""

    time_ns: int
    order: int  # Ev Idx where present, else -1 (ties broken by position)
    position: int
    device_type: int
    device_id: int
    thread: int
    address: int | None
    bytes_: int
    total_allocated: int | None
    total_reserved: int | None


def sniff(head: bytes) -> bool:
    """A JSON object with ``traceEvents`` written by PyTorch's profiler (kineto writes
    ``schemaVersion``/``deviceProperties`` first) or holding ``[memory]`` events."""
    text = head.lstrip()
    if not text.startswith(b"{") or b'"traceEvents"' not in head:
        return False
    return _MARKER in head or b'"schemaVersion"' in head or b'"deviceProperties"' in head


_KINETO_KEYS = ("schemaVersion", "deviceProperties", "distributedInfo", "profile_memory")


def sniff_keys(top: JsonTop) -> bool:
    """A JSON object with ``traceEvents`` and kineto's header keys, wherever they sit in it."""
    return "traceEvents" in top.keys and any(key in top.keys for key in _KINETO_KEYS)


def _header(source: Source) -> dict[str, Any]:
    """Kineto's top-level keys (schemaVersion, deviceProperties, distributedInfo, profile_memory):
    parsed from the head when written before ``traceEvents``, else taken from the scan of the
    document's top level (writers that put them at the end); ``{}`` when there are none."""
    head = source.head
    at = head.find(b'"traceEvents"')
    value: Any = {}
    if at >= 0:
        prefix = head[:at].rstrip().rstrip(b",")
        try:
            value = json.loads(prefix + b"}")
        except (ValueError, RecursionError):
            value = {}
    header: dict[str, Any] = value if isinstance(value, dict) else {}
    if not any(key in header for key in _KINETO_KEYS):
        top = source.json_top()
        header = {key: top.value(key) for key in _KINETO_KEYS if top.value(key) is not None}
    return header


def _event_start(buffer: bytes, marker: int, floor: int) -> int:
    """Offset of the ``{`` opening the event object holding ``"[memory]"`` at ``marker``; -1 if before ``floor``."""
    pos, depth = marker, 0
    while True:
        brace = buffer.rfind(b"{", floor, pos)
        if brace < 0:
            return -1
        depth += buffer.count(b"}", brace, pos)
        if depth == 0:
            return brace
        depth -= 1
        pos = brace


_I64 = 1 << 63


def _int(value: Any, name: str, position: int) -> int:
    """``value`` as an int64; ``LogFormatError`` for anything else (a number past 64 bits is
    refused before it is converted: ``int(Decimal("1e999999"))`` alone takes minutes)."""
    if type(value) is int:
        if -_I64 <= value < _I64:
            return value
    elif (
        isinstance(value, Decimal) and value.is_finite() and value.adjusted() < 19
        and value == value.to_integral_value() and -_I64 <= int(value) < _I64
    ):  # fmt: skip
        return int(value)
    raise LogFormatError(f"[memory] event #{position}: {name} is {value!r:.60}, not a 64-bit integer")


def _optional(args: dict[str, Any], name: str, position: int) -> int | None:
    value = args.get(name)
    return None if value is None else _int(value, name, position)


def _address(args: dict[str, Any], position: int) -> int | None:
    address = _optional(args, "Addr", position)
    if address is not None and address < 0:
        raise LogFormatError(f"[memory] event #{position}: Addr is {address}, a negative address")
    return address


def _decode(event: Any, position: int) -> MemoryEvent | None:
    """The ``[memory]`` event ``event`` (a decoded JSON object), None for any other object."""
    if type(event) is not dict or event.get("name") != "[memory]":
        return None
    args = event.get("args")
    if type(args) is not dict or "Bytes" not in args:
        raise LogFormatError(f"[memory] event #{position} has no args.Bytes: {event!r:.200}")
    ts = event.get("ts")
    if type(ts) is int and -_I64 <= ts * 1000 < _I64:
        time_ns = ts * 1000
    elif isinstance(ts, Decimal) and ts.is_finite() and ts.adjusted() < 16:  # µs: ns within int64
        time_ns = int(ts * 1000)
    else:
        raise LogFormatError(f"[memory] event #{position} has no numeric ts in range (µs, 64-bit ns): {event!r:.200}")
    tid = event.get("tid", 0)
    return MemoryEvent(
        time_ns,
        _int(args.get("Ev Idx", -1), "Ev Idx", position),
        position,
        _int(args.get("Device Type", 0), "Device Type", position),
        _int(args.get("Device Id", -1), "Device Id", position),
        tid if type(tid) is int else int(tid) if isinstance(tid, str) and tid.isdigit() else 0,
        _address(args, position),
        _int(args["Bytes"], "Bytes", position),
        _optional(args, "Total Allocated", position),
        _optional(args, "Total Reserved", position),
    )


def _decode_at(decoder: json.JSONDecoder, buffer: bytes, start: int) -> tuple[Any, int] | None:
    """The JSON value starting at ``buffer[start]`` and the offset after it; None when it runs past
    the end of ``buffer``; ``LogFormatError`` when it is not valid JSON. Bytes map 1:1 to
    characters (latin-1): a ``[memory]`` event is ASCII."""
    window = 1024
    while True:
        text = buffer[start : start + window].decode("latin-1")
        try:
            value, end = decoder.raw_decode(text)
        except json.JSONDecodeError as exc:
            at_end = exc.pos >= len(text) - 1 or exc.msg.startswith("Unterminated")
            if not at_end or window >= _MAX_EVENT:
                raise LogFormatError(f"a [memory] event is not valid JSON ({exc}): {text[:200]!r}") from None
            if start + window >= len(buffer):
                return None
            window *= 4
            continue
        return value, start + end


def read_events(source: Source) -> Iterator[MemoryEvent | OpEvent]:
    """The ``[memory]`` and op events of the trace in file order, decoded one by one from blocks
    of the stream (an op event that cannot be decoded is left out).

    Raises ``LogFormatError`` when an event is not valid JSON and ``_Truncated`` (after the
    events before the cut) when the stream ends inside the trace.
    """
    decoder = json.JSONDecoder(parse_float=Decimal)
    position = 0
    buffer = b""
    with source.open() as stream:
        done = False
        while not done:
            try:
                block = stream.read(_BLOCK)
            except (EOFError, OSError, zlib.error) as exc:
                raise _Truncated(f"the compressed stream is cut short or corrupt ({exc})") from None
            done = not block
            buffer += block
            floor = search = 0
            pending = -1  # start of an event that continues in the next block
            while (match := _MARKERS.search(buffer, search)) is not None:
                marker = match.start()
                is_memory = match.group() == _MARKER
                if not is_memory and (fields := OP_FIELDS.match(buffer, marker)) is not None:
                    yield op_from_fields(fields)  # the common layout: no JSON decoding
                    search = fields.end()
                    continue
                start = _event_start(buffer, marker, floor)
                if start < 0:
                    if not is_memory:
                        search = marker + len(match.group())
                        continue
                    raise LogFormatError(f"a [memory] event (byte {marker} of a block) is not inside a JSON object")
                try:
                    found = _decode_at(decoder, buffer, start)
                except LogFormatError:
                    if is_memory:
                        raise
                    search = marker + len(match.group())  # an op event too large or odd: left out
                    continue
                if found is None:
                    if done:
                        raise _Truncated("the last [memory] event is cut short")
                    pending = start
                    break
                event, floor = found
                if is_memory:
                    decoded = _decode(event, position)
                    if decoded is not None:
                        yield decoded
                        position += 1
                else:
                    op = decode_op(event)
                    if op is not None:
                        yield op
                search = max(floor, marker + len(match.group()))
            keep = pending if pending >= 0 else max(floor, len(buffer) - _MAX_EVENT)
            buffer = buffer[keep:]
    if not buffer.rstrip().endswith(b"}"):
        raise _Truncated("the JSON document does not end with '}'")


class _Truncated(Exception):
    """The decompressed stream ended inside the trace."""


# ---------------------------------------------------------------------------- building the log
def _key(event: MemoryEvent) -> tuple[int, int]:
    """(device type, device index): the CPU's -1 is index 0."""
    return (event.device_type, max(event.device_id, 0))


def _device_name(device_type: int, device_id: int) -> str:
    kind = _DEVICE_TYPES.get(device_type, f"DEVICE{device_type}")
    return f"{kind}:{max(device_id, 0)}"


def _device_order(key: tuple[int, int]) -> tuple[int, int, int]:
    name = _DEVICE_TYPES.get(key[0], "")
    return (0 if name == "GPU" else 2 if name == "CPU" else 1, key[0], key[1])


def _device_options(header: dict[str, Any], device_type: int, device_id: int) -> dict[str, Any]:
    options: dict[str, Any] = {"allocator": "pytorch-caching" if device_type == 1 else "pytorch-cpu"}
    if device_type == 1:
        for props in header.get("deviceProperties") or ():
            if isinstance(props, dict) and props.get("id") == device_id:
                options.update(model=props.get("name"), total_memory=props.get("totalGlobalMem"))
    return options


def read(source: Source, *, progress: Progress) -> EventLog:
    header = _header(source)
    notes: list[str] = []
    events: list[MemoryEvent] = []
    ops: list[OpEvent] = []
    truncated = False
    try:
        for event in read_events(source):
            if isinstance(event, MemoryEvent):
                events.append(event)
            else:
                ops.append(event)
    except _Truncated as exc:
        truncated = True
        notes.append(f"the file is cut short: {exc}; imported the [memory] events before the cut")
    events.sort(key=lambda e: (e.time_ns, e.order, e.position))
    by_device: dict[tuple[int, int], list[MemoryEvent]] = defaultdict(list)
    for event in events:
        by_device[_key(event)].append(event)
    addressed = bool(events) and all(e.address is not None for e in events)
    log = EventLog(arena=False)  # built at once, then read whole
    log.truncated = truncated
    names = attribute(log, [(e.thread, e.time_ns, e.order, e.position) for e in events if e.bytes_ > 0], ops)
    heaps: dict[tuple[int, int], HeapBuilder] = {}
    for key in sorted(by_device, key=_device_order):
        heaps[key] = HeapBuilder(log, log.add_device(_device_name(*key), **_device_options(header, *key)))
    if not events:
        notes.append("the trace has no [memory] events: profile with torch.profiler.profile(profile_memory=True)")
    elif addressed:
        _build_addressed(log, heaps, by_device, events, notes, names)
    else:
        _build_unaddressed(log, heaps, by_device, events, notes)
    reserved = {
        log.devices[heaps[key].device].name: _changes([(e.time_ns, e.total_reserved) for e in evs])
        for key, evs in by_device.items()
        if evs and evs[0].total_reserved is not None
    }
    for heap in heaps.values():
        name = log.devices[heap.device].name
        if reserved.get(name):
            segment_bytes = sum(heap.segments.values())
            notes.append(
                f"{name}: the trace's Total Reserved ends at {reserved[name][-1][1]} bytes; the inferred segments"
                f" hold {segment_bytes} (the allocator reserved memory the trace never touched, or released some)"
            )
    schema = "2021 (no Addr/totals)" if events and not addressed else "current"
    extra: dict[str, Any] = {"schema": schema, "total_reserved": reserved}
    for name in ("distributedInfo", "schemaVersion", "profile_memory"):
        if name in header:
            extra[name] = header[name]
    exact, inferred, absent = "exact", "inferred", "absent"
    set_source_meta(
        log,
        format=NAME,
        file=source.name,
        version=str(header.get("schemaVersion")) if "schemaVersion" in header else None,
        tool="torch.profiler",
        columns={
            "time_ns": exact,
            "device": exact,
            "thread": exact,
            "address": exact if addressed else absent,
            "size": inferred,
            "requested": exact,
            "segment": inferred if addressed else absent,
            "largest_free": inferred,
            "tag": inferred if any(tag >= 0 for tag, _ in names.values()) else absent,
            "stack": inferred if any(stack >= 0 for _, stack in names.values()) else absent,
        },
        notes=[
            "chunk size = requested = Bytes: the trace records neither the caller's request nor rounding",
            *([_NAMES_NOTE] if names else []),
            "segments are not recorded: inferred" + (" as the address ranges ever allocated" if addressed else ""),
            *notes,
        ],
        extra=extra,
    )
    return finish(log)


def _changes(series: list[tuple[int, int | None]]) -> list[list[int]]:
    out: list[list[int]] = []
    for time_ns, value in series:
        if value is not None and (not out or out[-1][1] != value):
            out.append([time_ns, value])
    return out


def _build_addressed(
    log: EventLog,
    heaps: dict[tuple[int, int], HeapBuilder],
    by_device: dict[tuple[int, int], list[MemoryEvent]],
    events: list[MemoryEvent],
    notes: list[str],
    names: dict[int, tuple[int, int]],
) -> None:
    start = events[0].time_ns
    for key, heap in heaps.items():
        first = by_device[key][0]
        before = None if first.total_allocated is None else first.total_allocated - first.bytes_
        notes.extend(prepare(heap, (_change(e) for e in by_device[key]), start_ns=start, in_use_before=before))
    skipped = sum(not apply(heaps[_key(event)], _change(event, names)) for event in events)
    if skipped:
        notes.append(f"{skipped} [memory] events contradict the heap built so far (overlap, unknown free): skipped")


def _change(event: MemoryEvent, names: dict[int, tuple[int, int]] | None = None) -> Change:
    assert event.address is not None
    tag, stack = names.get(event.position, (-1, -1)) if names else (-1, -1)
    return Change(event.time_ns, event.address, event.bytes_, event.thread, tag, stack)


def _build_unaddressed(
    log: EventLog,
    heaps: dict[tuple[int, int], HeapBuilder],
    by_device: dict[tuple[int, int], list[MemoryEvent]],
    events: list[MemoryEvent],
    notes: list[str],
) -> None:
    """2021 schema: frees paired LIFO by size, synthetic addresses, one segment per allocation."""
    start = events[0].time_ns
    preexisting = log.intern_string(PREEXISTING)
    synthetic = {key: Unaddressed(heap) for key, heap in heaps.items()}
    for key, heap in heaps.items():
        seeds = unmatched_frees((abs(e.bytes_), e.bytes_) for e in by_device[key])
        for size_key, size in seeds:
            synthetic[key].alloc(start, size, size_key, tag=preexisting)
        if seeds:
            notes.append(
                f"{log.devices[heap.device].name}: {len(seeds)} frees have no earlier allocation of their size:"
                f" seeded as {PREEXISTING} allocations at the start"
            )
    for event in events:
        heap_of = synthetic[_key(event)]
        if event.bytes_ > 0:
            heap_of.alloc(event.time_ns, event.bytes_, event.bytes_, thread=event.thread)
        elif event.bytes_ < 0:
            heap_of.free(event.time_ns, -event.bytes_, thread=event.thread)
    notes.append(
        "2021 schema: no addresses; each free is paired with the latest live allocation of its size (LIFO),"
        " addresses are synthetic and each allocation is a segment of its own (reserved = in use)"
    )
