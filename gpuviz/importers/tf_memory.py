"""What TensorFlow's memory traces share: allocator names -> devices, dtypes, tags, and the
writing of their allocation records into an EventLog.

Used by the XPlane and XProf memory-profile importers. TensorFlow names an allocator per
device (``GPU_0_bfc``) plus host allocators (``gpu_host_bfc``, ``bfc_cpu_allocator_for_gpu``,
...); each becomes one gpuviz device: ``GPU_N_bfc`` -> ``GPU:N``, a bare number (XProf's TPU
memory ids) -> ``TPU:N``, every other allocator -> a host device ``CPU:k`` (k counts host
allocators in order of appearance), with ``{"allocator": name}`` in its options.

``write_events`` feeds the records (allocations and frees, in time order) to one
``HeapBuilder`` per allocator. TF's traces hold no regions, so segments are inferred: the
connected address ranges ever allocated (``builder.infer_segments``). An allocation freed in
the trace but made before it began is placed at the trace's start; a record that contradicts
the heap (an allocation over memory in use, a second free, a free of unknown size) is skipped
and counted in the notes. TF's bytes in use after each record minus gpuviz's is memory in use
before the trace that it never frees: when that difference is the same after every record it
is recorded in the device's options as ``untracked_bytes_in_use``, else the notes give its range.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from gpuviz.base.tags import array_tag
from gpuviz.importers.builder import HeapBuilder, HeapConflict, event_row, infer_segments_of
from gpuviz.log.eventlog import NO_INDEX, EventLog
from gpuviz.log.schema import Kind, MarkPhase

__all__ = [
    "DTYPE_BY_ENUM", "MemoryRecord", "dtype_name", "allocator_device", "memory_tag", "parse_shape", "add_devices",
    "write_events",
]  # fmt: skip

# tensorflow/core/framework/types.proto DataType enum -> the dtype names gpuviz tags use.
DTYPE_BY_ENUM: dict[int, str] = {
    1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string",
    8: "complex64", 9: "int64", 10: "bool", 11: "qint8", 12: "quint8", 13: "qint32", 14: "bfloat16",
    15: "qint16", 16: "quint16", 17: "uint16", 18: "complex128", 19: "float16", 20: "resource",
    21: "variant", 22: "uint32", 23: "uint64", 24: "float8_e5m2", 25: "float8_e4m3fn", 29: "int4", 30: "uint4",
}  # fmt: skip
# TensorFlow's DataTypeString names (XProf JSON's dataType) that differ from gpuviz's.
_DTYPE_BY_TF_NAME = {"float": "float32", "double": "float64", "half": "float16"}
_GPU_ALLOCATOR = re.compile(r"^(?:XLA_)?(GPU|TPU)_(\d+)_bfc$")
_SHAPE = re.compile(r"^\[(-?\d+(?:,-?\d+)*)?\]$")
_XLA_SHAPE = re.compile(r"^(?P<type>[a-z]+[0-9a-z]*)(?P<dims>\[[0-9,]*\])(?:\{.*\})?$")
_XLA_TYPES = {"pred": "bool", "bf16": "bfloat16"}
_XLA_PREFIXES = {"s": "int", "u": "uint", "f": "float", "c": "complex"}
_TAG_UNSAFE = re.compile(r"[:\[\]]")


def dtype_name(value: int | str | None) -> str | None:
    """gpuviz's name of a TensorFlow dtype, from the enum number or TF's name; None when invalid."""
    if value is None:
        return None
    if isinstance(value, int):
        return DTYPE_BY_ENUM.get(value)
    name = value.strip()
    if not name or name.upper() == "INVALID":
        return None
    return _DTYPE_BY_TF_NAME.get(name, name)


def allocator_device(allocator: str, hosts: dict[str, str]) -> str:
    """The gpuviz device of TF allocator ``allocator``; ``hosts`` (allocator -> device) grows
    as host allocators are met, so each gets its own ``CPU:k``."""
    match = _GPU_ALLOCATOR.match(allocator)
    if match:
        return f"{match[1]}:{int(match[2])}"
    if allocator.isdigit():
        return f"TPU:{int(allocator)}"
    if allocator not in hosts:
        hosts[allocator] = f"CPU:{len(hosts)}"
    return hosts[allocator]


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    """``"[4,384,1024]"`` -> ``(4, 384, 1024)``; ``"[]"`` -> ``()``; None when not a static shape."""
    if not text:
        return None
    match = _SHAPE.match(text.replace(" ", ""))
    if match is None:
        return None
    dims = tuple(int(n) for n in match[1].split(",")) if match[1] else ()
    return None if any(n < 0 for n in dims) else dims


def _xla_shape(text: str | None) -> tuple[str | None, str | None]:
    """``"s32[1,2048]{1,0:T(1,128)}"`` -> ``("int32", "[1,2048]")``; other text unchanged."""
    match = _XLA_SHAPE.match(text or "")
    if match is None:
        return None, text
    kind = match["type"]
    if kind in _XLA_TYPES:
        return _XLA_TYPES[kind], match["dims"]
    prefix, bits = kind[:1], kind[1:]
    return (f"{_XLA_PREFIXES[prefix]}{bits}" if prefix in _XLA_PREFIXES and bits.isdigit() else kind), match["dims"]


def memory_tag(op: str | None, dtype: str | None, shape: str | None) -> str | None:
    """The runtime tag ``op:dtype[shape]`` where the trace has all three, else the op name alone
    (characters the tag form reserves, ``:[]``, become ``_`` in the op name). An XLA shape
    (``f32[8,128]{1,0}``) gives the dtype where the trace names none."""
    if not op:
        return None
    op = _TAG_UNSAFE.sub("_", op)
    xla_dtype, shape = _xla_shape(shape)
    dtype = dtype or xla_dtype
    dims = parse_shape(shape)
    if dtype is None or dims is None:
        return op
    return array_tag(op, dtype, dims)


class MemoryRecord(NamedTuple):
    """One MemoryAllocation (``is_alloc``) or MemoryDeallocation of a TF allocator. Bytes, ns.
    (A named tuple: importers build millions of them, one at a time.)"""

    time_ns: int
    is_alloc: bool
    allocator: str
    address: int
    requested: int
    size: int
    bytes_in_use: int  # TF's bytes_allocated after the event; -1 when absent
    peak_bytes_in_use: int
    fragmentation: float  # TF's (free - largest free chunk) / free after the event; -1.0 when absent
    op: str
    dtype: str | None
    shape: str | None
    region_type: str
    step: int | None
    thread: int


def add_devices(log: EventLog, allocators: list[str], known: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Register the devices of ``allocators`` (host allocators numbered in this order) and the
    ``known`` devices (name -> options), accelerators first in index order, then the host's;
    returns allocator -> device index."""
    hosts: dict[str, str] = {}
    by_device: dict[str, list[str]] = {}
    for allocator in allocators:
        by_device.setdefault(allocator_device(allocator, hosts), []).append(allocator)
    names = set(known) | set(by_device)
    gpus = sorted((n for n in names if not n.startswith("CPU:")), key=lambda n: (n.split(":")[0], int(n.split(":")[1])))
    hosts_sorted = sorted((n for n in names if n.startswith("CPU:")), key=lambda n: int(n.split(":")[1]))
    index = {}
    for name in gpus + hosts_sorted:
        options: dict[str, Any] = {}
        if name in by_device:
            options["allocator"] = by_device[name][0]
        options.update(known.get(name, {}))
        index[name] = log.add_device(name, **options)
    return {a: index[allocator_device(a, hosts)] for a in allocators}


def write_events(log: EventLog, records: Sequence[MemoryRecord], devices: dict[str, int]) -> list[str]:
    """Seed, infer segments, then feed every record to its device's heap; returns the notes."""
    notes: list[str] = []
    if not records:
        notes.append("the trace holds no MemoryAllocation/MemoryDeallocation events")
        return notes
    start = records[0].time_ns
    heaps = {allocator: HeapBuilder(log, device) for allocator, device in devices.items()}
    seeds, skipped, intervals, (first, last) = _plan(records)
    for record in seeds:
        _interval(intervals, record)
    for allocator, heap in heaps.items():
        addresses, sizes = intervals.pop(allocator, (array("q"), array("q")))
        for base, size in infer_segments_of(np.frombuffer(addresses, np.int64), np.frombuffer(sizes, np.int64)):
            heap.segment_alloc(start, base, size)
    in_use: Counter[str] = Counter()
    conflicts = 0
    for record in seeds:
        try:
            heaps[record.allocator].alloc(start, record.address, record.size, record.requested,
                                          thread=record.thread, tag=_tag(log, record))  # fmt: skip
            in_use[record.allocator] += record.size
        except HeapConflict:  # overlaps another seed: its free is skipped as a conflict too
            conflicts += 1
    untracked: dict[str, set[int]] = {a: set() for a in heaps}
    peaks: dict[str, int] = {}  # allocator -> TF's largest peak_bytes_in_use (skipped records too)
    for i, record in enumerate(records):
        if record.peak_bytes_in_use > peaks.get(record.allocator, -1):
            peaks[record.allocator] = record.peak_bytes_in_use
        if i in skipped:
            continue
        if i in first:
            _mark(log, record.time_ns, MarkPhase.BEGIN, first[i])
        heap = heaps[record.allocator]
        try:
            if record.is_alloc:
                heap.alloc(record.time_ns, record.address, record.size, record.requested, thread=record.thread,
                           tag=_tag(log, record))  # fmt: skip
                in_use[record.allocator] += record.size
            else:
                in_use[record.allocator] -= heap.free(record.time_ns, record.address, thread=record.thread)
        except HeapConflict:
            conflicts += 1
        if record.bytes_in_use >= 0:
            untracked[record.allocator].add(record.bytes_in_use - in_use[record.allocator])
        if i in last:
            _mark(log, record.time_ns, MarkPhase.END, last[i])
    for allocator, values in untracked.items():
        device = log.devices[devices[allocator]]
        if len(values) == 1:
            device.options["untracked_bytes_in_use"] = values.pop()
        elif values:
            notes.append(f"{allocator}: the source's bytes in use differ from the replayed bytes in use by "
                         f"{min(values)}..{max(values)} bytes (events missing from the trace)")  # fmt: skip
        if allocator in peaks:
            device.options["tf_peak_bytes_in_use"] = peaks[allocator]
    notes.append("segments are inferred: the connected address ranges ever allocated (TF does not trace regions)")
    if seeds:
        notes.append(f"{len(seeds)} allocations made before the trace began (freed in it) are placed at its start")
    if skipped or conflicts:
        notes.append(
            f"{len(skipped) + conflicts} events that contradict the heap (an allocation over memory in use, "
            "a second free) were skipped"
        )
    return notes


_Intervals = dict[str, tuple["array[int]", "array[int]"]]  # allocator -> addresses, sizes of its allocations


def _interval(intervals: _Intervals, record: MemoryRecord) -> None:
    addresses, sizes = intervals.setdefault(record.allocator, (array("q"), array("q")))
    addresses.append(record.address)
    sizes.append(record.size)


_StepBounds = tuple[dict[int, int], dict[int, int]]


def _plan(records: Sequence[MemoryRecord]) -> tuple[list[MemoryRecord], set[int], _Intervals, _StepBounds]:
    """One pass over the records: allocations to seed (freed in the trace, never allocated in it),
    records to skip, each allocator's allocated ``(address, size)`` (for inferring segments), and
    the indices of the first and of the last record of each profiler step -> the step.

    A seeded free that names no size (XProf writes allocationBytes 0 for some) takes the drop
    of the source's bytes in use since the allocator's previous record, where both are known.
    """
    live: dict[str, set[int]] = {}  # allocator -> addresses allocated and not freed
    seen: dict[str, set[int]] = {}  # allocator -> addresses met
    previous_in_use: dict[str, int] = {}
    seeds: list[MemoryRecord] = []
    skipped: set[int] = set()
    intervals: _Intervals = {}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, record in enumerate(records):
        address = record.address
        allocator_live = live.setdefault(record.allocator, set())
        allocator_seen = seen.setdefault(record.allocator, set())
        before = previous_in_use.get(record.allocator, -1)
        previous_in_use[record.allocator] = record.bytes_in_use
        skip = False
        if record.is_alloc:
            _interval(intervals, record)
            if address in allocator_live:
                skip = True
            else:
                allocator_live.add(address)
                allocator_seen.add(address)
        elif address in allocator_live:
            allocator_live.discard(address)
        elif address in allocator_seen:
            skip = True
        else:
            size = record.size
            if size <= 0 and before >= 0 and record.bytes_in_use >= 0:
                size = before - record.bytes_in_use
            if size <= 0:
                skip = True
            else:
                seeds.append(record._replace(size=size))
                allocator_seen.add(address)
        if skip:
            skipped.add(i)
        elif record.step is not None:
            first.setdefault(record.step, i)
            last[record.step] = i
    bounds = ({i: step for step, i in first.items()}, {i: step for step, i in last.items()})
    return seeds, skipped, intervals, bounds


def _tag(log: EventLog, record: MemoryRecord) -> int:
    tag = memory_tag(record.op, record.dtype, record.shape)
    return NO_INDEX if tag is None else log.intern_string(tag)


def _mark(log: EventLog, time_ns: int, phase: MarkPhase, step: int) -> None:
    log.append(event_row(time_ns=time_ns, kind=int(Kind.MARK), flags=int(phase), tag=log.intern_string(f"step {step}")))
