"""Any gpuviz event log as a PyTorch memory snapshot, for PyTorch's memory viewer.

``to_torch_snapshot(log)`` returns the plain dicts and lists ``torch.cuda.memory._snapshot()``
returns; ``write_torch_snapshot(log, path)`` pickles them as ``_dump_snapshot`` does (or writes
JSON when the name ends in ``.json``), so https://pytorch.org/memory_viz opens the file.

- ``segments``: every segment of the replayed final state of each device with allocator
  events (a mapped range of a device with ``segment_map`` events, not reserved by a
  ``segment_alloc`` of the exported trace, is ``is_expandable``), with its blocks (in use -> ``active_allocated``,
  or ``active_awaiting_free`` when a ``free_requested`` mark is pending; free -> ``inactive``)
  and the allocating frames;
- ``device_traces``: per device, the events as trace entries in log order: ``alloc`` (the
  requested bytes, as PyTorch records them, plus ``block_size``: the chunk's bytes, a key
  gpuviz adds and PyTorch's viewer ignores), ``free`` -> ``free_requested`` + ``free_completed``,
  ``segment_alloc``/``segment_free``/``segment_map``/``segment_unmap``, ``oom``, and the
  ``free_requested``/``snapshot`` marks of an imported snapshot; splits, merges, transfers and
  placements have no PyTorch action;
- other marks -> ``external_annotations`` (begin -> START, end -> END, a point -> both);
- ``time_us`` = ``time_ns // 1000`` unless the log's times were inferred (a free's request is
  ``duration_ns`` before its completion);
- device ``GPU:n`` is device index n; other devices take the indices after the GPUs.

A log imported from a PyTorch snapshot exports its trace as it was: the events that rebuilt
the state alive before the trace began (those before ``meta["source"]["trace_start"]``) are left out of
the traces and present in ``segments``.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import Any

from gpuviz.analysis.replay import HEAP_KINDS, replay
from gpuviz.base.torch_rules import FREE_REQUESTED_MARK
from gpuviz.log.eventlog import EventLog, Frame
from gpuviz.log.schema import Kind, MarkPhase

__all__ = ["to_torch_snapshot", "write_torch_snapshot", "device_indices"]

_GPU = re.compile(r"^GPU:(\d+)$")
_HEAP = {int(k) for k in HEAP_KINDS} | {int(Kind.OOM)}
_SMALL_SEGMENT = 2 << 20  # PyTorch's small-pool segments are exactly 2 MiB
_SMALL_SIZE = 1 << 20  # the largest request of the small pool
_LARGE_GRANULE = 20 << 20  # expandable segments map the large pool in 20 MiB granules
_TRACE_MARKS = (FREE_REQUESTED_MARK, "snapshot")  # marks an imported snapshot's trace entries became
_SEGMENT_ACTIONS = {int(k): k.name.lower() for k in (Kind.SEGMENT_ALLOC, Kind.SEGMENT_FREE, Kind.SEGMENT_MAP,
                                                     Kind.SEGMENT_UNMAP)}  # fmt: skip


def device_indices(log: EventLog) -> dict[str, int]:
    """PyTorch device index of each device: ``GPU:n`` -> n, the others after the largest GPU index."""
    indices: dict[str, int] = {}
    for name in log.device_names:
        match = _GPU.match(name)
        if match:
            indices[name] = int(match.group(1))
    following = max(indices.values(), default=-1) + 1
    for name in log.device_names:
        if name not in indices:
            indices[name] = following
            following += 1
    return indices


def _frames(log: EventLog, stack: int, cache: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    if stack < 0:
        return []
    found = cache.get(stack)
    if found is None:
        frames: tuple[Frame, ...] = log.stacks[stack]
        found = cache[stack] = [{"filename": f.filename, "line": f.lineno, "name": f.function} for f in frames]
    return found


def to_torch_snapshot(log: EventLog) -> dict[str, Any]:
    """The snapshot dict of ``log`` (see the module docstring). Sizes and addresses in bytes."""
    cols = log.columns
    source = log.meta.get("source") or {}
    starts = source.get("trace_start") if source.get("format") == "pytorch-snapshot" else None
    skip = max((int(v) for v in starts.values()), default=0) if isinstance(starts, dict) else 0
    timed = (log.meta.get("columns") or {}).get("time_ns") != "inferred"
    indices = device_indices(log)
    names = log.device_names
    frames_cache: dict[int, list[dict[str, Any]]] = {}
    traces: dict[int, list[dict[str, Any]]] = {}
    annotations: list[dict[str, Any]] = []
    pending: dict[int, set[int]] = {}  # device -> addresses with a free_requested waiting
    heap_devices: set[int] = set()
    strings = log.strings
    rows = zip(*(cols[c].tolist() for c in ("time_ns", "kind", "flags", "device", "address", "size", "requested",
                                            "tag", "stack", "duration_ns")), strict=True)  # fmt: skip
    for position, (time_ns, kind, flags, device, address, size, requested, tag, stack, duration) in enumerate(rows):
        if kind in _HEAP and device >= 0:
            heap_devices.add(device)
        if position < skip:
            continue
        index = indices[names[device]] if device >= 0 else 0
        out = traces.setdefault(index, [])
        common = {"stream": 0, "frames": _frames(log, stack, frames_cache)}
        if timed:
            common["time_us"] = time_ns // 1000
        if kind == Kind.ALLOC:
            out.append({"action": "alloc", "addr": address, "size": requested, "block_size": size, **common})
        elif kind == Kind.FREE:
            waiting = pending.get(device, set())
            if address in waiting:
                waiting.discard(address)
            else:
                requested_at = dict(common, time_us=(time_ns - duration) // 1000) if timed else common
                out.append({"action": "free_requested", "addr": address, "size": requested, **requested_at})
            out.append({"action": "free_completed", "addr": address, "size": requested, **common})
        elif kind in _SEGMENT_ACTIONS:
            out.append({"action": _SEGMENT_ACTIONS[kind], "addr": address, "size": size, **common})
        elif kind == Kind.OOM:
            out.append({"action": "oom", "addr": 0, "size": requested, "device_free": 0, **common})
        elif kind == Kind.MARK:
            label = strings[tag] if tag >= 0 else ""
            if device >= 0 and label in _TRACE_MARKS:
                if label == FREE_REQUESTED_MARK:
                    pending.setdefault(device, set()).add(address)
                out.append({"action": label, "addr": address, "size": requested, **common})
                continue
            stages = {int(MarkPhase.BEGIN): ("START",), int(MarkPhase.END): ("END",)}.get(flags, ("START", "END"))
            for stage in stages:
                annotations.append({"stage": stage, "name": label, "device": index, "time_us": time_ns // 1000})
    heap = replay(log)
    mapped = set(cols["device"][cols["kind"] == Kind.SEGMENT_MAP].tolist())  # devices whose segments grow
    reserved = set(cols["address"][skip:][cols["kind"][skip:] == Kind.SEGMENT_ALLOC].tolist())  # cudaMalloc'd bases
    segments: list[dict[str, Any]] = []
    for device in sorted(heap_devices):
        name = names[device]
        waiting = pending.get(device, set())
        for segment in heap.state_at(-1, device=name).segments:
            blocks = [
                {
                    "address": c.address,
                    "size": c.size,
                    "requested_size": c.requested,
                    "state": ("active_awaiting_free" if c.address in waiting else "active_allocated")
                    if c.in_use
                    else "inactive",
                    "frames": _frames(log, c.stack, frames_cache) if c.in_use else [],
                }
                for c in segment.chunks
            ]
            used = [c for c in segment.chunks if c.in_use]
            expandable = device in mapped and segment.base not in reserved
            # small pool: a 2 MiB segment; a mapped range of 2 MiB granules (not whole 20 MiB ones)
            # or holding only blocks of at most 1 MiB
            small = segment.size == _SMALL_SEGMENT or (expandable and (
                segment.size % _LARGE_GRANULE != 0 or all(c.size <= _SMALL_SIZE for c in segment.chunks)))  # fmt: skip
            segments.append({
                "device": indices[name], "address": segment.base, "total_size": segment.size,
                "allocated_size": sum(c.size for c in used), "active_size": sum(c.size for c in used),
                "requested_size": sum(c.requested for c in used), "stream": 0,
                "segment_type": "small" if small else "large", "segment_pool_id": (0, 0),
                "is_expandable": expandable, "frames": [], "blocks": blocks,
            })  # fmt: skip
    count = max([*traces, *(s["device"] for s in segments)], default=-1) + 1
    snapshot: dict[str, Any] = {
        "segments": segments,
        "device_traces": [traces.get(i, []) for i in range(count)],
        "external_annotations": annotations,
    }
    settings = source.get("allocator_settings")
    if isinstance(settings, dict) and settings:
        snapshot["allocator_settings"] = settings
    return snapshot


def write_torch_snapshot(log: EventLog, path: str | Path) -> Path:
    """Write ``log`` as a PyTorch snapshot: a pickle (as ``_dump_snapshot`` writes), JSON for ``.json`` names."""
    path = Path(path)
    snapshot = to_torch_snapshot(log)
    if path.suffix == ".json":
        path.write_text(json.dumps(snapshot))
    else:
        with open(path, "wb") as file:
            pickle.dump(snapshot, file)
    return path
