"""TensorFlow (>= 2.11) and JAX profiler traces: ``<host>.xplane.pb`` (an XSpace protobuf).

Decoded with ``protowire`` (no TensorFlow, no generated code). Field numbers used, from
tensorflow/core/profiler/protobuf/xplane.proto (now tsl/profiler/protobuf/xplane.proto):

    XSpace         planes=1 (XPlane), hostnames=4
    XPlane         id=1, name=2, lines=3 (XLine), event_metadata=4 (map<int64, XEventMetadata>),
                   stat_metadata=5 (map<int64, XStatMetadata>), stats=6 (XStat)
    XLine          id=1, name=2, timestamp_ns=3, events=4 (XEvent)
    XEvent         metadata_id=1, offset_ps=2, duration_ps=3, stats=4 (XStat)
    XStat          metadata_id=1, double_value=2, uint64_value=3, int64_value=4, str_value=5,
                   bytes_value=6, ref_value=7 (the name of XStatMetadata ref_value)
    XEventMetadata id=1, name=2;  XStatMetadata id=1, name=2;  map entries key=1, value=2

TensorFlow's BFC allocator records every decision as a ``MemoryAllocation`` or
``MemoryDeallocation`` event (on the host plane, on the thread that asked) with stats
``allocator_name``, ``addr``, ``requested_bytes``, ``allocation_bytes`` (the chunk),
``bytes_allocated`` (bytes in use after it), ``peak_bytes_in_use``, ``tf_op``, ``shape``
(or ``tensor_shape``), ``data_type`` (the DataType enum), ``region_type``, ``id`` (step id)
and ``group_id`` (the profiler's step number). Each allocator becomes one device
(``tf_memory.allocator_device``); every ``/device:GPU:N`` plane adds ``GPU:N`` even without
memory events, so a multi-GPU profile shows all its GPUs. TPU profiles put their memory events on
the host plane with no ``allocator_name`` but an ``index_on_host`` stat (the TPU core): core k
is a device of its own, named after the k-th ``/device:TPU:N`` plane (``TPU:N``).

Segments are not in the trace (TF does not trace its region growth): they are inferred as
the connected address ranges ever allocated (``builder.infer_segments``). An allocation freed
in the trace but made before it started is seeded at the trace's start. TF's
``bytes_allocated`` minus gpuviz's bytes in use is the memory in use before the trace began
that the trace never frees; it is constant when the trace is complete and is recorded per
device as ``untracked_bytes_in_use``.
"""

from __future__ import annotations

import mmap
import re
from dataclasses import dataclass
from typing import Any

from gpuviz.base import native as registry
from gpuviz.base.errors import LogFormatError
from gpuviz.importers.builder import finish, set_source_meta
from gpuviz.importers.memory_columns import MemoryColumns, MemoryColumnsBuilder
from gpuviz.importers.protowire import (
    FIXED64,
    LEN,
    VARINT,
    WireData,
    WireError,
    as_double,
    as_int64,
    fields,
    read_varint,
)
from gpuviz.importers.source import Progress, Source
from gpuviz.importers.tf_memory import MemoryRecord, add_devices, dtype_name, write_events
from gpuviz.log.eventlog import EventLog

__all__ = ["NAME", "DESCRIPTION", "sniff", "read", "MemoryRecord", "decode_memory_records", "native_decoder_available"]

NAME = "xplane"
DESCRIPTION = "a TensorFlow/JAX profiler XSpace (.xplane.pb)"
_MEMORY_EVENTS = {"MemoryAllocation": True, "MemoryDeallocation": False}
_DEVICE_PLANE = re.compile(r"^/device:(GPU|TPU):(\d+)$")
_PLANE_FIELDS = {1: VARINT, 2: LEN, 3: LEN, 4: LEN, 5: LEN, 6: LEN}
_MODULE = "gpuviz.importers._xplanewire"  # the C decoder of memory events, built where a C compiler exists
_native: Any = registry.load(_MODULE)
_SLOTS = {} if _native is None else {name: slot for slot, name in enumerate(_native.SLOT_NAMES)}
_TEXT_SLOTS = 7  # allocator_name, tf_op, data_type, shape, tensor_shape, region_type, index_on_host


def sniff(head: bytes) -> bool:
    """An XSpace: field 1 (a plane) first, whose own fields are XPlane's, with a UTF-8 name."""
    if not head.startswith(b"\x0a"):
        return False
    try:
        length, pos = read_varint(head, 1, min(len(head), 11))
        end = min(len(head), pos + length)
        for number, wire, value, start in fields(head, pos, end):
            if _PLANE_FIELDS.get(number) != wire:
                return False
            if number == 2:
                name = head[start:value].decode("utf-8")
                return name.isprintable() and name != ""
            if number == 3:  # lines before any name: an unnamed plane is still a plane
                return True
    except (WireError, UnicodeDecodeError):
        return False
    return False


def _text(data: WireData, start: int, end: int, cache: dict[bytes, str] | None = None) -> str:
    """The UTF-8 text at ``data[start:end]``; with ``cache``, equal texts share one str."""
    raw = data[start:end]
    if cache is None:
        return raw.decode("utf-8", errors="replace")
    text = cache.get(raw)
    if text is None:
        text = cache[raw] = raw.decode("utf-8", errors="replace")
    return text


def _metadata(data: WireData, start: int, end: int) -> tuple[int, str]:
    """``(id, name)`` of a map entry holding an XEventMetadata or XStatMetadata."""
    key, ident, name = 0, None, ""
    for number, wire, value, pos in fields(data, start, end):
        if number == 1 and wire == VARINT:
            key = as_int64(value)
        elif number == 2 and wire == LEN:
            for inner, inner_wire, inner_value, inner_pos in fields(data, pos, value):
                if inner == 1 and inner_wire == VARINT:
                    ident = as_int64(inner_value)
                elif inner == 2 and inner_wire == LEN:
                    name = _text(data, inner_pos, inner_value)
    return (key if ident is None else ident), name


def _stat(
    data: WireData, start: int, end: int, stat_names: dict[int, str], texts: dict[bytes, str] | None = None
) -> tuple[str, Any]:
    name, value_out = "", None  # type: tuple[str, Any]
    for number, wire, value, pos in fields(data, start, end):
        if number == 1:
            name = stat_names.get(as_int64(value), str(value))
        elif number == 2 and wire == FIXED64:
            value_out = as_double(value)
        elif number == 3:
            value_out = value
        elif number == 4:
            value_out = as_int64(value)
        elif number in (5, 6) and wire == LEN:
            value_out = _text(data, pos, value, texts)
        elif number == 7:
            value_out = stat_names.get(as_int64(value), "")
    return name, value_out


@dataclass
class _Plane:
    name: str
    stats: dict[str, Any]


@dataclass
class _Outline:
    """A plane without its lines decoded: where its lines are, its event and stat names."""

    plane: _Plane
    lines: list[tuple[int, int]]
    memory_ids: dict[int, bool]  # event metadata id -> is an allocation
    stat_names: dict[int, str]


def _outline(data: WireData, start: int, end: int) -> _Outline:
    name = ""
    lines: list[tuple[int, int]] = []
    stat_spans: list[tuple[int, int]] = []
    event_names: dict[int, str] = {}
    stat_names: dict[int, str] = {}
    for number, wire, value, pos in fields(data, start, end):
        if wire != LEN:
            continue
        if number == 2:
            name = _text(data, pos, value)
        elif number == 3:
            lines.append((pos, value))
        elif number == 4:
            key, text = _metadata(data, pos, value)
            event_names[key] = text
        elif number == 5:
            key, text = _metadata(data, pos, value)
            stat_names[key] = text
        elif number == 6:
            stat_spans.append((pos, value))
    stats = dict(_stat(data, a, b, stat_names) for a, b in stat_spans)
    memory_ids = {key: _MEMORY_EVENTS[text] for key, text in event_names.items() if text in _MEMORY_EVENTS}
    return _Outline(_Plane(name, stats), lines, memory_ids, stat_names)


def _line_records(
    data: WireData, start: int, end: int, memory_ids: dict[int, bool], stat_names: dict[int, str],
    records: MemoryColumnsBuilder,
) -> None:  # fmt: skip
    line_id, timestamp_ns = 0, 0
    for number, wire, value, _ in fields(data, start, end):  # the line's id and time first (a field may repeat)
        if number == 1 and wire == VARINT:
            line_id = as_int64(value)
        elif number == 3 and wire == VARINT:
            timestamp_ns = as_int64(value)
    texts: dict[bytes, str] = {}  # op names, shapes, allocator names repeat: one str each
    for number, wire, b, a in fields(data, start, end):  # then its events, one at a time
        if number != 4 or wire != LEN:
            continue
        metadata_id, offset_ps, stat_spans = None, 0, []
        for number, wire, value, pos in fields(data, a, b):
            if number == 1:
                metadata_id = as_int64(value)
                if metadata_id not in memory_ids:
                    break
            elif number == 2:
                offset_ps = as_int64(value)
            elif number == 4 and wire == LEN:
                stat_spans.append((pos, value))
        if metadata_id not in memory_ids:
            continue
        stats = dict(_stat(data, s, e, stat_names, texts) for s, e in stat_spans)
        records.add(_record(timestamp_ns + offset_ps // 1000, memory_ids[metadata_id], stats, line_id))


_Texts = tuple[str, str, str | None, str | None, str]  # allocator, op, dtype, shape, region type


_CORE = "index_on_host:"  # the provisional allocator of a TPU core's events (see _cores_to_devices)


def core_allocator(core: int) -> str:
    """The provisional allocator of the memory events of TPU core ``core`` (their ``index_on_host``
    stat), events that name no allocator."""
    return f"{_CORE}{core}"


def _cores_to_devices(kinds: list[Any], planes: list[_Plane], notes: list[str]) -> list[Any]:
    """Core ``k``'s events go to the ``k``-th TPU device plane (``/device:TPU:N``, in order of N):
    its allocator becomes ``"N"`` (a TPU's allocator, named as XProf's memory profile names it)."""
    cores = sorted({int(kind[0][len(_CORE) :]) for kind in kinds if str(kind[0]).startswith(_CORE)})
    if not cores:
        return kinds
    tpus = sorted(int(m[2]) for p in planes if (m := _DEVICE_PLANE.match(p.name)) and m[1] == "TPU")
    rename = {f"{_CORE}{k}": str(tpus[k] if k < len(tpus) else k) for k in cores}
    notes.append(
        "memory events without allocator_name carry the TPU core in index_on_host: each core is a device, "
        "core k the k-th TPU plane (" + ", ".join(f"{k} -> TPU:{rename[f'{_CORE}{k}']}" for k in cores) + ")"
    )
    return [(rename.get(kind[0], kind[0]), *kind[1:]) for kind in kinds]


def _allocator(stats: dict[str, Any]) -> str:
    """``allocator_name``; without one, the TPU core of ``index_on_host``; else ""."""
    name = stats.get("allocator_name")
    if name is None or name == "":
        core = stats.get("index_on_host")
        if isinstance(core, int) and not isinstance(core, bool) and 0 <= core < 1 << 16:
            return core_allocator(core)
    return str(name if name is not None else "")


def _texts(stats: dict[str, Any]) -> _Texts:
    """The text fields of a record from its stats (``MemoryColumns.kinds`` holds these)."""
    data_type = stats.get("data_type")
    return (
        _allocator(stats),
        str(stats.get("tf_op") or ""),
        dtype_name(data_type if isinstance(data_type, (int, str)) else None),
        str(stats.get("shape", stats.get("tensor_shape")) or "") or None,
        str(stats.get("region_type") or ""),
    )


def _record(time_ns: int, is_alloc: bool, stats: dict[str, Any], thread: int) -> MemoryRecord:
    def number(key: str, default: int = 0) -> int:
        value = stats.get(key)
        return int(value) if isinstance(value, (int, float)) else default

    step = stats.get("group_id")
    fragmentation = stats.get("fragmentation")
    allocator, op, dtype, shape, region_type = _texts(stats)
    return MemoryRecord(
        time_ns=time_ns,
        is_alloc=is_alloc,
        allocator=allocator,
        address=number("addr"),
        requested=number("requested_bytes"),
        size=number("allocation_bytes"),
        bytes_in_use=number("bytes_allocated", -1),
        peak_bytes_in_use=number("peak_bytes_in_use", -1),
        fragmentation=float(fragmentation) if isinstance(fragmentation, (int, float)) else -1.0,
        op=op,
        dtype=dtype,
        shape=shape,
        region_type=region_type,
        step=int(step) if isinstance(step, int) else None,
        thread=thread,
    )


def decode_memory_records(data: WireData) -> tuple[list[_Plane], MemoryColumns]:
    """Every plane of an XSpace and the memory records of all, in time order (stable across threads)."""
    planes, records = _decode(data)
    return planes, records.sorted_by_time()


def native_decoder_available() -> bool:
    """Whether memory events are decoded in C (built, loaded and not switched off: ``gpuviz.base.native``)."""
    return _native is not None and registry.available(_MODULE)


def _decode(data: WireData) -> tuple[list[_Plane], MemoryColumns]:
    """Planes and memory records in file order: in C where it is built (falling back to
    ``_decode_python`` on anything it does not cover), else in Python."""
    if native_decoder_available():
        try:
            return _decode_native(data)
        except (WireError, _native.Unsupported):
            pass  # the Python decoder gives the same columns or the right error
    return _decode_python(data)


def _decode_python(data: WireData) -> tuple[list[_Plane], MemoryColumns]:
    planes = []
    records = MemoryColumnsBuilder()
    for number, wire, value, pos in fields(data):
        if number == 1 and wire == LEN:
            outline = _outline(data, pos, value)
            planes.append(outline.plane)
            if outline.memory_ids:
                for a, b in outline.lines:
                    _line_records(data, a, b, outline.memory_ids, outline.stat_names, records)
    return planes, records.build()


def _decode_native(data: WireData) -> tuple[list[_Plane], MemoryColumns]:
    outlines = [_outline(data, pos, value) for number, wire, value, pos in fields(data) if number == 1 and wire == LEN]
    jobs = []
    for outline in outlines:
        if outline.memory_ids:
            names = outline.stat_names
            slots = {key: _SLOTS[name] for key, name in names.items() if name in _SLOTS}
            refs = {key: name.encode() for key, name in names.items()}
            jobs.append((outline.memory_ids, slots, refs, outline.lines))
    raw, keys = _native.decode(data, jobs, isinstance(data, mmap.mmap))  # a mapped file: pages handed back
    columns = dict(zip(_native.COLUMN_NAMES, raw, strict=True))
    names = _native.SLOT_NAMES[:_TEXT_SLOTS]
    kinds = [_texts({name: v for name, v in zip(names, key, strict=True) if v is not ...}) for key in keys]
    del keys
    return [o.plane for o in outlines], MemoryColumns.from_buffers(columns, kinds)


def read(source: Source, *, progress: Progress) -> EventLog:
    data = source.mapped()  # an uncompressed file is read through a memory map, never whole in memory
    try:
        planes, unsorted = _decode(data)
    except WireError as exc:
        raise LogFormatError(f"{source.path} is not a complete XSpace protobuf (truncated or corrupt: {exc})") from None
    finally:
        if isinstance(data, mmap.mmap):
            data.close()
    del data  # the records are columns now: the file's bytes go before they are sorted and the log is written
    records = unsorted.sorted_by_time()
    core_notes: list[str] = []
    records.kinds = _cores_to_devices(records.kinds, planes, core_notes)
    log = EventLog(arena=False)  # built at once, then read whole
    known = {}
    for plane in planes:
        match = _DEVICE_PLANE.match(plane.name)
        if match:
            stats = {k: v for k, v in plane.stats.items() if isinstance(v, (int, float, str))}
            known[f"{match[1]}:{int(match[2])}"] = {"plane": plane.name, **stats}
    allocators = records.counts(0)
    region_types = {k: n for k, n in records.counts(4, allocations_only=True).items() if k}
    devices = add_devices(log, list(allocators), known)
    notes = core_notes + write_events(log, records, devices)  # consumes the records' columns
    del records
    set_source_meta(
        log,
        format=NAME,
        file=str(source.path),
        tool="TensorFlow/JAX profiler (XSpace)",
        columns={
            "time_ns": "exact",
            "device": "exact",
            "thread": "exact",
            "address": "exact",
            "size": "exact",
            "requested": "exact",
            "tag": "exact",
            "segment": "inferred",
            "largest_free": "inferred",
            "split/merge": "inferred",
            "stack": "absent",
            "oom": "absent",
            "region_type": "absent",
        },
        notes=notes,
        extra={
            "planes": [p.name for p in planes],
            "allocators": allocators,
            "region_types": region_types,
        },
    )
    return finish(log)
