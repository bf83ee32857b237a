"""Every format gpuviz opens, on files the repository holds, made by real frameworks on the CPU
(tests/fixtures/<format>/generate.py rewrites each): what gpuviz reads equals what the framework
wrote, value for value. The TensorFlow BFC XPlanes (tests/fixtures/tf_bfc) have tests of their own
(test_tf_bfc_parity.py, test_import_xplane.py)."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_import_xprof_memory import _check_against_snapshots, _rows

import gpuviz
from gpuviz import EventLog, replay
from gpuviz.analysis.timeline import peak
from gpuviz.importers import detect
from gpuviz.importers.torch_memory_timeline import CATEGORIES
from gpuviz.log.schema import Kind

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PROFILER = FIXTURES / "torch_profiler" / "mlp_cpu.pt.trace.json.gz"
TIMELINE = FIXTURES / "torch_memory_timeline" / "mlp_cpu.raw.json.gz"
JAX_XPLANE = FIXTURES / "jax_xplane" / "jit_cpu.xplane.pb.gz"
PLACEMENT = FIXTURES / "tf_placement" / "eager_and_function_cpu.log"
XPROF = FIXTURES / "xprof_memory"
EXPORT_LOG = FIXTURES / "torch_snapshot_export" / "simulated.arrow"
EXPORT_SNAPSHOT = FIXTURES / "torch_snapshot_export" / "simulated.pickle"


def _manifest(path: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((path.parent / "manifest.json").read_text())
    return manifest


def _signed_requested(log: EventLog, device: str) -> list[int]:
    sub = log.filter(kind=["alloc", "free"], device=device)
    return np.where(sub["kind"] == int(Kind.FREE), -sub["requested"], sub["requested"]).tolist()


def test_every_fixture_folder_has_its_generator() -> None:
    folders = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
    assert folders == ["jax_memory_profile", "jax_xplane", "tf_bfc", "tf_placement", "torch_memory_timeline",
                       "torch_profiler", "torch_profiler_ops", "torch_snapshot_export", "xprof_memory"]  # fmt: skip
    for folder in folders:
        script = (FIXTURES / folder / "generate.py").read_text()
        assert f"python tests/fixtures/{folder}/generate.py" in script, folder  # how to rerun it
    for path in FIXTURES.rglob("*"):
        assert path.stat().st_size <= 200_000, path  # small: the repository holds them


# ------------------------------------------------------------------ PyTorch's CPU profiler
def test_pytorch_cpu_profiler_trace_bytes_in_use_are_the_traces_total_allocated() -> None:
    events = json.loads(gzip.decompress(PROFILER.read_bytes()))["traceEvents"]
    memory = [e for e in events if e.get("name") == "[memory]"]
    memory.sort(key=lambda e: (e["ts"], e["args"].get("Ev Idx", -1)))
    args = [e["args"] for e in memory]
    manifest = _manifest(PROFILER)
    assert len(args) == manifest["memory_events"] == 87
    assert detect(PROFILER) == "pytorch-profiler"
    log = gpuviz.load(PROFILER)
    assert log.device_names == ["CPU:0"] and log.meta["source"]["format"] == "pytorch-profiler"
    in_use = np.cumsum(_signed_requested(log, "CPU:0")).tolist()
    seeded = len(in_use) - len(args)  # allocations alive before the trace, seeded first
    assert seeded == int(args[0]["Total Allocated"] != args[0]["Bytes"])
    assert in_use[seeded:] == [a["Total Allocated"] for a in args]  # after every event
    counts = Counter(e.kind for e in log)
    assert counts["alloc"] == sum(a["Bytes"] > 0 for a in args) + seeded
    assert counts["free"] == sum(a["Bytes"] < 0 for a in args)
    assert peak(log, "CPU:0").bytes == max(a["Total Allocated"] for a in args) == manifest["max_total_allocated_bytes"]
    assert peak(log, "CPU:0").bytes == 54_832
    assert log.filter(kind="alloc")["address"].tolist()[seeded:] == [a["Addr"] for a in args if a["Bytes"] > 0]
    replay(log).state_at(-1).check()


# ------------------------------------------------------------------ PyTorch's memory timeline
def test_pytorch_cpu_memory_timeline_follows_the_file_row_by_row() -> None:
    rows = json.loads(gzip.decompress(TIMELINE.read_bytes()))
    assert len(rows) == _manifest(TIMELINE)["rows"] == 108
    assert detect(TIMELINE) == "pytorch-memory-timeline"
    log = gpuviz.load(TIMELINE)
    changes = [n for _, action, n, _ in rows if action != 3]  # 3: a version increment, not bytes
    assert _signed_requested(log, log.device_names[0]) == changes
    in_use = np.cumsum(changes)
    assert peak(log, log.device_names[0]).bytes == int(in_use.max()) == 101_464
    created = Counter(CATEGORIES[c] for _, action, _, c in rows if action in (1, 2))  # 1: before the profile
    assert Counter(e.tag for e in log.filter(kind="alloc")) == created
    assert sum(1 for r in rows if r[0] == -1) == sum(1 for r in rows if r[1] == 1)  # alive before: no time


# ------------------------------------------------------------------ JAX's CPU profiler
def test_jax_cpu_xspace_opens_as_a_log_without_memory_events_and_says_so() -> None:
    """JAX's XSpace on CPU has host planes only: no allocator events to show, said in the notes."""
    assert detect(JAX_XPLANE) == "xplane"
    log = gpuviz.load(JAX_XPLANE)
    assert len(log) == 0 and log.device_names == []
    assert log.meta["notes"] == ["the trace holds no MemoryAllocation/MemoryDeallocation events"]
    source = log.meta["source"]
    assert source["format"] == "xplane" and source["allocators"] == {}
    assert "/host:CPU" in source["planes"] and "/host:metadata" in source["planes"]
    assert _manifest(JAX_XPLANE)["backend"] == "cpu"


# ------------------------------------------------------------------ XProf's memory profile
@pytest.mark.parametrize("workload", ["churn", "oom"])
def test_xprof_memory_profile_matches_every_snapshot_and_the_xplane_it_came_from(workload: str) -> None:
    """TensorFlow's own conversion (the Memory Profile tool's JSON) of a TF BFC XPlane: every
    snapshot one event with heapAllocatedBytes in use after it; the same allocations and frees
    as the XPlane itself; the profile's own peak."""
    path = XPROF / f"{workload}.memory_profile.json.gz"
    assert detect(path) == "xprof-memory-profile"
    log = gpuviz.load(path)
    document = json.loads(gzip.decompress(path.read_bytes()))
    profiles = document["memoryProfilePerAllocator"]
    assert list(profiles) == ["bfc_cpu_allocator_for_gpu"] and log.device_names == ["CPU:0"]
    _check_against_snapshots(log, profiles, {"bfc_cpu_allocator_for_gpu": "CPU:0"})
    xplane = gpuviz.load(FIXTURES / "tf_bfc" / f"{workload}.xplane.pb.gz")
    assert [r[2:] for r in _rows(log, "CPU:0")] == [r[2:] for r in _rows(xplane, "CPU:0")]
    summary = profiles["bfc_cpu_allocator_for_gpu"]["profileSummary"]
    assert peak(log, "CPU:0").bytes == int(summary["peakStats"]["peakBytesInUse"])
    assert peak(log, "CPU:0").bytes == {"churn": 49_772_288, "oom": 48_234_752}[workload]
    assert log.meta["source"]["sampled"] == {"bfc_cpu_allocator_for_gpu": False}


# ------------------------------------------------------------------ TensorFlow's placement log
def _placements(text: str) -> Counter[tuple[str, str]]:
    """(op, device) of each placement, read with regexes of its own: every eager line, and each
    graph-placer line once per (node, op, device)."""
    found: Counter[tuple[str, str]] = Counter()
    seen = set()
    for line in text.splitlines():
        if eager := re.search(r"Executing op (\S+) in device \S*device:(\w+:\d+)", line):
            found[eager[1], eager[2]] += 1
        elif (placed := re.search(r"\] (\S+): \((\w+)\): \S*device:(\w+:\d+)$", line)) and placed.groups() not in seen:
            seen.add(placed.groups())
            found[placed[2], placed[3]] += 1
    return found


def test_tensorflow_cpu_placement_log_gives_one_event_per_placement() -> None:
    text = PLACEMENT.read_text()
    expected = _placements(text)
    assert detect(PLACEMENT) == "tf-placement"
    log = gpuviz.load(PLACEMENT)
    assert Counter((e.tag, e.device) for e in log) == expected
    assert sum(expected.values()) == len(log) == 26
    assert expected["_MklMatMul", "CPU:0"] == 2 and expected["Relu", "CPU:0"] == 2
    assert log.device_names == ["CPU:0"] and {e.kind for e in log} == {"placement"}
    assert log.meta["columns"]["time_ns"] == "exact"  # from the absl prefix of every line
    assert bool(np.all(np.diff(log["time_ns"]) >= 0))


# ------------------------------------------------------------------ gpuviz's own exporter
def _heap(log: EventLog) -> list[tuple[int, int, int, int, bool]]:
    state = replay(log).state_at(-1, device="GPU:0")
    return [(s.base, c.address, c.size, c.requested, c.in_use) for s in state.segments for c in s.chunks]


def test_the_exported_snapshot_imports_to_the_run_it_was_written_from() -> None:
    assert detect(EXPORT_LOG) == "gpuviz" and detect(EXPORT_SNAPSHOT) == "pytorch-snapshot"
    run, exported = gpuviz.load(EXPORT_LOG), gpuviz.load(EXPORT_SNAPSHOT)
    assert len(run) == 675
    # the same heap at the end: segments, chunks, their requests and states (a snapshot has no tags)
    assert _heap(exported) == _heap(run) and len(_heap(run)) > 10
    for kind in ("alloc", "free"):
        a, b = run.filter(kind=kind), exported.filter(kind=kind)
        for name in ("address", "size", "requested"):
            assert a[name].tolist() == b[name].tolist(), (kind, name)
        assert (a["time_ns"] // 1000 * 1000).tolist() == b["time_ns"].tolist()  # a snapshot's time_us
    assert peak(exported, "GPU:0").bytes == peak(run, "GPU:0").bytes
    (mark,) = run.filter(kind="mark")  # an instant: PyTorch's START and END annotations at its time
    marks = [(e.tag, e.time_ns) for e in exported.filter(kind="mark")]
    assert marks == [("half way", mark.time_ns // 1000 * 1000)] * 2


def test_pytorchs_own_memory_viz_reads_the_exported_fixture() -> None:
    viz = pytest.importorskip("torch.cuda._memory_viz")
    import pickle

    with open(EXPORT_SNAPSHOT, "rb") as file:
        snapshot = pickle.load(file)
    state = replay(gpuviz.load(EXPORT_LOG)).state_at(-1, device="GPU:0")
    assert f"segments: {len(state.segments)}\n" in viz.segsum(snapshot)
    trace = snapshot["device_traces"][0]
    assert viz.trace(snapshot).startswith(f"Device 0 ----------------\n{len(trace)} entries\n")


# ------------------------------------------------------------------ every fixture through the CLI
@pytest.mark.parametrize(
    ("path", "format_name", "events"),
    [
        (PROFILER, "pytorch-profiler", 146),
        (TIMELINE, "pytorch-memory-timeline", 184),
        (JAX_XPLANE, "xplane", 0),
        (XPROF / "oom.memory_profile.json.gz", "xprof-memory-profile", 29),
        (PLACEMENT, "tf-placement", 26),
        (EXPORT_SNAPSHOT, "pytorch-snapshot", 676),  # the run's 675, the mark's START and END
        (FIXTURES / "tf_bfc" / "oom.xplane.pb.gz", "xplane", 27),
    ],
    ids=lambda value: value.name if isinstance(value, Path) else None,
)
def test_gpuviz_import_writes_the_log_load_reads(
    path: Path, format_name: str, events: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuviz.frontends.cli import main

    direct = gpuviz.load(path)
    output = tmp_path / "imported.arrow"
    assert main(["import", str(path), "-o", str(output)]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"imported {path.name}: {format_name}, written by ") and f"; {len(direct)} events\n" in said
    assert said.endswith(f"event log written to {output}\n")
    assert len(direct) == events
    saved = gpuviz.load(output)
    assert saved.meta["source"] == direct.meta["source"] and saved.device_names == direct.device_names
    for name in ("time_ns", "kind", "address", "size", "requested", "tag"):
        assert saved[name].tolist() == direct[name].tolist(), name
