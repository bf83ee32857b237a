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
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from gpuviz.base.tags import array_tag
from gpuviz.importers.builder import HeapBuilder, HeapConflict, event_row, infer_segments_of
from gpuviz.importers.memory_columns import MemoryColumns, MemoryRecord
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
    op = _safe_op(op)
    xla_dtype, dims = _shape_parts(shape)
    dtype = dtype or xla_dtype
    if dtype is None or dims is None:
        return op
    return array_tag(op, dtype, dims)


@lru_cache(maxsize=1 << 12)  # a trace has few op names and shapes, and many records of each
def _safe_op(op: str) -> str:
    return _TAG_UNSAFE.sub("_", op)


@lru_cache(maxsize=1 << 12)
def _shape_parts(shape: str | None) -> tuple[str | None, tuple[int, ...] | None]:
    """The dtype an XLA shape names (else None) and the dims of ``shape`` (None when not static)."""
    xla_dtype, text = _xla_shape(shape)
    return xla_dtype, parse_shape(text)


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
    """Seed, infer segments, then feed every record (in time order) to its device's heap; returns the notes.

    ``records`` given as ``MemoryColumns`` are consumed: their columns and kinds are dropped as soon
    as the writing needs them no more (the log takes their place)."""
    notes: list[str] = []
    if not records:
        notes.append("the trace holds no MemoryAllocation/MemoryDeallocation events")
        return notes
    columns = records if isinstance(records, MemoryColumns) else MemoryColumns.of(records)
    allocators = list(devices)
    c = columns.columns
    start = int(c["time_ns"][0])
    plan = _plan(columns, allocators)
    heaps = [HeapBuilder(log, devices[allocator]) for allocator in allocators]
    for heap, segments in zip(heaps, plan.segments, strict=True):
        for base, size in segments:
            heap.segment_alloc(start, base, size)
    c["tag"] = _intern_tags(log, columns.kinds, c, plan)
    columns.kinds = []  # each kind is its tag now: the kinds go before the log grows
    seeded = [0] * len(heaps)  # bytes in use the seeds add, per allocator
    conflicts = 0
    for i, size in zip(plan.seeds.tolist(), plan.seed_sizes.tolist(), strict=True):
        allocator = int(c["allocator"][i])
        try:
            address, requested, thread = int(c["address"][i]), int(c["requested"][i]), int(c["thread"][i])
            heaps[allocator].alloc(start, address, size, requested, thread=thread, tag=int(c["tag"][i]))
            seeded[allocator] += size
        except HeapConflict:  # overlaps another seed: its free is skipped as a conflict too
            conflicts += 1
    in_use = _InUse(seeded)
    first, last = plan.first, plan.last
    for begin, block in _blocks(c):  # each block of columns is dropped once written: the log takes its place
        rows = zip(*(block[name].tolist() for name in _WRITTEN[:-1]), strict=True)
        delta = np.zeros(len(block["action"]), dtype=np.int64)  # bytes in use each record adds
        for j, (action, allocator, time_ns, address, size, requested, thread, tag) in enumerate(rows):
            i = begin + j
            if action == _SKIP:
                continue
            if i in first:
                _mark(log, time_ns, MarkPhase.BEGIN, first[i])
            try:
                if action == _ALLOC:
                    heaps[allocator].alloc(time_ns, address, size, requested, thread=thread, tag=tag)
                    delta[j] = size
                else:
                    delta[j] = -heaps[allocator].free(time_ns, address, thread=thread)
            except HeapConflict:
                conflicts += 1
            if i in last:
                _mark(log, time_ns, MarkPhase.END, last[i])
        in_use.add(block, delta)
    in_use.report(log, allocators, devices, notes)
    for allocator, peak in plan.peaks.items():
        log.devices[devices[allocators[allocator]]].options["tf_peak_bytes_in_use"] = peak
    notes.append("segments are inferred: the connected address ranges ever allocated (TF does not trace regions)")
    if len(plan.seeds):
        notes.append(f"{len(plan.seeds)} allocations made before the trace began (freed in it) are placed at its start")
    if plan.skipped or conflicts:
        notes.append(
            f"{plan.skipped + conflicts} events that contradict the heap (an allocation over memory in use, "
            "a second free) were skipped"
        )
    return notes


_SKIP, _ALLOC, _FREE = 0, 1, 2
_BLOCK = 1 << 10  # records turned into Python values at a time


def _intern_tags(
    log: EventLog, kinds: list[tuple[str, str, str | None, str | None, str]], c: dict[str, np.ndarray], plan: _Plan
) -> np.ndarray:
    """Each record's tag id (int32; NO_INDEX: none), in place of its kind (``c["texts"]``, dropped):
    the kind's ``memory_tag``, interned before any row is written, in the order the writing uses
    strings -- each seed's tag, then per written record its step's mark and its allocation's tag --
    so the string table is the one interning each string on first use gives, and the kinds (a Python
    object each) are gone before the log grows."""
    texts = c.pop("texts")
    n_seeds = len(plan.seeds)
    allocs = np.flatnonzero(c["action"] == _ALLOC)
    used = np.concatenate([texts[plan.seeds], texts[allocs]])
    rank = np.concatenate([np.arange(n_seeds, dtype=np.int64), n_seeds + 2 * allocs + 1])  # marks: + 2 * i
    kinds_used, at = np.unique(used, return_index=True)
    del used, allocs
    steps = np.array(list(plan.first.values()), dtype=np.int64)
    ranks = np.concatenate([rank[at], n_seeds + 2 * np.array(list(plan.first), dtype=np.int64)])
    values = np.concatenate([kinds_used, steps])  # a kind, or (from len(kinds_used) on) a step
    del rank, at, steps
    order = np.argsort(ranks, kind="stable")
    del ranks
    of_kind = np.full(len(kinds), NO_INDEX, dtype=np.int32)
    for first in range(0, len(order), _BLOCK):  # as Python values a block at a time
        window = order[first : first + _BLOCK]
        for position, value in zip(window.tolist(), values[window].tolist(), strict=True):
            if position >= len(kinds_used):
                log.intern_string(_step_label(value))
                continue
            _, op, dtype, shape, _ = kinds[value]
            text = memory_tag(op, dtype, shape)
            if text is not None:
                of_kind[value] = log.intern_string(text)
    tags: np.ndarray = of_kind[texts]
    return tags


def _step_label(step: int) -> str:
    """The tag of a profiler step's marks."""
    return f"step {step}"


_WRITTEN = ("action", "allocator", "time_ns", "address", "size", "requested", "thread", "tag", "bytes_in_use")


def _blocks(columns: dict[str, np.ndarray]) -> Iterator[tuple[int, np.ndarray]]:
    """The columns the writing reads (``_WRITTEN``) in blocks of ``_BLOCK`` records, each one
    structured array (one allocation, which the log's rows reuse once it is freed), with the index
    of its first record; the whole columns are dropped first (one at a time) and each block when
    the next is asked for."""
    n = len(columns["action"])
    starts = range(0, n, _BLOCK)
    layout = np.dtype([(name, columns[name].dtype) for name in _WRITTEN])
    blocks = [np.empty(min(_BLOCK, n - start), dtype=layout) for start in starts]
    for name in _WRITTEN:
        column = columns.pop(name)
        for block, start in zip(blocks, starts, strict=True):
            block[name] = column[start : start + _BLOCK]
        del column
    empty = np.empty(0, dtype=layout)
    for i, start in enumerate(starts):
        block, blocks[i] = blocks[i], empty
        yield start, block


class _InUse:
    """TF's bytes in use after each written record minus gpuviz's, per allocator: the device's
    ``untracked_bytes_in_use`` when always the same, else a note with its range."""

    def __init__(self, seeded: list[int]) -> None:
        self._ours = list(seeded)  # gpuviz's bytes in use so far
        self._low: list[int | None] = [None] * len(seeded)
        self._high: list[int | None] = [None] * len(seeded)

    def add(self, block: np.ndarray, delta: np.ndarray) -> None:
        """``block``'s records, whose bytes in use changed by ``delta`` (0 where skipped or refused)."""
        allocator, theirs = block["allocator"], block["bytes_in_use"]
        for i in np.unique(allocator).tolist():
            mine = allocator == i
            ours = np.cumsum(delta[mine]) + self._ours[i]
            self._ours[i] = int(ours[-1])
            known = (block["action"][mine] != _SKIP) & (theirs[mine] >= 0)
            values = theirs[mine][known] - ours[known]
            if len(values):
                low, high = int(values.min()), int(values.max())
                self._low[i] = low if self._low[i] is None else min(low, self._low[i])
                self._high[i] = high if self._high[i] is None else max(high, self._high[i])

    def report(self, log: EventLog, allocators: list[str], devices: dict[str, int], notes: list[str]) -> None:
        for i, allocator in enumerate(allocators):
            low, high = self._low[i], self._high[i]
            if low is None:
                continue
            if low == high:
                log.devices[devices[allocator]].options["untracked_bytes_in_use"] = low
            else:
                notes.append(f"{allocator}: the source's bytes in use differ from the replayed bytes in use by "
                             f"{low}..{high} bytes (events missing from the trace)")  # fmt: skip


class _Plan(NamedTuple):
    """What to do with the records (in time order) beyond each one's ``action`` and ``allocator``."""

    skipped: int  # records whose action is _SKIP
    seeds: np.ndarray  # records (frees) whose allocation is placed at the trace's start
    seed_sizes: np.ndarray  # their chunk bytes
    segments: list[list[tuple[int, int]]]  # per allocator: (base, size) inferred from its allocations and seeds
    first: dict[int, int]  # index of the first record of each profiler step -> the step
    last: dict[int, int]  # index of its last record -> the step
    peaks: dict[int, int]  # allocator -> TF's largest peak_bytes_in_use (skipped records too), where known


def _plan(records: MemoryColumns, allocators: list[str]) -> _Plan:
    """Decide every record at once, per (allocator, address) in time order: an allocation is skipped
    when the previous record at its address is an allocation (memory in use); a free is normal after
    an allocation; a free before any allocation at its address is a seed (allocated before the trace
    began: the first such free with a size), every other free is skipped (a second free).

    A seeded free that names no size (XProf writes allocationBytes 0 for some) takes the drop
    of the source's bytes in use since the allocator's previous record, where both are known.
    Adds the columns ``action`` (_SKIP, _ALLOC or _FREE, int8) and ``allocator`` (index into
    ``allocators``) and drops those the writing needs no more (peak, step, fragmentation)."""
    c = records.columns
    del c["fragmentation"]  # the columns the writing needs no more go first
    index = {name: i for i, name in enumerate(allocators)}
    of_kind = np.array([index[kind[0]] for kind in records.kinds], dtype=np.int32)
    allocator = of_kind[c["texts"]]
    peak = c.pop("peak_bytes_in_use")
    peaks = {}
    for i in range(len(allocators)):
        mine = peak[allocator == i]
        if len(mine) and int(mine.max()) > -1:
            peaks[i] = int(mine.max())
    del peak
    is_alloc, size, in_use = c.pop("is_alloc"), c["size"], c["bytes_in_use"]
    n = len(is_alloc)
    position = np.int32 if n < 1 << 31 else np.int64  # record positions: 4 bytes where they fit
    effective = size.copy()
    infer = size <= 0
    if infer.any():  # sizes to infer: the previous record of the same allocator
        by_allocator = np.argsort(allocator, kind="stable")
        before = np.full(n, -1, dtype=np.int64)
        same = allocator[by_allocator][1:] == allocator[by_allocator][:-1]
        before[by_allocator[1:][same]] = in_use[by_allocator[:-1][same]]
        del by_allocator, same
        infer &= (before >= 0) & (in_use >= 0)
        effective[infer] = before[infer] - in_use[infer]
        del before
    del infer
    order = np.lexsort((c["address"], allocator)).astype(position)  # stable: time order within (allocator, address)
    a = is_alloc[order]
    new = np.ones(n, dtype=bool)
    keys = allocator[order]
    new[1:] = keys[1:] != keys[:-1]
    keys = c["address"][order]
    new[1:] |= keys[1:] != keys[:-1]
    del keys
    starts = np.flatnonzero(new).astype(position)
    group = np.cumsum(new, dtype=position) - 1
    previous_alloc = np.zeros(n, dtype=bool)
    previous_alloc[1:] = a[:-1]
    previous_alloc[new] = False
    counts = np.cumsum(a, dtype=position) - a  # allocations before each record, within its group after the next line
    counts -= counts[starts][group]
    candidate = ~a & ~previous_alloc & (counts == 0) & (effective[order] > 0)
    counts = np.cumsum(candidate, dtype=position) - candidate  # candidates before each record
    first_candidate = candidate & (counts == counts[starts][group])
    del counts, candidate, group, starts
    action = np.full(n, _SKIP, dtype=np.int8)
    sorted_action = np.where(a, np.where(previous_alloc, _SKIP, _ALLOC), np.where(previous_alloc, _FREE, _SKIP))
    action[order] = np.where(first_candidate, _FREE, sorted_action)  # a seed's free is a normal free
    seed = np.zeros(n, dtype=bool)
    seed[order] = first_candidate
    del a, new, previous_alloc, first_candidate, sorted_action, order
    seeds = np.flatnonzero(seed)
    intervals = np.flatnonzero(is_alloc | seed)  # what the segments are inferred from
    sizes, of_interval = np.where(seed, effective, size)[intervals], allocator[intervals]
    segments = [infer_segments_of(c["address"][intervals][of_interval == i], sizes[of_interval == i])
                for i in range(len(allocators))]  # fmt: skip
    del intervals, sizes, of_interval
    kept = np.flatnonzero((action != _SKIP) & c.pop("has_step"))
    steps = c.pop("step")[kept]
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    if len(kept):
        values, at = np.unique(steps, return_index=True)
        first = dict(zip(kept[at].tolist(), values.tolist(), strict=True))
        values, at = np.unique(steps[::-1], return_index=True)
        last = dict(zip(kept[len(kept) - 1 - at].tolist(), values.tolist(), strict=True))
    c["action"], c["allocator"] = action, allocator
    skipped = int(np.count_nonzero(action == _SKIP))
    return _Plan(skipped, seeds, effective[seeds], segments, first, last, peaks)


def _mark(log: EventLog, time_ns: int, phase: MarkPhase, step: int) -> None:
    tag = log.intern_string(_step_label(step))
    log.append(event_row(time_ns=time_ns, kind=int(Kind.MARK), flags=int(phase), tag=tag))
