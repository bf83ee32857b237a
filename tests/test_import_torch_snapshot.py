"""PyTorch memory snapshots opened as EventLogs: exact on every real file (GPUVIZ_TEST_TRACES), safe on
hostile pickles."""

from __future__ import annotations

import collections
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from torch_snapshots import MULTI_DEVICE, SNAPSHOT_NAMES, SNAPSHOTS, final_state, first_divergence, raw, snapshots
from traces import TRACES, needs_traces, trace_path

from gpuviz import LogFormatError, replay
from gpuviz.analysis.timeline import peak
from gpuviz.base.torch_rules import CachingRules
from gpuviz.importers import IMPORTERS, detect, load
from gpuviz.importers import torch_snapshot as ts
from gpuviz.importers.source import Source
from gpuviz.log.schema import MarkPhase

MiB = 1 << 20
BASE = 1 << 40

# file -> (events per kind, peak bytes in use): pinned from the import, checked against the raw file below
EXPECTED = {
    "pt_snapshot_assignment2_2026a.pickle": (
        {"alloc": 2609, "free": 2162, "mark": 2, "merge": 819, "segment_alloc": 96, "split": 1273}, 3861684736),
    "pt_snapshot_assignment2_2026b.pickle": (
        {"alloc": 1950, "free": 1721, "merge": 695, "segment_alloc": 216, "split": 934}, 13927832064),
    "pt_snapshot_cs336_ctx128_forward_mixed_2025.pickle": (
        {"alloc": 3027, "free": 1414, "merge": 653, "segment_alloc": 688, "split": 1723}, 24024505344),
    "pt_snapshot_cs336_ctx128_fullstep_2025.pickle": (
        {"alloc": 7095, "free": 5894, "mark": 4, "merge": 2573, "segment_alloc": 1010, "split": 3088}, 55079000576),
    "pt_snapshot_ftcourse_2024.pickle": (
        {"alloc": 4127, "free": 3325, "merge": 1142, "segment_alloc": 215, "split": 2006}, 5914094592),
}  # fmt: skip


def test_every_real_snapshot_file_is_covered() -> None:
    # and trace_files checks that the folder holds exactly these
    assert sorted(SNAPSHOT_NAMES) == sorted([*EXPECTED, MULTI_DEVICE])


@pytest.mark.parametrize("path", SNAPSHOTS)
def test_replay_ends_in_the_snapshots_own_segments_and_blocks(path: Path) -> None:
    """The fidelity check: every segment, block address, size, state and requested size."""
    log = load(path)
    got = replay(log).state_at(-1, device="GPU:0")
    want = final_state(raw(path))
    want.check()
    assert got == want, first_divergence(got, want)
    assert log.meta["source"]["conflicts"] == 0


def _initially_alive(snapshot: dict[str, Any]) -> int:
    """Allocations alive before the trace began, by PyTorch's viewer's rule, from the raw file."""
    live: set[int] = set()
    seen: set[int] = set()
    count = 0
    for entry in snapshot["device_traces"][0]:
        if entry["action"] == "alloc":
            live.add(entry["addr"])
            seen.add(entry["addr"])
        elif entry["action"] == "free_completed":
            if entry["addr"] in live:
                live.remove(entry["addr"])
            elif entry["addr"] not in seen:
                count += 1
    active = [b for s in snapshot["segments"] for b in s["blocks"] if b["state"] != "inactive"]
    return count + sum(1 for b in active if b["address"] not in live)


@pytest.mark.parametrize(
    "path", snapshots(xfail={MULTI_DEVICE: "checks one device without expandable segments; not pinned for 3 GPUs"})
)
def test_events_follow_the_trace_exactly(path: Path) -> None:
    snapshot = raw(path)
    trace = snapshot["device_traces"][0]
    actions = collections.Counter(e["action"] for e in trace)
    log = load(path)
    kinds, peak_bytes = EXPECTED[path.name]
    assert dict(collections.Counter(e.kind for e in log)) == kinds
    initial = _initially_alive(snapshot)
    assert kinds["alloc"] == actions["alloc"] + initial == actions["alloc"] + log.meta["source"]["initially_allocated"]
    assert kinds["free"] == actions["free_completed"] == actions["free_requested"]
    trace_segments = {e["addr"] for e in trace if e["action"] == "segment_alloc"}
    initial_segments = [s for s in snapshot["segments"] if s["address"] not in trace_segments]
    assert kinds["segment_alloc"] == actions["segment_alloc"] + len(initial_segments) == len(snapshot["segments"])
    assert kinds.get("mark", 0) == len(snapshot.get("external_annotations", []))
    assert log.device_names == ["GPU:0"] and log.devices[0].options == {"allocator": "pytorch-caching"}
    # the trace's allocations and frees, in order, with their addresses and requested bytes
    allocs = log.filter(kind="alloc")
    assert list(zip(allocs["address"][initial:].tolist(), allocs["requested"][initial:].tolist(), strict=True)) == [
        (e["addr"], e["size"]) for e in trace if e["action"] == "alloc"
    ]
    assert log.filter(kind="free")["address"].tolist() == [e["addr"] for e in trace if e["action"] == "free_completed"]
    if "time_us" in trace[0]:
        assert allocs["time_ns"][initial:].tolist() == [e["time_us"] * 1000 for e in trace if e["action"] == "alloc"]
        assert log.meta["columns"]["time_ns"] == "exact"
    else:
        assert log.meta["columns"]["time_ns"] == "inferred"
        assert allocs["time_ns"][initial:].tolist() == [
            (i + 1) * 1000 for i, e in enumerate(trace) if e["action"] == "alloc"
        ]
    times = log["time_ns"]
    assert (times[1:] >= times[:-1]).all()
    # bytes: the peak (chunk sizes), and the end equals the snapshot's own totals
    assert peak(log, "GPU:0").bytes == peak_bytes
    state = replay(log).state_at(-1, device="GPU:0")
    assert state.bytes_in_use == sum(s["allocated_size"] for s in snapshot["segments"])
    assert state.pool_bytes == sum(s["total_size"] for s in snapshot["segments"])
    assert len(state.segments) == len(snapshot["segments"])


def test_meta_says_where_the_log_came_from() -> None:
    path = trace_path("pt_snapshot_cs336_ctx128_fullstep_2025.pickle")
    log = load(path)
    source = log.meta["source"]
    assert source["format"] == "pytorch-snapshot" and source["file"] == str(path)
    assert source["tool"] == "torch.cuda.memory._dump_snapshot" and source["entries"] == 19342
    assert source["allocator_settings"] == raw(path)["allocator_settings"]
    assert source["initially_allocated"] == 324 and source["initial_segments"] == 227
    assert log.meta["columns"]["size"] == "inferred" and log.meta["columns"]["requested"] == "exact"
    assert log.meta["columns"]["stack"] == "exact" and log.meta["columns"]["tag"] == "absent"
    assert any("324 allocations alive before the trace began" in note for note in log.meta["notes"])
    assert detect(path) == "pytorch-snapshot"


def test_annotations_become_begin_and_end_marks_at_their_times() -> None:
    path = trace_path("pt_snapshot_cs336_ctx128_fullstep_2025.pickle")
    log = load(path)
    marks = log.filter(kind="mark")
    annotations = raw(path)["external_annotations"]
    assert [(e.tag, e.flags, e.time_ns) for e in marks] == [
        (a["name"], int(MarkPhase.BEGIN if a["stage"] == "START" else MarkPhase.END), a["time_us"] * 1000)
        for a in annotations
    ]
    # the first annotation precedes the trace: the state alive at the start is dated no later
    assert log[0].time_ns == annotations[0]["time_us"] * 1000


def test_stacks_are_the_python_frames_innermost_first() -> None:
    path = trace_path("pt_snapshot_cs336_ctx128_fullstep_2025.pickle")
    trace = raw(path)["device_traces"][0]
    log = load(path)
    allocs = log.filter(kind="alloc")
    initial = log.meta["source"]["initially_allocated"]
    entry = next(e for e in trace if e["action"] == "alloc")
    want = tuple((f["filename"], f["line"], f["name"]) for f in entry["frames"] if f["filename"].endswith(".py"))
    assert want and log.stacks[int(allocs["stack"][initial])] == want
    from gpuviz.analysis.tables import call_site_table

    table = call_site_table(log)
    assert table["bytes_allocated"].sum() > 0 and not table["call_site"].str.startswith("??").any()


def test_json_form_gives_the_same_log(tmp_path: Path) -> None:
    path = trace_path("pt_snapshot_assignment2_2026a.pickle")
    as_json = tmp_path / "snapshot.json"
    as_json.write_text(json.dumps(raw(path)))
    a, b = load(path), load(as_json)
    assert detect(as_json) == "pytorch-snapshot" and b.meta["source"]["version"] == "json"
    for name in ("time_ns", "kind", "flags", "address", "size", "requested", "segment", "largest_free", "stack"):
        assert a[name].tolist() == b[name].tolist(), name
    assert a.stacks == b.stacks and a.strings == b.strings


@needs_traces
def test_sniffers_accept_only_their_own_real_files() -> None:
    assert TRACES is not None
    modules = [__import__(name, fromlist=["sniff"]) for name in IMPORTERS]
    for path in sorted(TRACES.iterdir()):
        if path.name == "SOURCES.md":
            continue
        head = Source(path).head
        accepted = [m.NAME for m in modules if m.sniff(head)]
        if path.name.startswith("pt_snapshot_"):
            assert accepted == ["pytorch-snapshot"], path.name
        else:
            assert "pytorch-snapshot" not in accepted, path.name


# ---------------------------------------------------------------- hand-made snapshots (edge cases)
def _segment(address: int, size: int, blocks: list[tuple[int, int, int, str]], device: int = 0) -> dict[str, Any]:
    return {
        "device": device, "address": address, "total_size": size, "stream": 0,
        "segment_type": "small" if size == 2 * MiB else "large", "segment_pool_id": (0, 0), "is_expandable": False,
        "frames": [], "allocated_size": sum(b[1] for b in blocks if b[3] != "inactive"),
        "blocks": [{"address": a, "size": s, "requested_size": r, "state": st, "frames": []} for a, s, r, st in blocks],
    }  # fmt: skip


def _entry(action: str, addr: int, size: int, time_us: int | None = None, **more: Any) -> dict[str, Any]:
    entry = {"action": action, "addr": addr, "size": size, "stream": 0, "frames": [], **more}
    if time_us is not None:
        entry["time_us"] = time_us
    return entry


def _write(tmp_path: Path, snapshot: dict[str, Any], name: str = "snap.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    return path


def test_block_sizes_follow_pytorchs_rounding_and_split_rules(tmp_path: Path) -> None:
    large, small = BASE, BASE + 64 * MiB
    trace = [
        _entry("segment_alloc", large, 20 * MiB, 1),
        _entry("alloc", large, 3 * MiB + 100, 2),  # 512 B rounding; remainder 17 MiB > 1 MiB: split
        _entry("alloc", large + 3 * MiB + 512, 16 * MiB + 300, 3),  # remainder < 1 MiB: the whole free block
        _entry("segment_alloc", small, 2 * MiB, 4),
        _entry("alloc", small, 4, 5),  # small pool: 512 B, split
        _entry("alloc", small + 512, MiB, 6),  # 1 MiB is still the small pool
        _entry("alloc", small + 512 + MiB, MiB - 1024, 7),  # remainder exactly 512 B: split (>= 512)
    ]
    blocks_large = [(large, 3 * MiB + 512, 3 * MiB + 100, "active_allocated"),
                    (large + 3 * MiB + 512, 17 * MiB - 512, 16 * MiB + 300, "active_allocated")]  # fmt: skip
    blocks_small = [(small, 512, 4, "active_allocated"), (small + 512, MiB, MiB, "active_allocated"),
                    (small + 512 + MiB, MiB - 1024, MiB - 1024, "active_allocated"),
                    (small + 2 * MiB - 512, 512, 0, "inactive")]  # fmt: skip
    snapshot = {"segments": [_segment(large, 20 * MiB, blocks_large), _segment(small, 2 * MiB, blocks_small)],
                "device_traces": [trace]}  # fmt: skip
    log = load(_write(tmp_path, snapshot))
    assert [(e.address - BASE, e.size) for e in log.filter(kind="alloc")] == [
        (0, 3 * MiB + 512), (3 * MiB + 512, 17 * MiB - 512), (64 * MiB, 512), (64 * MiB + 512, MiB),
        (65 * MiB + 512, MiB - 1024)]  # fmt: skip
    assert replay(log).state_at(-1) == final_state(snapshot)


def test_roundup_power2_divisions_and_max_split_size_from_allocator_settings() -> None:
    divisions = {str(1 << i): 0 for i in range(16)} | {"1": 4}
    rules = CachingRules.from_settings({"roundup_power2_divisions": divisions, "max_split_size": 40 * MiB})
    assert rules.round_size(1200 * 1024) == 1280 * 1024  # four steps between 1 MiB and 2 MiB
    assert rules.round_size(3 * MiB + 1) == 3 * MiB + 512  # the 2-4 MiB interval has no divisions
    assert rules.round_size(100) == 512 and rules.round_size(1 * MiB) == 1 * MiB
    assert rules.block_size(100 * MiB, 50 * MiB) == 100 * MiB  # oversize request: never split
    assert rules.block_size(100 * MiB, 30 * MiB) == 30 * MiB
    assert CachingRules.from_settings(None) == CachingRules()
    assert CachingRules.from_settings({"roundup_power2_divisions": [2] * 16}).round_size(3 * MiB + 1) == 4 * MiB
    expandable = CachingRules.from_settings({"expandable_segments": True})
    assert (
        expandable.block_size(4 * MiB, 2 * MiB) == 2 * MiB and expandable.block_size(2 * MiB + 512, 2 * MiB) == 2 * MiB
    )


def test_allocations_alive_before_the_trace_are_seeded_from_segments(tmp_path: Path) -> None:
    """A free without an alloc and an active block without an alloc were alive at the start; the
    segment allocated in the trace is not part of the start."""
    seg, new = BASE, BASE + 64 * MiB
    trace = [
        _entry("free_requested", seg, 3 * MiB, 10),
        _entry("free_completed", seg, 3 * MiB, 10),
        _entry("segment_alloc", new, 20 * MiB, 11),
        _entry("alloc", new, 5 * MiB, 12),
    ]
    snapshot = {
        "segments": [
            _segment(seg, 20 * MiB, [(seg, 3 * MiB, 0, "inactive"),
                                     (seg + 3 * MiB, 4 * MiB, 4 * MiB, "active_allocated"),
                                     (seg + 7 * MiB, 13 * MiB, 0, "inactive")]),
            _segment(new, 20 * MiB, [(new, 5 * MiB, 5 * MiB, "active_allocated"),
                                     (new + 5 * MiB, 15 * MiB, 0, "inactive")]),
        ],
        "device_traces": [trace],
    }  # fmt: skip
    log = load(_write(tmp_path, snapshot))
    assert [(e.kind, e.address - BASE, e.size, e.time_ns) for e in log if e.kind in ("alloc", "segment_alloc")] == [
        ("segment_alloc", 0, 20 * MiB, 10_000), ("alloc", 0, 3 * MiB, 10_000), ("alloc", 3 * MiB, 4 * MiB, 10_000),
        ("segment_alloc", 64 * MiB, 20 * MiB, 11_000), ("alloc", 64 * MiB, 5 * MiB, 12_000),
    ]  # fmt: skip
    assert log.meta["source"]["initially_allocated"] == 2 and log.meta["source"]["initial_segments"] == 1
    assert replay(log).state_at(-1) == final_state(snapshot)


def test_every_other_action_and_several_devices_in_time_order(tmp_path: Path) -> None:
    g0, g1 = BASE, BASE + (1 << 30)
    trace0 = [
        _entry("segment_alloc", g0, 2 * MiB, 1),
        _entry("alloc", g0, 1000, 3),
        _entry("free_requested", g0, 1000, 5),  # waits on a stream: completes later
        _entry("snapshot", 0, 0, 6),
        _entry("free_completed", g0, 1000, 7),
        _entry("segment_free", g0, 2 * MiB, 8),
        _entry("oom", 0, 5 * MiB + 1, 9, device_free=1000),
        _entry("mystery", 0, 0, 10),
    ]
    trace1 = [_entry("segment_alloc", g1, 20 * MiB, 2), _entry("alloc", g1, 2 * MiB, 4),
              _entry("free_requested", g1, 2 * MiB, 11)]  # fmt: skip
    snapshot = {
        "segments": [_segment(g1, 20 * MiB, [(g1, 2 * MiB, 2 * MiB, "active_awaiting_free"),
                                             (g1 + 2 * MiB, 18 * MiB, 0, "inactive")], device=1)],
        "device_traces": [trace0, trace1],
        "external_annotations": [{"stage": "START", "name": "step", "device": 0, "time_us": 2},
                                 {"stage": "END", "name": "step", "device": 0, "time_us": 9}],
    }  # fmt: skip
    log = load(_write(tmp_path, snapshot))
    assert log.device_names == ["GPU:0", "GPU:1"]
    heap_events = [(e.time_ns // 1000, e.kind, e.device, e.tag) for e in log if e.kind not in ("split", "merge")]
    assert heap_events == [
        (1, "segment_alloc", "GPU:0", None), (2, "mark", "GPU:0", "step"), (2, "segment_alloc", "GPU:1", None),
        (3, "alloc", "GPU:0", None), (4, "alloc", "GPU:1", None), (5, "mark", "GPU:0", "free_requested"),
        (6, "mark", "GPU:0", "snapshot"), (7, "free", "GPU:0", None), (8, "segment_free", "GPU:0", None),
        (9, "oom", "GPU:0", None), (9, "mark", "GPU:0", "step"), (11, "mark", "GPU:1", "free_requested"),
    ]  # fmt: skip
    oom = log.filter(kind="oom")[0]
    assert (oom.requested, oom.size) == (5 * MiB + 1, 5 * MiB + 512)
    assert replay(log).state_at(-1, device="GPU:1") == final_state(snapshot, device=1)
    assert replay(log).state_at(-1, device="GPU:0").segments == ()
    assert any("{'mystery': 1}" in note for note in log.meta["notes"])
    assert any("2 free_requested entries" in note for note in log.meta["notes"])


def test_a_contradicting_entry_is_skipped_and_said(tmp_path: Path) -> None:
    trace = [_entry("segment_alloc", BASE, 2 * MiB, 1), _entry("alloc", BASE, 512, 2), _entry("alloc", BASE, 512, 3)]
    log = load(_write(tmp_path, {"segments": [], "device_traces": [trace]}))
    assert log.meta["source"]["conflicts"] == 1
    assert any("trace entry 2 (alloc)" in note and "no free block there" in note for note in log.meta["notes"])


# ---------------------------------------------------------------- hostile and broken input
class _Touch:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


class _Write:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (self.path, "pwned"))


@pytest.mark.parametrize("payload", [_Touch, _Write])
def test_a_pickle_naming_any_global_is_refused_and_nothing_of_it_runs(tmp_path: Path, payload: type) -> None:
    marker = tmp_path / "created"
    path = _write(tmp_path, {"segments": [payload(marker)], "device_traces": []})
    assert detect(path) == "pytorch-snapshot"  # it looks like a snapshot...
    with pytest.raises(LogFormatError, match=r"names the global (posix\.system|pathlib\.Path).*nothing of it was run"):
        load(path)
    assert not marker.exists()
    harmless = _write(tmp_path, {"segments": collections.OrderedDict(), "device_traces": []}, "ordered.pickle")
    with pytest.raises(LogFormatError, match=r"names the global collections\.OrderedDict"):
        load(harmless)


def test_truncated_and_malformed_snapshots_get_clear_errors(tmp_path: Path) -> None:
    whole = (trace_path("pt_snapshot_assignment2_2026b.pickle")).read_bytes()
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(LogFormatError, match=r"pickle is truncated or corrupt.*no readable prefix"):
        load(cut)
    cut_json = tmp_path / "cut.json"
    cut_json.write_text(json.dumps({"segments": [], "device_traces": [[_entry("alloc", 1, 2)]]})[:-10])
    with pytest.raises(LogFormatError, match="JSON is truncated or invalid"):
        load(cut_json)
    bad_segment = _write(tmp_path, {"segments": [{"device": 0}], "device_traces": []}, "bad.pickle")
    with pytest.raises(LogFormatError, match="segment lacks 'address' or 'total_size'"):
        load(bad_segment)
    not_list = _write(tmp_path, {"segments": 3, "device_traces": []}, "notlist.pickle")
    with pytest.raises(LogFormatError, match="'segments' is not a list"):
        load(not_list)
    not_snapshot = tmp_path / "other.pickle"
    not_snapshot.write_bytes(pickle.dumps([1, 2, 3], protocol=4))
    with pytest.raises(LogFormatError, match="a pickle of another structure"):
        load(not_snapshot)


def test_an_empty_snapshot_is_an_empty_log(tmp_path: Path) -> None:
    log = load(_write(tmp_path, {"segments": [], "device_traces": []}))
    assert len(log) == 0 and log.device_names == [] and log.meta["source"]["format"] == ts.NAME
