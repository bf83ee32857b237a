"""XProf memory-profile JSON import: the real GPU (xprof-converted) and TPU (xprof golden) files (GPUVIZ_TEST_TRACES),
checked snapshot by snapshot against the JSON read here with plain ``json``, plus hand-made files."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from traces import TRACES, needs_traces, trace_files, trace_path

import gpuviz
from gpuviz import LogFormatError
from gpuviz.importers import detect, load
from gpuviz.importers.xprof_memory import sniff

GPU_JSON = "tb_memory_profile_gpu_multiworker_converted_xprof2.24.2.json.gz"
TPU_JSON = "tb_memory_profile_tpu_xprof_golden.json.gz"
XPLANE = "tb_xplane_gpu_multiworker.xplane.pb"


def _profiles(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(gzip.decompress(path.read_bytes()))
    return document["memoryProfilePerAllocator"]  # type: ignore[no-any-return]


def _rows(log: gpuviz.EventLog, device: str) -> list[tuple[str, int, int, int, int]]:
    """(kind, time_ns, address, chunk size, bytes in use after) of each alloc/free of ``device``."""
    rows, in_use = [], 0
    for e in log:
        if e.device == device and e.kind in ("alloc", "free"):
            in_use += e.size if e.kind == "alloc" else -e.size
            rows.append((e.kind, e.time_ns, e.address, e.size, in_use))
    return rows


def _check_against_snapshots(log: gpuviz.EventLog, profiles: dict[str, Any], devices: dict[str, str]) -> None:
    """Every snapshot is one event, in order, at its time, address and size; heapAllocatedBytes =
    bytes in use + the device's untracked bytes after every snapshot."""
    for allocator, device in devices.items():
        snapshots = profiles[allocator]["sampledTimelineSnapshots"]
        ours = _rows(log, device)
        seeded = len(ours) - len(snapshots)
        untracked = log.devices[log.device_index(device)].options["untracked_bytes_in_use"]
        for snap, (kind, time_ns, address, size, in_use) in zip(snapshots, ours[seeded:], strict=True):
            meta = snap["activityMetadata"]
            assert kind == {"ALLOCATION": "alloc", "DEALLOCATION": "free"}[meta["memoryActivity"]]
            assert time_ns == int(snap["timeOffsetPs"]) // 1000 and address == int(meta["address"])
            assert size == int(meta["allocationBytes"]) or (kind == "free" and meta["allocationBytes"] == "0")
            assert in_use + untracked == int(snap["aggregationStats"]["heapAllocatedBytes"])


def test_gpu_profile_matches_every_snapshot_and_the_xplane_it_came_from() -> None:
    log = gpuviz.load(trace_path(GPU_JSON))
    assert detect(trace_path(GPU_JSON)) == "xprof-memory-profile"
    devices = {"GPU_1_bfc": "GPU:1", "GPU_4_bfc": "GPU:4", "GPU_6_bfc": "GPU:6", "gpu_host_bfc": "CPU:0"}
    assert [(d.name, d.options["allocator"]) for d in log.devices] == [(v, k) for k, v in devices.items()]
    profiles = _profiles(trace_path(GPU_JSON))
    _check_against_snapshots(log, profiles, devices)
    counts = Counter((e.kind, e.device) for e in log if e.kind in ("alloc", "free"))
    assert counts == {
        ("alloc", "GPU:1"): 19, ("alloc", "GPU:4"): 761, ("alloc", "GPU:6"): 761, ("alloc", "CPU:0"): 329,
        ("free", "GPU:4"): 208, ("free", "GPU:6"): 208, ("free", "CPU:0"): 218,
    }  # fmt: skip
    gpu4 = log.devices[log.device_index("GPU:4")].options
    assert gpu4["untracked_bytes_in_use"] == 4013337088
    assert gpu4["special_allocations"] == [
        {"op": "unused preallocated device memory", "bytes": 4013337088, "region_type": "persist/dynamic"}
    ]
    assert gpu4["memory_capacity"] == 15477102400
    assert gpu4["profile_summary"]["peak_bytes_in_use"] == 6208853760
    peak = max(row[-1] for row in _rows(log, "GPU:4"))
    assert peak + gpu4["untracked_bytes_in_use"] == 6208853760
    assert log.meta["source"]["sampled"] == dict.fromkeys(devices, False)
    # the same run from its XPlane: the same allocations, sizes and untracked bytes
    xplane = gpuviz.load(trace_path(XPLANE))
    for device in devices.values():
        assert [r[2:] for r in _rows(xplane, device)] == [r[2:] for r in _rows(log, device)]
        options = xplane.devices[xplane.device_index(device)].options
        assert (
            options["untracked_bytes_in_use"] == log.devices[log.device_index(device)].options["untracked_bytes_in_use"]
        )


def test_tpu_golden_profile_infers_the_size_of_frees_that_name_none() -> None:
    log = load(trace_path(TPU_JSON))
    devices = {str(i): f"TPU:{i}" for i in range(4)}
    assert [d.name for d in log.devices] == list(devices.values())
    _check_against_snapshots(log, _profiles(trace_path(TPU_JSON)), devices)
    counts = Counter((e.kind, e.device) for e in log if e.kind in ("alloc", "free"))
    assert counts["alloc", "TPU:0"] == 225 + 13 and counts["free", "TPU:0"] == 196
    assert [d.options["untracked_bytes_in_use"] for d in log.devices] == [3346739200] + [3346196480] * 3
    tags = Counter(e.tag for e in log if e.kind == "alloc" and e.device == "TPU:0")
    # dtypes from XLA shapes such as s32[1,2048]{1,0:T(1,128)}
    assert (tags["dummy:int32[1,2048]"], tags["dummy:float32[]"], tags["dummy:uint32[4]"], tags[None]) == (
        30,
        85,
        5,
        108,
    )
    assert any("46 allocations made before the trace began" in note for note in log.meta["notes"])


def _snapshot(time_ps: int, activity: str, address: int, size: int, heap: int) -> dict[str, Any]:
    return {
        "timeOffsetPs": str(time_ps),
        "aggregationStats": {"heapAllocatedBytes": str(heap), "peakBytesInUse": str(heap)},
        "activityMetadata": {"memoryActivity": activity, "address": str(address), "allocationBytes": str(size),
                             "requestedBytes": str(size), "tfOpName": "Op", "dataType": "half",
                             "tensorShape": "[2,64]", "stepId": "4"},
    }  # fmt: skip


def _write(path: Path, snapshots: list[dict[str, Any]]) -> Path:
    document = {"memoryProfilePerAllocator": {"GPU_0_bfc": {"sampledTimelineSnapshots": snapshots,
                "profileSummary": {"memoryCapacity": "1024"}}}, "memoryIds": ["GPU_0_bfc"], "version": 1}  # fmt: skip
    path.write_text(json.dumps(document))
    return path


BASE = 1 << 40


def test_picoseconds_int64_strings_and_other_activities(tmp_path: Path) -> None:
    snapshots = [
        _snapshot(1_500, "ALLOCATION", BASE, 256, 256),
        _snapshot(2_999, "RESERVATION", 0, 0, 256),
        _snapshot(4_000, "DEALLOCATION", BASE, 256, 0),
    ]
    log = load(_write(tmp_path / "p.json", snapshots))
    rows = [(e.kind, e.time_ns, e.tag) for e in log if e.kind in ("alloc", "free")]
    assert rows == [("alloc", 1, "Op:float16[2,64]"), ("free", 4, "Op:float16[2,64]")]
    assert any("other activities were skipped: {'RESERVATION': 1}" in n for n in log.meta["notes"])
    assert log.meta["source"]["sampled"] == {"GPU_0_bfc": False}
    assert [(e.flags, e.tag) for e in log if e.kind == "mark"] == [(1, "step 4"), (2, "step 4")]


def test_a_full_timeline_is_flagged_as_sampled(tmp_path: Path) -> None:
    snapshots = []
    for i in range(500):
        snapshots += [
            _snapshot(2000 * i, "ALLOCATION", BASE, 256, 256),
            _snapshot(2000 * i + 1000, "DEALLOCATION", BASE, 256, 0),
        ]
    log = load(_write(tmp_path / "p.json", snapshots))
    assert log.meta["source"]["sampled"] == {"GPU_0_bfc": True}
    assert len([e for e in log if e.kind == "alloc"]) == 500


def test_truncated_json_and_gzip_raise_clear_errors(tmp_path: Path) -> None:
    gpu_json = trace_path(GPU_JSON)
    raw = gzip.decompress(gpu_json.read_bytes())
    cut = tmp_path / "cut.memory_profile.json"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(LogFormatError, match="could not be read as an XProf/TensorBoard memory profile"):
        load(cut)
    cut_gz = tmp_path / "cut.memory_profile.json.gz"
    cut_gz.write_bytes(gpu_json.read_bytes()[:60_000])
    with pytest.raises(LogFormatError, match="truncated or corrupt"):
        load(cut_gz)


@needs_traces
def test_sniffer_accepts_only_memory_profiles() -> None:
    assert TRACES is not None
    for path in TRACES.iterdir():
        if path.name == "SOURCES.md":
            continue
        raw = path.read_bytes()
        head = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)[: 1 << 16]
        assert sniff(head) == (path.name in (GPU_JSON, TPU_JSON)), path.name


def _reference(path: Path) -> gpuviz.EventLog:
    """The log of the whole document parsed with ``json.loads`` (what the reader did before it
    streamed): records of every allocator in memoryIds order, then stably sorted by time."""
    from gpuviz.importers.tf_memory import add_devices, allocator_device, write_events
    from gpuviz.importers.xprof_memory import _record

    document = json.loads(gzip.decompress(path.read_bytes()))
    per_allocator = document["memoryProfilePerAllocator"]
    order = [a for a in document["memoryIds"] if a in per_allocator]
    order += [a for a in per_allocator if a not in order]
    skipped: Counter[str] = Counter()
    records = [_record(a, s, skipped) for a in order for s in per_allocator[a].get("sampledTimelineSnapshots", [])]
    kept = sorted((r for r in records if r is not None), key=lambda r: r.time_ns)
    log = gpuviz.EventLog()
    hosts: dict[str, str] = {}
    devices = add_devices(log, order, {allocator_device(a, hosts): {"allocator": a} for a in order})
    write_events(log, kept, devices)
    return log


@pytest.mark.parametrize("path", trace_files([GPU_JSON, TPU_JSON]))
def test_the_streamed_profile_gives_the_log_of_the_whole_document(path: Path, tmp_path: Path, monkeypatch: Any) -> None:
    from gpuviz.importers import xprof_memory

    expected = _reference(path)
    plain = tmp_path / path.name.removesuffix(".gz")
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    logs = [load(path), load(plain)]
    monkeypatch.setattr(xprof_memory, "_CHUNK", 7)  # every value cut by chunk boundaries somewhere
    logs.append(load(path))
    for log in logs:
        assert list(log.strings) == list(expected.strings) and len(log) == len(expected) > 1600
        for name, column in expected.columns.items():
            assert (log.columns[name] == column).all(), name
    for log in logs:
        log.meta["source"].pop("file")
    assert logs[0].meta == logs[1].meta == logs[2].meta


def test_a_profile_cut_anywhere_is_refused_naming_the_file(tmp_path: Path) -> None:
    tpu_json = trace_path(TPU_JSON)
    raw = gzip.decompress(tpu_json.read_bytes())
    for fraction in (0.001, 0.25, 0.5, 0.999):
        cut = tmp_path / f"cut{fraction}.memory_profile.json"
        cut.write_bytes(raw[: int(len(raw) * fraction)])
        with pytest.raises(LogFormatError, match=f"{cut.name} could not be read as .*character \\d+ of the document"):
            load(cut)
        cut_gz = tmp_path / f"cut{fraction}.memory_profile.json.gz"
        cut_gz.write_bytes(tpu_json.read_bytes()[: int(tpu_json.stat().st_size * fraction)])
        message = "not a gpuviz event log nor a trace" if fraction < 0.01 else "the gzip stream is truncated or corrupt"
        with pytest.raises(LogFormatError, match=f"{cut_gz.name}.*{message}"):  # too short to tell what it is
            load(cut_gz)
