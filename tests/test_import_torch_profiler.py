"""PyTorch profiler Chrome traces: real V100 traces (current and 2021 schema, GPUVIZ_TEST_TRACES) and
hand-made edge cases."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from traces import trace_path

import gpuviz
from gpuviz import EventLog, LogFormatError, replay
from gpuviz.importers import detect
from gpuviz.log.schema import Kind

HTA = "pt_profiler_cuda_v100_hta_df_index_resolver.json.gz"
OLD = "pt_profiler_cuda_v100_kineto_resnet50_2021_oldschema.json.gz"
SMALL = Path(__file__).parent / "fixtures" / "torch_profiler_small.json"


def _raw_memory_events(path: Path) -> list[dict[str, Any]]:
    """The [memory] events of a trace with plain json, in the order the trace means them."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as file:
        data = json.load(file)
    events = [(i, e) for i, e in enumerate(data["traceEvents"]) if e.get("name") == "[memory]"]
    events.sort(key=lambda p: (p[1]["ts"], p[1]["args"].get("Ev Idx", -1), p[0]))
    return [e for _, e in events]


def _device(args: dict[str, Any]) -> str:
    return f"GPU:{args['Device Id']}" if args["Device Type"] == 1 else "CPU:0"


def _in_use_after_each_change(log: EventLog, device: str) -> tuple[list[int], list[str | None]]:
    """Bytes requested in use after each alloc/free of ``device``, and each event's tag."""
    sub = log.filter(kind=["alloc", "free"], device=device)
    signed = np.where(sub["kind"] == int(Kind.FREE), -sub["requested"], sub["requested"])
    return np.cumsum(signed).tolist(), [e.tag for e in sub]


@pytest.fixture(scope="module")
def hta() -> tuple[EventLog, list[dict[str, Any]]]:
    path = trace_path(HTA)
    return gpuviz.load(path), _raw_memory_events(path)


def test_current_schema_bytes_in_use_equal_total_allocated_after_every_event(
    hta: tuple[EventLog, list[dict[str, Any]]],
) -> None:
    log, raw = hta
    assert detect(trace_path(HTA)) == "pytorch-profiler"
    assert log.device_names == ["GPU:1", "CPU:0"]
    for device in ("GPU:1", "CPU:0"):
        traced = [e["args"] for e in raw if _device(e["args"]) == device]
        in_use, tags = _in_use_after_each_change(log, device)
        seeded = sum(1 for tag in tags if tag == "PREEXISTING")
        assert in_use[seeded:] == [a["Total Allocated"] for a in traced]
        # the seeded allocations are exactly what was in use before the first traced event
        before = traced[0]["Total Allocated"] - traced[0]["Bytes"]
        assert (in_use[seeded - 1] if seeded else 0) == before
    gpu = [e["args"] for e in raw if _device(e["args"]) == "GPU:1"]
    assert (len(gpu), sum(a["Bytes"] > 0 for a in gpu)) == (26770, 13385)
    assert gpu[0]["Total Allocated"] - gpu[0]["Bytes"] == 4_096_614_400


def test_current_schema_counts_segments_peak_and_final_state(hta: tuple[EventLog, list[dict[str, Any]]]) -> None:
    log, raw = hta
    counts = Counter((e.kind, e.device) for e in log)
    for device in ("GPU:1", "CPU:0"):
        args = [e["args"] for e in raw if _device(e["args"]) == device]
        allocs = sum(a["Bytes"] > 0 for a in args)
        frees = sum(a["Bytes"] < 0 for a in args)
        preexisting = int(args[0]["Total Allocated"] != args[0]["Bytes"])
        assert counts[("alloc", device)] == allocs + preexisting
        assert counts[("free", device)] == frees
        # segments: the connected address ranges ever allocated (+1 for the preexisting bytes)
        ranges = sorted((a["Addr"], a["Addr"] + abs(a["Bytes"])) for a in args)
        joined = 0
        end = -1
        for start, stop in ranges:
            if start > end:
                joined += 1
            end = max(end, stop)
        assert counts[("segment_alloc", device)] == joined + preexisting
        assert counts[("split", device)] == counts[("merge", device)]
    r = replay(log)
    gpu = r.state_at(-1, device="GPU:1")
    peak = max(e["args"]["Total Allocated"] for e in raw if _device(e["args"]) == "GPU:1")
    in_use, _ = _in_use_after_each_change(log, "GPU:1")
    assert max(in_use) == peak == 6_629_508_096
    live = [c for s in gpu.segments for c in s.chunks if c.in_use]
    assert [(c.size, c.tag) for c in live] == [(4_096_614_400, "PREEXISTING")]
    assert r.state_at(-1, device="CPU:0").segments and not any(
        c.in_use for s in r.state_at(-1, device="CPU:0").segments for c in s.chunks
    )
    times = log["time_ns"]
    assert bool(np.all(np.diff(times) >= 0)) and int(times[-1]) == max(e["ts"] for e in raw) * 1000


def test_current_schema_meta_devices_and_reserved(hta: tuple[EventLog, list[dict[str, Any]]]) -> None:
    log, raw = hta
    source = log.meta["source"]
    assert source["format"] == "pytorch-profiler" and source["schema"] == "current"
    assert source["distributedInfo"] == {"backend": "nccl", "rank": 1, "world_size": 2}
    assert log.devices[0].options == {
        "allocator": "pytorch-caching", "model": "Tesla V100-SXM2-32GB", "total_memory": 34_089_730_048,
    }  # fmt: skip
    first = next(e for e in raw if _device(e["args"]) == "GPU:1")
    assert source["total_reserved"]["GPU:1"] == [[first["ts"] * 1000, 12_782_141_440]]
    r = replay(log).state_at(-1, device="GPU:1")
    reserved_note = (
        f"GPU:1: the trace's Total Reserved ends at 12782141440 bytes; the inferred segments hold {r.pool_bytes}"
    )
    assert any(note.startswith(reserved_note) for note in log.meta["notes"])
    assert log.meta["columns"]["address"] == "exact" and log.meta["columns"]["segment"] == "inferred"
    assert log.meta["columns"]["size"] == "inferred"
    # each allocation named by the op running on its thread (the trace's cpu_op events)
    assert log.meta["columns"]["tag"] == "inferred" and log.meta["columns"]["stack"] == "inferred"


def test_2021_schema_pairs_frees_by_size_and_keeps_bytes_in_use() -> None:
    log = gpuviz.load(trace_path(OLD))
    raw = _raw_memory_events(trace_path(OLD))
    assert log.meta["source"]["schema"] == "2021 (no Addr/totals)"
    assert log.meta["columns"]["address"] == "absent"
    assert log.device_names == ["GPU:0", "CPU:0"]
    counts = Counter((e.kind, e.device) for e in log)
    for device in ("GPU:0", "CPU:0"):
        args = [e["args"] for e in raw if _device(e["args"]) == device]
        allocs = sum(a["Bytes"] > 0 for a in args)
        assert counts[("alloc", device)] == counts[("segment_alloc", device)] == allocs
        assert counts[("free", device)] == counts[("segment_free", device)] == len(args) - allocs
        expected = np.cumsum([a["Bytes"] for a in args]).tolist()
        assert _in_use_after_each_change(log, device)[0] == expected
    cpu = replay(log).state_at(-1, device="CPU:0")
    assert sorted(c.size for s in cpu.segments for c in s.chunks if c.in_use) == [256, 19_267_584]
    assert max(_in_use_after_each_change(log, "GPU:0")[0]) == 2_791_636_480


def test_small_trace_preexisting_float_times_key_order_and_threads() -> None:
    log = gpuviz.load(SMALL)
    assert log.device_names == ["GPU:0", "CPU:0"]
    assert log.devices[0].options == {"allocator": "pytorch-caching", "model": "Test GPU", "total_memory": 1 << 30}
    base = 1 << 40
    rows = [(e.time_ns, e.kind, e.device, e.address - (base if e.device == "GPU:0" else 0), e.size, e.tag, e.thread)
            for e in log if e.kind in ("alloc", "free", "segment_alloc")]  # fmt: skip
    seg = -(-(base + 3072) // (2 << 20)) * (2 << 20) + (2 << 20) - base
    assert rows == [
        (101_500, "segment_alloc", "GPU:0", 0, 3072, None, 0),  # [base, +1024) [+1024, +512) [+1536, +1536) touch
        (101_500, "alloc", "GPU:0", 1536, 1536, "PREEXISTING", 0),  # freed in the trace, never allocated in it
        (101_500, "segment_alloc", "GPU:0", seg, 512, None, 0),
        (101_500, "alloc", "GPU:0", seg, 512, "PREEXISTING", 0),  # 3072 - 1024 - 1536 bytes of unknown address
        (101_500, "segment_alloc", "CPU:0", 4096, 64, None, 0),
        (101_500, "alloc", "GPU:0", 0, 1024, "aten::empty", 7),  # inside the cpu_op aten::empty on thread 7
        (102_000, "alloc", "GPU:0", 1024, 512, "aten::empty", 7),  # "args" before "name" in the JSON object
        (103_000, "free", "GPU:0", 1536, 1536, "PREEXISTING", 7),  # Ev Idx 3 before Ev Idx 4 at the same ts
        (103_000, "alloc", "CPU:0", 4096, 64, None, 8),  # thread 8 runs no op
        (104_000, "free", "GPU:0", 0, 1024, "aten::empty", 7),
        (105_000, "free", "CPU:0", 4096, 64, None, 8),
    ]
    assert log.meta["source"]["total_reserved"] == {
        "GPU:0": [[101_500, 2_097_152], [103_000, 4_194_304]],
        "CPU:0": [[103_000, 0]],
    }
    assert not log.truncated


def _write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def test_cut_short_files_give_their_prefix_flagged_truncated(tmp_path: Path) -> None:
    data = SMALL.read_bytes()
    cut = data.index(b'"Ev Idx": 5')  # inside the fifth [memory] event
    log = gpuviz.load(_write(tmp_path / "cut.json", data[:cut]))
    assert log.truncated and len(log.filter(kind=["alloc", "free"])) == 2 + 4  # 2 seeded, 4 traced
    assert any("cut short" in note for note in log.meta["notes"])
    # cut between events: no [memory] event is broken, but the document does not end
    between = data.index(b'{"ph": "X", "cat": "kernel"')
    assert gpuviz.load(_write(tmp_path / "between.json", data[:between])).truncated
    packed = gzip.compress(data)
    log = gpuviz.load(_write(tmp_path / "cut.json.gz", packed[: len(packed) - 40]))
    assert log.truncated


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    bad_bytes = SMALL.read_bytes().replace(b'"Bytes": 512', b'"Bytes": "512"')
    with pytest.raises(LogFormatError, match=r"Bytes is '512', not a 64-bit integer"):
        gpuviz.load(_write(tmp_path / "bad.json", bad_bytes))
    no_ts = SMALL.read_bytes().replace(b'"ts": 102}', b'"ts": null}')
    with pytest.raises(LogFormatError, match="has no numeric ts"):
        gpuviz.load(_write(tmp_path / "nots.json", no_ts))
    broken = SMALL.read_bytes().replace(b'"Bytes": 512,', b'"Bytes": 512,,')
    with pytest.raises(LogFormatError, match=r"not valid JSON|cut short"):
        gpuviz.load(_write(tmp_path / "broken.json", broken))


def test_a_trace_without_memory_events_says_how_to_record_them(tmp_path: Path) -> None:
    trace = {"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2}]}
    log = gpuviz.load(_write(tmp_path / "t.json", json.dumps(trace).encode()))
    assert len(log) == 0 and any("profile_memory=True" in note for note in log.meta["notes"])


def test_2021_schema_seeds_frees_without_an_allocation(tmp_path: Path) -> None:
    def mem(ts: int, size: int) -> dict[str, Any]:
        return {"ph": "i", "s": "t", "name": "[memory]", "ts": ts, "args": {"Device Type": 1, "Device Id": 0,
                                                                         "Bytes": size}}  # fmt: skip

    trace = {"schemaVersion": 1, "traceEvents": [mem(1, 512), mem(2, 512), mem(3, -512), mem(4, -256), mem(5, -512)]}
    log = gpuviz.load(_write(tmp_path / "old.json", json.dumps(trace).encode()))
    pairs = defaultdict(list)
    for e in log.filter(kind=["alloc", "free"]):
        pairs[e.address].append((e.kind, e.time_ns, e.tag))
    # LIFO: the free at t=3 frees the allocation of t=2; the 256-byte free was live before the trace
    assert sorted(pairs.values(), key=str) == sorted([
        [("alloc", 1000, None), ("free", 5000, None)],
        [("alloc", 2000, None), ("free", 3000, None)],
        [("alloc", 1000, "PREEXISTING"), ("free", 4000, "PREEXISTING")],
    ], key=str)  # fmt: skip
