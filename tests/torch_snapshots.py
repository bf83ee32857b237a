"""Helpers for the PyTorch snapshot tests: the real files (GPUVIZ_TEST_TRACES, through ``traces``), and
what a snapshot says, read with plain pickle."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from traces import trace_files

from gpuviz.base.heapstate import ChunkState, HeapState, SegmentState

MULTI_DEVICE = "pt_snapshot_codelocation_3gpu_expandable_oom.pickle"
"""Three GPUs, expandable segments (segment_map/segment_unmap) and an out-of-memory event."""
SNAPSHOT_NAMES = (
    "pt_snapshot_assignment2_2026a.pickle",
    "pt_snapshot_assignment2_2026b.pickle",
    "pt_snapshot_cs336_ctx128_forward_mixed_2025.pickle",
    "pt_snapshot_cs336_ctx128_fullstep_2025.pickle",
    "pt_snapshot_ftcourse_2024.pickle",
    MULTI_DEVICE,
)
"""The real PyTorch snapshots: every ``pt_snapshot_*.pickle`` of the traces folder."""
SNAPSHOTS = trace_files(SNAPSHOT_NAMES, pattern="pt_snapshot_*.pickle")
"""``pytest.param`` s of their paths (one skipped parameter where the real traces are not available)."""


def snapshots(*, xfail: dict[str, str]) -> list[object]:
    """``SNAPSHOTS`` with the files a test is known not to pass yet marked (strict) expected failures."""
    return trace_files(SNAPSHOT_NAMES, pattern="pt_snapshot_*.pickle", xfail=xfail)


def raw(path: Path) -> dict[str, Any]:
    """The snapshot, unpickled by the standard library (the test's independent reading)."""
    with open(path, "rb") as file:
        data: dict[str, Any] = pickle.load(file)
    return data


def final_state(snapshot: dict[str, Any], device: int = 0) -> HeapState:
    """The HeapState the snapshot's own ``segments`` describe: active blocks in use (with their
    requested bytes), inactive blocks free."""
    segments = []
    for segment in sorted((s for s in snapshot["segments"] if s["device"] == device), key=lambda s: s["address"]):
        chunks = tuple(
            ChunkState(
                b["address"],
                b["size"],
                max(b["requested_size"], 1) if b["state"] != "inactive" else 0,
                b["state"] != "inactive",
            )
            for b in segment["blocks"]
        )
        segments.append(SegmentState(segment["address"], segment["total_size"], chunks))
    return HeapState(f"GPU:{device}", tuple(segments))


def first_divergence(got: HeapState, want: HeapState) -> str:
    """Where two heap states first differ, in words (for assertion messages)."""
    got_segments = {s.base: s for s in got.segments}
    for segment in want.segments:
        other = got_segments.get(segment.base)
        if other is None:
            return f"segment {segment.base:#x} (+{segment.size}) missing"
        if other.size != segment.size:
            return f"segment {segment.base:#x} size {other.size} != {segment.size}"
        for a, b in zip(other.chunks, segment.chunks, strict=False):
            if a != b:
                return f"segment {segment.base:#x}: got {a}, want {b}"
        if len(other.chunks) != len(segment.chunks):
            return f"segment {segment.base:#x}: {len(other.chunks)} chunks != {len(segment.chunks)}"
    extra = set(got_segments) - {s.base for s in want.segments}
    return f"extra segments {sorted(extra)[:3]}" if extra else "no divergence"
