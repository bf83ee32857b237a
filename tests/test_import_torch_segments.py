"""``torch.cuda.memory_snapshot()`` (a list of segments) and snapshots whose trace is empty open as
the allocator's heap at the moment they were taken, by the C reader and the Python one alike."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from torch_snapshots import final_state, first_divergence
from traces import REASON

import gpuviz
from gpuviz import replay
from gpuviz.importers import detect, snapshot_reader
from gpuviz.importers.source import Source
from gpuviz.importers.torch_snapshot import from_snapshot
from gpuviz.log.eventlog import EventLog, Frame

TRACES = os.environ.get("GPUVIZ_TEST_TRACES")
needs_traces = pytest.mark.skipif(not TRACES, reason=REASON)
MiB = 1 << 20
FRAMES = [{"filename": "train.py", "line": 12, "name": "step"}, {"filename": "??", "line": 0, "name": "c10::x"}]


def _segment(device: int, address: int, blocks: list[tuple[int, str, int]]) -> dict[str, Any]:
    """A segment as PyTorch writes it; ``blocks``: (size, state, requested_size) from ``address`` on."""
    out, at = [], address
    for size, state, requested in blocks:
        out.append({"address": at, "size": size, "requested_size": requested, "state": state,
                    "frames": FRAMES if state != "inactive" else []})  # fmt: skip
        at += size
    total = at - address
    return {
        "device": device, "address": address, "total_size": total, "allocated_size": 0, "active_size": 0,
        "requested_size": 0, "stream": 0, "segment_type": "large" if total > MiB else "small",
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": FRAMES, "blocks": out,
    }  # fmt: skip


SEGMENTS = [
    _segment(0, 1 << 40, [(512, "active_allocated", 500), (2 * MiB - 512, "inactive", 0)]),
    _segment(0, (1 << 40) + 64 * MiB, [(20 * MiB, "active_allocated", 20 * MiB - 3), (0 + 2 * MiB, "inactive", 0)]),
    _segment(1, 1 << 41, [(2 * MiB, "active_pending_free", 2 * MiB)]),
]


@pytest.fixture(params=["native", "python"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "native" and not snapshot_reader.native_reader_available():
        pytest.skip("the C snapshot reader is not built")
    monkeypatch.setenv("GPUVIZ_NATIVE", "1" if request.param == "native" else "0")
    return str(request.param)


def _check_heap(log: EventLog, segments: list[dict[str, Any]]) -> None:
    """The log's end state is exactly the segments and blocks, each device; every event at time 0."""
    r = replay(log)
    devices = sorted({s["device"] for s in segments})
    assert log.device_names == [f"GPU:{d}" for d in devices]
    for device in devices:
        got, want = r.state_at(-1, device=f"GPU:{device}"), final_state({"segments": segments}, device)
        assert got == want, first_divergence(got, want)
    assert set(log["time_ns"].tolist()) == {0}
    assert {e.kind for e in log} <= {"segment_alloc", "alloc", "split"}


def test_a_segments_list_pickle_opens_as_the_heap_at_that_moment(tmp_path: Path, reader: str) -> None:
    path = tmp_path / "memory_snapshot.pickle"
    path.write_bytes(pickle.dumps(SEGMENTS, protocol=4))
    assert detect(path) == "pytorch-snapshot"
    if reader == "native":  # the C reader accepts it itself (no fallback to the Python unpickler)
        streamed = snapshot_reader._read_streaming(Source(path), snapshot_reader.Stacks(EventLog()))
        assert streamed is not None and streamed[1] == []
    log = gpuviz.load(path)
    _check_heap(log, SEGMENTS)
    allocs = log.filter(kind="alloc")
    assert allocs["requested"].tolist() == [500, 20 * MiB - 3, 2 * MiB]
    assert [e.stack for e in allocs] == [log.intern_stack((Frame("train.py", 12, "step"),))] * 3
    source = log.meta["source"]
    assert (source["version"], source["tool"], source["entries"]) == (
        "segments list (torch.cuda.memory_snapshot())", "torch.cuda.memory_snapshot", 0,
    )  # fmt: skip
    assert any(
        note.startswith("the snapshot has no trace: the log is the allocator's heap") for note in log.meta["notes"]
    )


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_the_sniffer_knows_a_segments_list_at_every_protocol(tmp_path: Path, protocol: int) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(SEGMENTS, protocol=protocol))
    assert detect(path) == "pytorch-snapshot"
    path.write_bytes(pickle.dumps([{"address": 1, "size": 2}], protocol=protocol))  # not segments
    with pytest.raises(gpuviz.LogFormatError, match="a pickle of another structure"):
        gpuviz.load(path)


@pytest.mark.parametrize("traces", [None, [], [[]], [[], []]])
def test_a_snapshot_whose_trace_is_empty_is_the_heap_at_that_moment(
    tmp_path: Path, reader: str, traces: list[Any] | None
) -> None:
    snapshot: dict[str, Any] = {"segments": SEGMENTS}
    if traces is not None:
        snapshot["device_traces"] = traces
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    log = gpuviz.load(path)
    _check_heap(log, SEGMENTS)
    assert log.meta["source"]["tool"] == "torch.cuda.memory._dump_snapshot"


def test_from_snapshot_takes_the_list_too() -> None:
    _check_heap(from_snapshot(SEGMENTS), SEGMENTS)


@needs_traces
@pytest.mark.parametrize(
    "name",
    ["pt_snapshot_cs336_ctx128_fullstep_2025.pickle", "pt_snapshot_codelocation_3gpu_expandable_oom.pickle",
     "pt_snapshot_ftcourse_2024.pickle"],
)  # fmt: skip
def test_real_snapshots_segments_alone_give_their_final_heap(tmp_path: Path, reader: str, name: str) -> None:
    """What ``memory_snapshot()`` would have returned at the end of each real run: its own segments."""
    real = Path(TRACES or "") / name
    assert real.is_file(), f"{real} is missing"
    with open(real, "rb") as file:
        segments = pickle.load(file)["segments"]
    path = tmp_path / "segments.pickle"
    path.write_bytes(pickle.dumps(segments))
    log = gpuviz.load(path)
    _check_heap(log, segments)
    assert len(log.filter(kind="segment_alloc")) == len(segments)
    assert len(log.filter(kind="alloc")) == sum(b["state"] != "inactive" for s in segments for b in s["blocks"])
