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

import json
from collections import Counter
from typing import Any

from gpuviz.base.errors import LogFormatError
from gpuviz.importers.builder import finish, set_source_meta
from gpuviz.importers.source import Progress, Source
from gpuviz.importers.tf_memory import MemoryRecord, add_devices, allocator_device, dtype_name, write_events
from gpuviz.log.eventlog import EventLog

__all__ = ["NAME", "DESCRIPTION", "sniff", "read", "MAX_SNAPSHOTS"]

NAME = "xprof-memory-profile"
DESCRIPTION = "an XProf/TensorBoard memory profile (.memory_profile.json)"
MAX_SNAPSHOTS = 1000  # xprof's max_num_snapshots: a timeline this long may be sampled
_ACTIVITIES = {"ALLOCATION": True, "DEALLOCATION": False}


def sniff(head: bytes) -> bool:
    text = head.lstrip()
    return (
        text.startswith(b"{")
        and b'"memoryProfilePerAllocator"' in text
        and any(key in text for key in (b'"memoryIds"', b'"aggregationStats"', b'"profileSummary"'))
    )


def _int(value: Any, default: int = 0) -> int:
    """A proto3-JSON int64 (a string, or a number from other writers)."""
    if value is None or value == "":
        return default
    return int(value)


def _records(allocator: str, snapshots: list[dict[str, Any]], skipped: Counter[str]) -> list[MemoryRecord]:
    records = []
    for snapshot in snapshots:
        activity = snapshot.get("activityMetadata", {})
        kind = activity.get("memoryActivity", "")
        if kind not in _ACTIVITIES:
            skipped[kind or "UNSPECIFIED"] += 1
            continue
        stats = snapshot.get("aggregationStats", {})
        step = activity.get("stepId")
        records.append(
            MemoryRecord(
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
        )
    return records


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


def read(source: Source, *, progress: Progress) -> EventLog:
    document = json.loads(source.read_all())
    if not isinstance(document, dict) or not isinstance(document.get("memoryProfilePerAllocator"), dict):
        raise LogFormatError(f"{source.path} has no memoryProfilePerAllocator object")
    per_allocator: dict[str, dict[str, Any]] = document["memoryProfilePerAllocator"]
    order = [str(a) for a in document.get("memoryIds", []) if str(a) in per_allocator]
    order += [a for a in per_allocator if a not in order]
    skipped: Counter[str] = Counter()
    records: list[MemoryRecord] = []
    sampled = {}
    hosts: dict[str, str] = {}
    known = {}
    for allocator in order:
        profile = per_allocator[allocator]
        snapshots = profile.get("sampledTimelineSnapshots", [])
        sampled[allocator] = len(snapshots) >= MAX_SNAPSHOTS
        records += _records(allocator, snapshots, skipped)
        known[allocator_device(allocator, hosts)] = {"allocator": allocator, **_device_options(profile)}
    records.sort(key=lambda r: r.time_ns)
    log = EventLog()
    devices = add_devices(log, order, known)
    notes = write_events(log, records, devices)
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
            "region_types": dict(Counter(r.region_type for r in records if r.is_alloc and r.region_type)),
        },
    )
    return finish(log)
