"""A PyTorch snapshot of expandable segments (a small hand-written fixture: PyTorch records them only
on CUDA; a real 3-GPU one is among the optional real traces): the trace's mapped and
unmapped ranges become segment_map/segment_unmap, the segments at the start are found by
undoing them, and replay ends in the snapshot's own segments."""

from __future__ import annotations

from pathlib import Path

import gpuviz
from gpuviz.exporters.torch_snapshot import to_torch_snapshot

FIXTURE = Path(__file__).parent / "fixtures" / "pt_snapshot_expandable.json"
BASE = 0x7F4A00000000
MiB = 1 << 20


def test_mapped_ranges_become_growing_segments_and_replay_ends_in_the_snapshot() -> None:
    log = gpuviz.load(FIXTURE)
    assert log.meta["source"]["allocator_settings"] == {"expandable_segments": True}
    assert not log.meta.get("conflicts")
    events = [(e.kind, (e.address - BASE) // MiB, e.size // MiB) for e in log if e.kind != "mark"]
    assert events == [
        ("segment_alloc", 0, 20),  # mapped before the trace began: [0, 40) minus the trace's net mapping
        ("split", 0, 6),
        ("alloc", 0, 6),  # alive in the final segments, never allocated in the trace
        ("segment_map", 20, 20),  # joins the segment at BASE
        ("merge", 6, 34),
        ("split", 6, 20),
        ("alloc", 6, 20),
        ("free", 6, 20),
        ("merge", 6, 34),
        ("split", 6, 14),  # the unmapped granule is cut out of the free block
        ("segment_unmap", 20, 20),
        ("segment_map", 20, 20),
        ("merge", 6, 34),
        ("split", 6, 10),
        ("alloc", 6, 10),
    ]
    final = gpuviz.replay(log).state_at(-1)
    assert [(s.base - BASE, s.size) for s in final.segments] == [(0, 40 * MiB)]
    assert [(c.address - BASE, c.size, c.in_use) for c in final.segments[0].chunks] == [
        (0, 6 * MiB, True),
        (6 * MiB, 10 * MiB, True),
        (16 * MiB, 24 * MiB, False),
    ]


def test_export_writes_the_mapped_ranges_back() -> None:
    snapshot = to_torch_snapshot(gpuviz.load(FIXTURE))
    actions = [(t["action"], (t["addr"] - BASE) // MiB) for t in snapshot["device_traces"][0]]
    assert [a for a in actions if a[0].startswith("segment")] == [
        ("segment_map", 20), ("segment_unmap", 20), ("segment_map", 20)
    ]  # fmt: skip
    assert [(s["address"], s["total_size"], s["is_expandable"]) for s in snapshot["segments"]] == [
        (BASE, 40 * MiB, True)
    ]
