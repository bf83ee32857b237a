"""Tables derived from an EventLog: allocations with lifetimes, transfers, marks, OOMs,
segment changes and op placements. Pure functions; each returns a pandas DataFrame.

Sizes in bytes, times in ns (``time_ns`` on the log's monotonic clock).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuviz.analysis.native import kernel_function
from gpuviz.analysis.timeline import timeline_series
from gpuviz.base.tags import ArrayTag, parse_array_tag
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import KIND_NAMES, Direction, Kind, MarkPhase

__all__ = [
    "allocation_table",
    "transfer_table",
    "mark_table",
    "oom_table",
    "segment_table",
    "placement_table",
    "call_site_table",
    "alive_at",
    "devices_present",
    "gpus_first",
]

_DIRECTIONS = {int(d): d.name for d in Direction}
_PHASES = {int(p): p.name.lower() for p in MarkPhase}


def _strings(log: EventLog, ids: np.ndarray) -> np.ndarray:
    table = np.array([*log.strings, None], dtype=object)
    return table[ids]  # -1 picks the trailing None


def _names(log: EventLog, ids: np.ndarray) -> np.ndarray:
    table = np.array([*log.device_names, None], dtype=object)
    return table[ids]


def _tags_by_slot(log: EventLog, ids: np.ndarray) -> tuple[np.ndarray, dict[int, ArrayTag | None]]:
    """Each tag id as a slot (id + 1; 0: no tag) and the parsed array tag of every slot used,
    each distinct tag parsed once (an index into per-slot tables, without sorting the ids)."""
    slot = ids.astype(np.int64) + 1
    used = np.flatnonzero(np.bincount(slot, minlength=len(log.strings) + 1)).tolist()
    return slot, {i: parse_array_tag(log.strings[i - 1]) if i else None for i in used}


def _parsed_tags(log: EventLog, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(op, dtype, shape) per tag id (-1: no tag), parsing each distinct tag once."""
    slot, parsed = _tags_by_slot(log, ids)
    ops, dtypes, shapes = (np.full(len(log.strings) + 1, None, dtype=object) for _ in range(3))
    for i, tag in parsed.items():
        if tag is not None:
            ops[i], dtypes[i], shapes[i] = tag.op, tag.dtype, tag.shape
    return ops[slot], dtypes[slot], shapes[slot]


def gpus_first(names: list[str]) -> list[str]:
    """``names`` with GPUs first, otherwise in their order (the order every view lists devices in)."""
    return sorted(names, key=lambda name: not name.upper().startswith("GPU"))


def devices_present(log: EventLog) -> list[str]:
    """The devices something happened on or was copied to, or that have an allocator (its options
    in the log's device table, even before any event), GPUs first. A device that was only asked
    for (a placement on a device that does not exist, moved by soft placement) is not one."""
    cols = log.columns
    # distinct ids without a Python object per event (np.unique sorts: both are linear here)
    used = {int(i) for i in np.flatnonzero(np.bincount(cols["device"][cols["device"] >= 0]))}
    used |= set(cols["peer"][cols["kind"] == Kind.TRANSFER].tolist())
    used |= {i for i, info in enumerate(log.devices) if info.options}
    return gpus_first([name for i, name in enumerate(log.device_names) if i in used])


def _free_of(kinds: np.ndarray, addresses: np.ndarray) -> np.ndarray:
    """For one device's alloc/free events in log order: per event, the event number of the free
    that ends it (for an alloc whose next event at its address is a free), else -1."""
    n = len(kinds)
    order = np.lexsort((np.arange(n), addresses))  # by address, then time: a free follows its alloc
    a, alloc = addresses[order], kinds[order] == Kind.ALLOC
    following = np.append(order[1:], 0)
    matched = alloc.copy()
    matched[:-1] &= ~alloc[1:] & (a[1:] == a[:-1])
    matched[-1:] = False
    out = np.full(n, -1, dtype=np.int64)
    out[order[matched]] = following[matched]
    return out


def _column(values: np.ndarray) -> pd.Series:
    """A table column of Python objects (strings, tuples) kept as they are: converting millions of
    strings to pandas' string dtype costs seconds and tells users nothing more."""
    return pd.Series(values, dtype=object, copy=False)


def _allocations_and_frees(log: EventLog, device: str | None) -> tuple[np.ndarray, np.ndarray]:
    """The log positions of the alloc events of ``device`` (None: every device), in log order,
    and of the free that ends each (the next alloc or free event at its address on its device,
    when that is a free), else -1."""
    cols = log.columns
    kind = cols["kind"]
    compiled = kernel_function("alloc_pairs")
    if compiled is not None:  # the same in one compiled pass
        rows, frees = compiled(
            np.ascontiguousarray(kind), np.ascontiguousarray(cols["device"], dtype=np.int16),
            np.ascontiguousarray(cols["address"], dtype=np.int64), -1 if device is None else log.device_index(device),
        )  # fmt: skip
        return np.frombuffer(rows, dtype=np.int64), np.frombuffer(frees, dtype=np.int64)
    mask = (kind == Kind.ALLOC) | (kind == Kind.FREE)
    if device is not None:
        mask &= cols["device"] == log.device_index(device)
    positions = np.flatnonzero(mask)
    devices = cols["device"][positions]
    free_at = np.full(len(positions), -1, dtype=np.int64)  # per event: its free's position in the log
    present = [log.device_index(device)] if device is not None else np.unique(devices).tolist()
    for index in present:  # pairs never cross devices
        mine = np.flatnonzero(devices == index) if device is None else np.arange(len(positions))
        pairs = _free_of(kind[positions[mine]], cols["address"][positions[mine]])
        ended = pairs >= 0
        free_at[mine[ended]] = positions[mine[pairs[ended]]]
    is_alloc = kind[positions] == Kind.ALLOC
    return positions[is_alloc], free_at[is_alloc]


def allocation_table(log: EventLog, device: str | None = None) -> pd.DataFrame:
    """One row per allocation, in log order: where, how big, tag, stack, and when it was made and freed.

    ``alloc_index``/``free_index`` are positions in the log (``free_index`` -1: never freed).
    ``op``/``dtype``/``shape`` are parsed from array tags (``op:dtype[shape]``) when present.
    """
    cols = log.columns
    rows, free_index = _allocations_and_frees(log, device)
    ops, dtypes, shapes = _parsed_tags(log, cols["tag"][rows])
    return pd.DataFrame(
        {
            "device": _column(_names(log, cols["device"][rows])),
            "address": cols["address"][rows],
            "size": cols["size"][rows],
            "requested": cols["requested"][rows],
            "tag": _column(_strings(log, cols["tag"][rows])),
            "op": _column(ops),
            "dtype": _column(dtypes),
            "shape": _column(shapes),
            "stack": cols["stack"][rows],
            "alloc_index": rows,
            "free_index": free_index,
            "alloc_ns": cols["time_ns"][rows],
            "free_ns": np.where(free_index >= 0, cols["time_ns"][np.maximum(free_index, 0)], -1),
        },
        copy=False,  # every column is a fresh array: keeping them as they are saves stacking them (a copy)
    )


def alive_at(allocations: pd.DataFrame, index: int) -> pd.DataFrame:
    """The allocations live right after the event at log position ``index``."""
    made = allocations["alloc_index"] <= index
    gone = (allocations["free_index"] >= 0) & (allocations["free_index"] <= index)
    return allocations[made & ~gone]


def transfer_table(log: EventLog) -> pd.DataFrame:
    """One row per transfer: start, duration, bytes, direction, devices, reason, bandwidth (bytes/s)."""
    t = log.filter(kind="transfer")
    cols = t.columns
    duration = cols["duration_ns"]
    return pd.DataFrame(
        {
            "seq": cols["seq"],
            "time_ns": cols["time_ns"],
            "duration_ns": duration,
            "bytes": cols["size"],
            "direction": [_DIRECTIONS.get(int(f), "?") for f in cols["flags"]],
            "source": _names(log, cols["device"]),
            "destination": _names(log, cols["peer"]),
            "reason": _strings(log, cols["tag"]),
            "bandwidth": np.where(duration > 0, cols["size"] * 1e9 / np.maximum(duration, 1), np.nan),
        }
    )


def mark_table(log: EventLog) -> pd.DataFrame:
    """One row per mark: time, label, phase (point / begin / end)."""
    m = log.filter(kind="mark")
    cols = m.columns
    return pd.DataFrame(
        {
            "seq": cols["seq"],
            "time_ns": cols["time_ns"],
            "label": _strings(log, cols["tag"]),
            "phase": [_PHASES.get(int(f), "point") for f in cols["flags"]],
        }
    )


def oom_table(log: EventLog, device: str | None = None) -> pd.DataFrame:
    """One row per out-of-memory event with the pool's state at that moment.

    ``fragmentation_cause`` is True when enough bytes were free in the pool and still
    reservable under the limit, but no chunk was large enough.
    """
    frames = []
    cols = log.columns
    present = np.unique(cols["device"][cols["kind"] == Kind.OOM])
    for device_id in present.tolist():
        name = log.devices[device_id].name
        if device is not None and name != device:
            continue
        series = timeline_series(log, name)
        at = np.flatnonzero(cols["kind"][series.index] == Kind.OOM)
        limit = int(log.devices[device_id].options.get("memory_limit", 0) or 0)
        free = series.pool_bytes[at] - series.bytes_in_use[at]
        reservable = np.maximum(limit - series.pool_bytes[at], 0) if limit else np.zeros(len(at), dtype=np.int64)
        rounded = cols["size"][series.index[at]]
        frames.append(
            pd.DataFrame(
                {
                    "seq": series.seq[at],
                    "time_ns": series.time_ns[at],
                    "device": name,
                    "requested": cols["requested"][series.index[at]],
                    "rounded": rounded,
                    "free": free,
                    "largest_free": series.largest_free[at],
                    "reservable": reservable,
                    "pool_bytes": series.pool_bytes[at],
                    "fragmentation_cause": (free + reservable >= rounded) & (rounded <= max(limit, 1)),
                }
            )
        )
    columns = ["seq", "time_ns", "device", "requested", "rounded", "free", "largest_free", "reservable",
               "pool_bytes", "fragmentation_cause"]  # fmt: skip
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def segment_table(log: EventLog, device: str | None = None) -> pd.DataFrame:
    """Segment reservations and releases, and ranges mapped into or unmapped from growing
    segments: time, device, kind, base address (start of the range), size in bytes."""
    s = log.filter(kind=["segment_alloc", "segment_free", "segment_map", "segment_unmap"], device=device)
    cols = s.columns
    return pd.DataFrame(
        {
            "seq": cols["seq"],
            "time_ns": cols["time_ns"],
            "device": _names(log, cols["device"]),
            "kind": np.array(KIND_NAMES)[cols["kind"]],
            "address": cols["address"],
            "size": cols["size"],
        }
    )


def placement_table(log: EventLog) -> pd.DataFrame:
    """One row per (op, requested device, actual device), most time-consuming first.

    ``count``: times the op ran; ``soft``: runs moved by soft placement; ``op_ns``: time in
    the op; ``bytes_allocated``: output and input-copy allocations tagged with the op;
    ``bytes_transferred`` / ``transfer_ns``: copies made for the op (modelled duration).
    Allocations and transfers are attributed to the nearest run of their op in the log.
    """
    cols = log.columns
    columns = ["op", "requested", "device", "count", "soft", "op_ns", "bytes_allocated",
               "bytes_transferred", "transfer_ns"]  # fmt: skip
    place = np.flatnonzero(cols["kind"] == Kind.PLACEMENT)
    if not len(place):
        return pd.DataFrame(columns=columns)
    ops = _strings(log, cols["tag"][place])
    requested = _names(log, cols["peer"][place])
    actual = _names(log, cols["device"][place])
    sums = {
        name: np.zeros(len(place), dtype=np.int64) for name in ("bytes_allocated", "bytes_transferred", "transfer_ns")
    }
    # each event's op as a number (the op's position in ``names``; -1: none), compared as integers
    names = list(dict.fromkeys(ops.tolist()))
    code = {op: i for i, op in enumerate(names)}
    allocs = np.flatnonzero(cols["kind"] == Kind.ALLOC)
    tag_slots, parsed = _tags_by_slot(log, cols["tag"][allocs])
    op_of_slot = np.full(len(log.strings) + 1, -1, dtype=np.int64)
    for slot, tag in parsed.items():
        op_of_slot[slot] = code.get(tag.op if tag else None, -1)
    alloc_ops = op_of_slot[tag_slots]
    transfers = np.flatnonzero(cols["kind"] == Kind.TRANSFER)
    string_ops = np.array([code.get(text, -1) for text in [*log.strings, None]], dtype=np.int64)
    transfer_ops = string_ops[cols["tag"][transfers]]  # tag -1 picks the trailing None
    for number, op in enumerate(names):
        rows = np.flatnonzero(ops == op)
        where = place[rows]
        for positions, column, duration in (
            (allocs[alloc_ops == number], "bytes_allocated", False),
            (transfers[transfer_ops == number], "bytes_transferred", True),
        ):
            if not len(positions):
                continue
            right = np.clip(np.searchsorted(where, positions), 0, len(where) - 1)
            left = np.clip(right - 1, 0, len(where) - 1)
            nearest = np.where(np.abs(where[left] - positions) <= np.abs(where[right] - positions), left, right)
            np.add.at(sums[column], rows[nearest], cols["size"][positions])
            if duration:
                np.add.at(sums["transfer_ns"], rows[nearest], cols["duration_ns"][positions])
    frame = pd.DataFrame(
        {
            "op": ops,
            "requested": requested,
            "device": actual,
            "soft": cols["flags"][place].astype(np.int64),
            "op_ns": cols["duration_ns"][place],
            **sums,
        }
    )
    keys = frame["requested"].fillna("")
    table = (
        frame.assign(requested=keys, count=1)
        .groupby(["op", "requested", "device"], sort=False)[
            ["count", "soft", "op_ns", "bytes_allocated", "bytes_transferred", "transfer_ns"]
        ]
        .sum()
        .reset_index()
    )
    table["requested"] = pd.Series([v or None for v in table["requested"]], dtype=object)
    table = table.sort_values(["op_ns", "transfer_ns"], ascending=False, kind="stable").reset_index(drop=True)
    return table[columns]


def call_site_table(log: EventLog) -> pd.DataFrame:
    """One row per call site (innermost recorded frame) of allocations and transfers, most
    bytes first: the placement table of code without ops, such as CuPy code with stacks on."""
    cols = log.columns
    columns = ["call_site", "allocations", "bytes_allocated", "transfers", "bytes_transferred", "transfer_ns"]
    kind, stack = cols["kind"], cols["stack"]
    rows = np.flatnonzero(((kind == Kind.ALLOC) | (kind == Kind.TRANSFER)) & (stack >= 0))
    if not len(rows):
        return pd.DataFrame(columns=columns)
    # summed per stack id first (a million events share a few thousand stacks), then per label;
    # each group-by keeps first occurrences in order, as one group-by over every event would
    is_alloc = kind[rows] == Kind.ALLOC
    size = cols["size"][rows]
    per_stack = pd.DataFrame({
        "allocations": is_alloc.astype(np.int64), "bytes_allocated": np.where(is_alloc, size, 0),
        "transfers": (~is_alloc).astype(np.int64), "bytes_transferred": np.where(is_alloc, 0, size),
        "transfer_ns": np.where(is_alloc, 0, cols["duration_ns"][rows]),
    }).groupby(stack[rows], sort=False).sum()  # fmt: skip
    labels = [f"{s[0].filename}:{s[0].lineno} ({s[0].function})" if s else "(no frame)" for s in
              (log.stacks[i] for i in per_stack.index.tolist())]  # fmt: skip
    frame = per_stack.reset_index(drop=True)
    frame.insert(0, "call_site", np.array(labels, dtype=object))
    table = frame.groupby("call_site", sort=False).sum().reset_index()
    table = table.sort_values(["bytes_allocated", "bytes_transferred"], ascending=False, kind="stable")
    return table.reset_index(drop=True)[columns]
