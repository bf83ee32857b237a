"""Any gpuviz log written as a PyTorch memory snapshot: round trips keep the trace and the final segments."""

from __future__ import annotations

import contextlib
import json
import pickle
import random
from pathlib import Path
from typing import Any

import pytest
from torch_snapshots import final_state, raw, snapshots
from traces import trace_path

import gpuviz
from gpuviz import EventLog, SimUpstream, replay
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.exporters.torch_snapshot import device_indices, to_torch_snapshot, write_torch_snapshot
from gpuviz.frontends.cli import main
from gpuviz.importers import load

MiB = 1 << 20


def _trace(snapshot: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(e["action"], e["addr"], e["size"], e.get("time_us")) for e in snapshot["device_traces"][0]]


def _segments(snapshot: dict[str, Any]) -> list[tuple[Any, ...]]:
    return sorted(
        (s["device"], s["address"], s["total_size"], s["allocated_size"], s["segment_type"],
         tuple((b["address"], b["size"], b["state"]) for b in s["blocks"]))
        for s in snapshot["segments"]
    )  # fmt: skip


def _python_frames(frames: list[dict[str, Any]]) -> list[tuple[str, int, str]]:
    return [(f["filename"], f["line"], f["name"]) for f in frames if f["filename"].endswith(".py")]


@pytest.mark.parametrize("path", snapshots(xfail={}))
def test_pytorch_snapshot_round_trip_keeps_the_trace_and_the_final_segments(path: Path, tmp_path: Path) -> None:
    original = raw(path)
    log = load(path)
    exported = to_torch_snapshot(log)
    assert _trace(exported) == _trace(original)  # actions, addresses, sizes, times, order
    assert [_python_frames(e["frames"]) for e in exported["device_traces"][0]] == [
        _python_frames(e["frames"]) for e in original["device_traces"][0]
    ]
    assert _segments(exported) == _segments(original)
    assert exported["external_annotations"] == original.get("external_annotations", [])
    assert exported.get("allocator_settings") == original.get("allocator_settings")
    # and back: the exported file imports to the same heap and the same events
    written = write_torch_snapshot(log, tmp_path / "again.pickle")
    again = load(written)
    assert replay(again).state_at(-1, device="GPU:0") == final_state(original)
    for name in ("time_ns", "kind", "address", "size", "requested", "largest_free"):
        assert again[name].tolist() == log[name].tolist(), name
    assert again.meta["columns"]["size"] == "exact"


def _simulated_run(seed: int) -> ReferenceBFCAllocator:
    rng = random.Random(seed)
    alloc = ReferenceBFCAllocator(SimUpstream("96MiB"), growth=True)
    live: list[int] = []
    for step in range(600):
        if live and rng.random() < 0.45:
            alloc.free(live.pop(rng.randrange(len(live))))
        else:
            with contextlib.suppress(gpuviz.OutOfMemoryError):
                live.append(alloc.allocate(int(2 ** rng.uniform(2, 25)), tag=f"op{step % 7}:float32[{step}]"))
        if step == 300:
            alloc.log.mark("half way")
            for address in live[: len(live) // 2]:
                alloc.free(address)
            del live[: len(live) // 2]
            alloc.release_free_segments()
    return alloc


def _chunks(state: gpuviz.HeapState) -> list[tuple[int, int, int, bool]]:
    return [(c.address, c.size, c.requested, c.in_use) for c in state.chunks()]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_simulated_run_exported_then_imported_ends_in_the_same_state(seed: int, tmp_path: Path) -> None:
    alloc = _simulated_run(seed)
    log = alloc.log
    path = write_torch_snapshot(log, tmp_path / "sim.pickle")
    back = load(path)
    assert back.meta["source"]["conflicts"] == 0
    assert _chunks(replay(back).state_at(-1)) == _chunks(alloc.state())
    assert [s.base for s in replay(back).state_at(-1).segments] == [s.base for s in alloc.state().segments]
    # every allocation and free in order, with the chunk and requested bytes
    for kind in ("alloc", "free", "segment_alloc", "segment_free"):
        ours, theirs = log.filter(kind=kind), back.filter(kind=kind)
        assert ours["address"].tolist() == theirs["address"].tolist(), kind
        assert ours["size"].tolist() == theirs["size"].tolist(), kind
    assert back.filter(kind="alloc")["requested"].tolist() == log.filter(kind="alloc")["requested"].tolist()
    ours_oom = log.filter(kind="oom")
    assert len(ours_oom) >= 1
    assert back.filter(kind="oom")["requested"].tolist() == ours_oom["requested"].tolist()
    assert [(e.tag, e.flags) for e in back.filter(kind="mark")] == [("half way", 1), ("half way", 2)]


def test_the_demo_run_with_a_host_device_exports_every_device(tmp_path: Path) -> None:
    from gpuviz.demo import run_demo

    gpuviz.reset(configuration=True)
    try:
        log = EventLog()
        run_demo(log)
    finally:
        gpuviz.reset(configuration=True)
    snapshot = to_torch_snapshot(log)
    indices = device_indices(log)
    assert indices == {"GPU:0": 0, "GPU:3": 3, "CPU:0": 4}  # GPU:n keeps n; the host comes after the GPUs
    path = tmp_path / "demo.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    back = load(path)
    for name in replay(log).devices:
        want = _chunks(replay(log).state_at(-1, device=name))
        got_name = f"GPU:{indices[name]}"
        got = _chunks(replay(back).state_at(-1, device=got_name)) if got_name in replay(back).devices else []
        assert got == want, name
    marks = [a for a in snapshot["external_annotations"] if a["name"] == "load weights"]
    assert [a["stage"] for a in marks] == ["START", "END"]


def test_export_command_writes_pickle_or_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = trace_path("pt_snapshot_assignment2_2026b.pickle")
    out = tmp_path / "out.pickle"
    assert main(["export", str(source), "--to", "torch-snapshot", "-o", str(out)]) == 0
    assert f"PyTorch memory snapshot written to {out}" in capsys.readouterr().out
    with open(out, "rb") as file:
        assert pickle.load(file) == to_torch_snapshot(load(source))
    as_json = tmp_path / "out.json"
    assert main(["export", str(out), "--to", "torch-snapshot", "-o", str(as_json)]) == 0
    assert _trace(json.loads(as_json.read_text())) == _trace(raw(source))
    assert main(["export", str(source), "--to", "torch-snapshot", "-o", str(tmp_path / "no" / "x.pickle")]) == 2
    assert capsys.readouterr().err.startswith("gpuviz: error: ")


def test_pytorchs_own_memory_viz_reads_the_exports() -> None:
    """torch.cuda._memory_viz (CPU build of torch is enough) summarises the export of a real
    snapshot exactly as it summarises the original, and reads a simulated run's export."""
    viz = pytest.importorskip("torch.cuda._memory_viz")
    path = trace_path("pt_snapshot_cs336_ctx128_fullstep_2025.pickle")
    original, exported = raw(path), to_torch_snapshot(load(path))
    assert viz.segsum(exported) == viz.segsum(original)
    assert viz.trace(exported) == viz.trace(original)
    simulated = to_torch_snapshot(_simulated_run(0).log)
    summary = viz.segsum(simulated)
    state = _simulated_run(0).state()
    assert f"segments: {len(state.segments)}\n" in summary
    assert viz.trace(simulated).startswith(f"Device 0 ----------------\n{len(simulated['device_traces'][0])} entries\n")
    for data in (exported, simulated):
        lines = viz.memory(data, format_flamegraph=lambda text: text)
        assert sum(int(line.rsplit(" ", 1)[1]) for line in lines.splitlines()) == sum(
            s["total_size"] for s in data["segments"]
        )
        assert viz.segments(data, format_flamegraph=lambda text: text)
        assert "<!DOCTYPE html>" in viz.trace_plot(data) and "<!DOCTYPE html>" in viz.segment_plot(data)
