"""XProf / TensorBoard memory-profile JSON (``<host>.memory_profile.json[.gz]``).

Written by TensorFlow 2.3-2.10's profiler and, from an XPlane, by xprof's converter
(plugin/xprof/protobuf/memory_profile.proto, as proto3 JSON: camelCase keys, int64 values as
strings). Per allocator (``memoryProfilePerAllocator``: ``GPU_0_bfc``, ``gpu_host_bfc``, TPU
ids ``"0"``...) the ``sampledTimelineSnapshots`` hold one snapshot per allocation or
deallocation: ``timeOffsetPs`` (picoseconds from the profile's start), ``activityMetadata``
(memoryActivity ALLOCATION|DEALLOCATION, address, requestedBytes, allocationBytes, tfOpName,
dataType, tensorShape, regionType, stepId) and ``aggregationStats`` after it
(heapAllocatedBytes, peakBytesInUse, ...).

XProf keeps at most 1000 snapshots per allocator: above that the timeline is *sampled* (the
largest heap of each window), and the snapshots no longer form a complete allocation stream.
An allocator with fewer is complete. ``meta["source"]["sampled"]`` says which were sampled.

Fidelity rule: gpuviz's bytes in use after each snapshot plus the device's
``untracked_bytes_in_use`` (memory in use before the profile that it never frees, e.g. XProf's
"unused preallocated device memory") equals the snapshot's ``heapAllocatedBytes`` whenever the
difference is the same after every snapshot (``tf_memory.write_events``); otherwise the notes
give the range of the difference. Special allocations and the profile summary go to the
device's options.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections import Counter
from typing import Any, NamedTuple

import numpy as np

from gpuviz.base.errors import LogFormatError
from gpuviz.importers.builder import finish, set_source_meta
from gpuviz.importers.jsonstream import JsonStream
from gpuviz.importers.jsontop import JsonTop
from gpuviz.importers.memory_columns import MemoryColumnsBuilder
from gpuviz.importers.source import Progress, Source
from gpuviz.importers.tf_memory import MemoryRecord, add_devices, allocator_device, dtype_name, write_events
from gpuviz.log.eventlog import EventLog

__all__ = ["NAME", "DESCRIPTION", "sniff", "sniff_keys", "read", "MAX_SNAPSHOTS"]

NAME = "xprof-memory-profile"
DESCRIPTION = "an XProf/TensorBoard memory profile (.memory_profile.json)"
MAX_SNAPSHOTS = 1000  # xprof's max_num_snapshots: a timeline this long may be sampled
_ACTIVITIES = {"ALLOCATION": True, "DEALLOCATION": False}
_CHUNK = 1 << 16  # characters decompressed and parsed at a time


def sniff(head: bytes) -> bool:
    text = head.lstrip()
    return (
        text.startswith(b"{")
        and b'"memoryProfilePerAllocator"' in text
        and any(key in text for key in (b'"memoryIds"', b'"aggregationStats"', b'"profileSummary"'))
    )


def sniff_keys(top: JsonTop) -> bool:
    """A JSON object with ``memoryProfilePerAllocator`` at its top level, wherever it sits."""
    return "memoryProfilePerAllocator" in top.keys and any(
        key in top.keys for key in ("memoryIds", "version", "numHosts")
    )


def _int(value: Any, default: int = 0) -> int:
    """A proto3-JSON int64 (a string, or a number from other writers) that is not negative
    (addresses, sizes, steps): ``LogFormatError`` otherwise."""
    if value is None or value == "":
        return default
    if isinstance(value, str) and len(value) > 20:
        raise LogFormatError(f"{value[:24]!r}... is not a 64-bit integer")
    number = int(value)
    if not 0 <= number < 1 << 64:
        raise LogFormatError(f"{number} is out of range (a size, address or step from 0 to 2^64)")
    return number


def _record(allocator: str, snapshot: Any, skipped: Counter[str]) -> MemoryRecord | None:
    """The record of one timeline snapshot; None (counted in ``skipped``) for other activities."""
    if not isinstance(snapshot, dict):
        raise LogFormatError(f"a sampledTimelineSnapshots element is a {type(snapshot).__name__}, not an object")
    activity = snapshot.get("activityMetadata", {})
    kind = activity.get("memoryActivity", "")
    if kind not in _ACTIVITIES:
        skipped[kind or "UNSPECIFIED"] += 1
        return None
    stats = snapshot.get("aggregationStats", {})
    step = activity.get("stepId")
    return MemoryRecord(
        time_ns=_int(snapshot.get("timeOffsetPs")) // 1000,
        is_alloc=_ACTIVITIES[kind],
        allocator=allocator,
        address=_int(activity.get("address")),
        requested=_int(activity.get("requestedBytes")),
        size=_int(activity.get("allocationBytes")),
        bytes_in_use=_int(stats.get("heapAllocatedBytes"), -1),
        peak_bytes_in_use=_int(stats.get("peakBytesInUse"), -1),
        fragmentation=float(stats.get("fragmentation", -1.0)),
        op=str(activity.get("tfOpName") or ""),
        dtype=dtype_name(str(activity.get("dataType") or "")),
        shape=str(activity.get("tensorShape") or "") or None,
        region_type=str(activity.get("regionType") or ""),
        step=None if step is None else _int(step),
        thread=0,
    )


def _device_options(profile: dict[str, Any]) -> dict[str, Any]:
    summary = profile.get("profileSummary", {})
    peak = summary.get("peakStats", {})
    options: dict[str, Any] = {
        "memory_capacity": _int(summary.get("memoryCapacity")),
        "profile_summary": {
            "peak_bytes_in_use": _int(peak.get("peakBytesInUse")),
            "heap_allocated_bytes_at_peak": _int(peak.get("heapAllocatedBytes")),
            "stack_reserved_bytes_at_peak": _int(peak.get("stackReservedBytes")),
            "peak_bytes_usage_lifetime": _int(summary.get("peakBytesUsageLifetime")),
            "peak_time_ns": _int(summary.get("peakStatsTimePs")) // 1000,
        },
        "special_allocations": [
            {
                "op": s.get("tfOpName", ""),
                "bytes": _int(s.get("allocationBytes")),
                "region_type": s.get("regionType", ""),
            }
            for s in profile.get("specialAllocations", [])
        ],
    }
    return options


class _Profile(NamedTuple):
    """A memory profile read as a stream: the top object's small values (``document``), each
    allocator's object without its timeline (``profiles``), the timeline's memory records
    (``records``, in file order) and the timeline's length per allocator (``snapshots``)."""

    document: dict[str, Any]
    profiles: dict[str, dict[str, Any]]
    records: MemoryColumnsBuilder
    snapshots: dict[str, int]
    skipped: Counter[str]


_BIG = ("sampledTimelineSnapshots", "memoryProfileSnapshots", "activeAllocations")  # arrays read element by element


def _read_profile(source: Source) -> _Profile:
    """The profile, streamed (decompressed and parsed as it is read: one snapshot at a time)."""
    with source.open() as raw, io.TextIOWrapper(raw, encoding="utf-8") as text:
        try:
            stream = JsonStream(iter(lambda: text.read(_CHUNK), ""))
            if stream.peek() != "{":
                raise LogFormatError(f"{source.path} has no memoryProfilePerAllocator object")
            profile = _Profile({}, {}, MemoryColumnsBuilder(), {}, Counter())
            found = False
            for key in stream.items():
                if key == "memoryProfilePerAllocator" and stream.peek() == "{":
                    found = True
                    _read_allocators(stream, profile)
                elif key in ("memoryIds", "numHosts", "version"):
                    profile.document[key] = stream.value()
                else:
                    stream.skip()
            stream.end()
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise LogFormatError(f"{source.path}: the gzip stream is truncated or corrupt ({exc})") from None
    if not found:
        raise LogFormatError(f"{source.path} has no memoryProfilePerAllocator object")
    return profile


def _read_allocators(stream: JsonStream, profile: _Profile) -> None:
    for allocator in stream.items():
        if stream.peek() != "{":
            raise ValueError(f"memoryProfilePerAllocator[{allocator!r}] is not an object")
        small: dict[str, Any] = {}
        count = 0
        for key in stream.items():
            if key == "sampledTimelineSnapshots" and stream.peek() == "[":
                for _ in stream.elements():
                    record = _record(allocator, stream.value(), profile.skipped)
                    count += 1
                    if record is not None:
                        profile.records.add(record)
            elif key in _BIG:
                stream.skip()
            else:
                small[key] = stream.value()
        profile.profiles[allocator] = small
        profile.snapshots[allocator] = count


def read(source: Source, *, progress: Progress) -> EventLog:
    profile = _read_profile(source)
    document, per_allocator, skipped = profile.document, profile.profiles, profile.skipped
    order = [str(a) for a in document.get("memoryIds", []) if str(a) in per_allocator]
    order += [a for a in per_allocator if a not in order]
    sampled = {}
    hosts: dict[str, str] = {}
    known = {}
    for allocator in order:
        sampled[allocator] = profile.snapshots.get(allocator, 0) >= MAX_SNAPSHOTS
        options = _device_options(per_allocator[allocator])
        known[allocator_device(allocator, hosts)] = {"allocator": allocator, **options}
    rank = {allocator: i for i, allocator in enumerate(order)}
    unsorted = profile.records.build()
    # time order; equal times in memoryIds order, then file order (as the allocators' timelines joined)
    of_kind = np.array([rank[kind[0]] for kind in unsorted.kinds], dtype=np.int32)
    records = unsorted.sorted_by_time(then=of_kind[unsorted.columns["texts"]])
    del unsorted
    region_types = {k: n for k, n in records.counts(4, allocations_only=True).items() if k}
    log = EventLog(arena=False)  # built at once, then read whole
    devices = add_devices(log, order, known)
    notes = write_events(log, records, devices)  # consumes the records' columns
    notes.insert(
        0,
        f"times are from the profile's start; XProf keeps at most {MAX_SNAPSHOTS} snapshots per allocator "
        "(sampled above that: the largest heap of each window), so a sampled timeline is incomplete",
    )
    if skipped:
        notes.append(f"snapshots of other activities were skipped: {dict(skipped)}")
    set_source_meta(
        log,
        format=NAME,
        file=str(source.path),
        version=str(document.get("version", "")) or None,
        tool="XProf / TensorBoard profiler (memory_profile)",
        columns={
            "time_ns": "exact",
            "device": "exact",
            "address": "exact",
            "size": "exact",
            "requested": "exact",
            "tag": "exact",
            "thread": "absent",
            "segment": "inferred",
            "largest_free": "inferred",
            "split/merge": "inferred",
            "stack": "absent",
            "oom": "absent",
            "region_type": "absent",
        },
        notes=notes,
        extra={
            "allocators": order,
            "num_hosts": _int(document.get("numHosts")),
            "sampled": sampled,
            "region_types": region_types,
        },
    )
    return finish(log)
