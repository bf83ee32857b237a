"""XPlane (TensorFlow/JAX profiler) import: the real multi-GPU trace (GPUVIZ_TEST_TRACES), checked
against xprof's own conversion of the same file, plus hand-made protobufs for edge cases and bad input."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from traces import TRACES, trace_files, trace_path

import gpuviz
from gpuviz import LogFormatError, replay
from gpuviz.base.tags import parse_array_tag
from gpuviz.importers import detect, load
from gpuviz.importers.protowire import as_int64, fields
from gpuviz.importers.xplane import sniff

XPLANE = "tb_xplane_gpu_multiworker.xplane.pb"
XPROF_JSON = "tb_memory_profile_gpu_multiworker_converted_xprof2.24.2.json.gz"
TF_BFC = Path(__file__).parent / "fixtures" / "tf_bfc"
DEVICE_OF = {"GPU_1_bfc": "GPU:1", "GPU_4_bfc": "GPU:4", "GPU_6_bfc": "GPU:6", "gpu_host_bfc": "CPU:0"}


@pytest.fixture(scope="module")
def log() -> gpuviz.EventLog:
    return gpuviz.load(trace_path(XPLANE))


@pytest.fixture(scope="module")
def xprof() -> dict[str, dict]:  # type: ignore[type-arg]
    document = json.loads(gzip.decompress(trace_path(XPROF_JSON).read_bytes()))
    profile: dict[str, dict] = document["memoryProfilePerAllocator"]  # type: ignore[type-arg]
    return profile


def test_multi_gpu_file_is_eight_gpus_plus_the_host(log: gpuviz.EventLog) -> None:
    assert detect(trace_path(XPLANE)) == "xplane"
    assert [d.name for d in log.devices] == [f"GPU:{i}" for i in range(8)] + ["CPU:0"]
    assert {d.name: d.options.get("allocator") for d in log.devices if "allocator" in d.options} == {
        v: k for k, v in DEVICE_OF.items()
    }
    assert log.devices[4].options["plane"] == "/device:GPU:4"
    assert log.meta["source"]["format"] == "xplane"
    assert log.meta["source"]["allocators"] == {
        "gpu_host_bfc": 536,
        "GPU_4_bfc": 969,
        "GPU_6_bfc": 969,
        "GPU_1_bfc": 19,
    }
    assert log.meta["columns"]["segment"] == "inferred" and log.meta["columns"]["address"] == "exact"


def test_event_counts_per_kind_and_device(log: gpuviz.EventLog) -> None:
    counts = Counter((e.kind, e.device) for e in log if e.kind in ("alloc", "free", "segment_alloc"))
    assert counts == {
        ("alloc", "GPU:1"): 19, ("alloc", "GPU:4"): 761, ("alloc", "GPU:6"): 761, ("alloc", "CPU:0"): 318 + 11,
        ("free", "GPU:4"): 208, ("free", "GPU:6"): 208, ("free", "CPU:0"): 218,
        ("segment_alloc", "GPU:1"): 1, ("segment_alloc", "GPU:4"): 1, ("segment_alloc", "GPU:6"): 1,
        ("segment_alloc", "CPU:0"): 4,
    }  # fmt: skip
    times = log["time_ns"].tolist()
    assert times == sorted(times)
    assert [(e.flags, e.tag) for e in log if e.kind == "mark"] == [(1, "step 0"), (2, "step 0")]


def _in_use_after_each(log: gpuviz.EventLog, device: str) -> list[tuple[str, int, int, int, int]]:
    """(kind, address, chunk size, requested, bytes in use after) of each alloc/free of ``device``."""
    rows, in_use = [], 0
    for e in log:
        if e.device == device and e.kind in ("alloc", "free"):
            in_use += e.size if e.kind == "alloc" else -e.size
            rows.append((e.kind, e.address, e.size, e.requested, in_use))
    return rows


def test_every_event_matches_xprofs_conversion_of_the_same_file(log: gpuviz.EventLog, xprof: dict) -> None:  # type: ignore[type-arg]
    """xprof (TF's own converter) kept every event of these allocators (< 1000 each): same order,
    addresses, chunk and requested bytes; TF's heap bytes = gpuviz's bytes in use + what was in use
    before the trace (untracked, constant)."""
    for allocator, device in DEVICE_OF.items():
        snapshots = xprof[allocator]["sampledTimelineSnapshots"]
        ours = _in_use_after_each(log, device)
        seeded = len(ours) - len(snapshots)
        assert seeded == (11 if device == "CPU:0" else 0)
        untracked = log.devices[log.device_index(device)].options["untracked_bytes_in_use"]
        for snap, (kind, address, size, requested, in_use) in zip(snapshots, ours[seeded:], strict=True):
            meta = snap["activityMetadata"]
            assert kind == {"ALLOCATION": "alloc", "DEALLOCATION": "free"}[meta["memoryActivity"]]
            assert address == int(meta["address"]) and size == int(meta["allocationBytes"])
            if kind == "alloc":
                assert requested == int(meta["requestedBytes"])
            assert in_use + untracked == int(snap["aggregationStats"]["heapAllocatedBytes"])
        peak = int(xprof[allocator]["profileSummary"]["peakStats"]["peakBytesInUse"])
        assert max(row[-1] for row in ours) + untracked == peak
        assert log.devices[log.device_index(device)].options["tf_peak_bytes_in_use"] >= peak


def test_peak_and_final_state(log: gpuviz.EventLog) -> None:
    r = replay(log)
    final = {s.device: s for s in (r.state_at(-1, device=d) for d in ("GPU:4", "GPU:6", "CPU:0"))}
    assert {d: s.bytes_in_use for d, s in final.items()} == {"GPU:4": 2195516416, "GPU:6": 2196774144, "CPU:0": 64768}
    for device, state in final.items():
        state.check()
        assert state.bytes_in_use == _in_use_after_each(log, device)[-1][-1]
    assert [options.get("untracked_bytes_in_use") for options in (d.options for d in log.devices)] == [
        None, 4013337088, None, None, 4013337088, None, 4013337088, None, 540928,
    ]  # fmt: skip
    peaks = {d: max(row[-1] for row in _in_use_after_each(log, d)) for d in ("GPU:1", "GPU:4", "GPU:6", "CPU:0")}
    assert peaks == {"GPU:1": 7680, "GPU:4": 2195516672, "GPU:6": 2196774400, "CPU:0": 65024}


def test_tags_carry_op_dtype_and_shape(log: gpuviz.EventLog) -> None:
    tags = Counter(e.tag for e in log if e.kind == "alloc" and e.device == "GPU:4")
    assert tags["replica_4/bert_span_labeler/bert_encoder_1/transformer/layer_5/dropout_1/dropout/random_uniform/"
                "RandomUniform:float16[4,384,4096]"] == 1  # fmt: skip
    parsed = [parse_array_tag(t) for t in tags]  # every GPU allocation names its op, dtype and shape
    assert (len(parsed), sum(p is not None for p in parsed)) == (753, 753)


# ------------------------------------------------------------------ hand-made protobufs
def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        if n < 0x80:
            return bytes(out + bytes([n]))
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def _field(number: int, value: int | bytes | str) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    raw = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(raw)) + raw


STAT_IDS = {"allocator_name": 1, "addr": 2, "requested_bytes": 3, "allocation_bytes": 4, "bytes_allocated": 5,
            "tf_op": 6, "data_type": 7, "shape": 8, "group_id": 9}  # fmt: skip


def _space(events: list[tuple[str, int, dict[str, int | str]]], *, planes: tuple[str, ...] = ()) -> bytes:
    """An XSpace with a /host:CPU plane holding ``events`` (name, offset_ps, stats) on one line."""
    event_bytes = b""
    for name, offset_ps, stats in events:
        stat_bytes = b"".join(
            _field(4, _field(1, STAT_IDS[k]) + (_field(5, v) if isinstance(v, str) else _field(4, v)))
            for k, v in stats.items()
        )
        event_bytes += _field(4, _field(1, 1 if name == "MemoryAllocation" else 2) + _field(2, offset_ps) + stat_bytes)
    line = _field(1, 7) + _field(2, "python3") + _field(3, 1000) + event_bytes
    metadata = b"".join(_field(4, _field(1, i) + _field(2, _field(1, i) + _field(2, n)))
                        for i, n in ((1, "MemoryAllocation"), (2, "MemoryDeallocation")))  # fmt: skip
    stat_metadata = b"".join(
        _field(5, _field(1, i) + _field(2, _field(1, i) + _field(2, n))) for n, i in STAT_IDS.items()
    )
    host = _field(1, 0) + _field(2, "/host:CPU") + _field(3, line) + metadata + stat_metadata
    return _field(1, host) + b"".join(_field(1, _field(1, i + 1) + _field(2, p)) for i, p in enumerate(planes))


def _alloc(offset: int, addr: int, size: int, in_use: int, **extra: int | str) -> tuple[str, int, dict[str, int | str]]:
    stats: dict[str, int | str] = {"allocator_name": "GPU_0_bfc", "addr": addr, "requested_bytes": size - 1,
                                   "allocation_bytes": size, "bytes_allocated": in_use, **extra}  # fmt: skip
    return ("MemoryAllocation", offset, stats)


def _free(offset: int, addr: int, size: int, in_use: int) -> tuple[str, int, dict[str, int | str]]:
    stats: dict[str, int | str] = {"allocator_name": "GPU_0_bfc", "addr": addr, "allocation_bytes": size,
                                   "bytes_allocated": in_use}  # fmt: skip
    return ("MemoryDeallocation", offset, stats)


BASE = 1 << 40


def test_hand_made_trace_seeds_earlier_allocations_and_sorts_threads(tmp_path: Path) -> None:
    events = [
        _alloc(5_000, BASE + 512, 256, 768, tf_op="MatMul", data_type=1, shape="[8,8]", group_id=3),
        _free(2_000, BASE, 512, 512),  # allocated before the trace: seeded at its start
        _alloc(9_000, BASE, 256, 1024, tf_op="a:b[c]", data_type=0),
    ]
    path = tmp_path / "x.pb"
    path.write_bytes(_space(events, planes=("/device:GPU:0", "/device:GPU:1")))
    log = load(path)
    assert [d.name for d in log.devices] == ["GPU:0", "GPU:1"]
    rows = [(e.kind, e.time_ns, e.address - BASE if e.address else 0, e.size, e.tag) for e in log]
    assert rows == [
        ("segment_alloc", 1002, 0, 768, None),
        ("split", 1002, 0, 512, None),
        ("alloc", 1002, 0, 512, None),
        ("free", 1002, 0, 512, None),
        ("merge", 1002, 0, 768, None),
        ("mark", 1005, 0, 0, "step 3"),
        ("split", 1005, 0, 512, None),
        ("alloc", 1005, 512, 256, "MatMul:float32[8,8]"),
        ("mark", 1005, 0, 0, "step 3"),
        ("split", 1009, 0, 256, None),
        ("alloc", 1009, 0, 256, "a_b_c_"),
    ]
    # TF's bytes in use counted 512 more than the trace shows at every event
    assert log.devices[0].options["untracked_bytes_in_use"] == 512
    assert any("placed at its start" in note for note in log.meta["notes"])


def test_untracked_bytes_that_vary_are_reported_not_hidden(tmp_path: Path) -> None:
    path = tmp_path / "x.pb"
    path.write_bytes(_space([_alloc(1000, BASE, 256, 256), _alloc(2000, BASE + 256, 256, 4096)]))
    log = load(path)
    assert "untracked_bytes_in_use" not in log.devices[0].options
    assert any("differ from the replayed bytes in use by 0..3584 bytes" in n for n in log.meta["notes"])


def test_truncated_and_corrupt_protobufs_raise_clear_errors(tmp_path: Path) -> None:
    data = gzip.decompress((TF_BFC / "keras_fit.xplane.pb.gz").read_bytes())  # TF's own XSpace
    cut = tmp_path / "cut.xplane.pb"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(LogFormatError, match=r"not a complete XSpace protobuf \(truncated or corrupt"):
        load(cut)
    zipped = tmp_path / "cut.xplane.pb.gz"
    zipped.write_bytes(gzip.compress(data)[: len(gzip.compress(data)) // 2])
    with pytest.raises(LogFormatError, match="truncated or corrupt"):
        load(zipped)


def test_sniffer_accepts_only_xspaces() -> None:
    """Every real trace (where available) and every fixture: only XSpaces are accepted."""
    fixtures = [p for p in (Path(__file__).parent / "fixtures").rglob("*") if p.is_file()]
    real = [p for p in TRACES.iterdir() if p.name != "SOURCES.md"] if TRACES is not None else []
    for path in [*real, *fixtures]:
        raw = path.read_bytes()[: 1 << 16]
        head = gzip.decompress(path.read_bytes())[: 1 << 16] if raw[:2] == b"\x1f\x8b" else raw
        assert sniff(head) == (path.name == XPLANE or path.name.endswith(".xplane.pb.gz")), path.name
    assert not sniff(b"\nExecuting op MatMul in device /job:localhost/replica:0/task:0/device:GPU:0\n")
    assert not sniff(b"")
    assert sniff(_space([]))


def test_wire_decoder_reads_negative_int64() -> None:
    encoded = _field(1, -5)
    ((number, wire, value, _),) = list(fields(encoded))
    assert (number, wire, as_int64(value)) == (1, 0, -5)


def test_contradicting_events_are_skipped_and_counted(tmp_path: Path) -> None:
    events = [
        _free(1_000, BASE, 512, 256),  # made before the trace: seeded
        _free(2_000, BASE + 256, 256, 0),  # inside the first: contradicts it
        _alloc(3_000, BASE, 256, 256),
        _alloc(4_000, BASE, 256, 512),  # over memory in use
        _free(5_000, BASE, 256, 256),
        _free(6_000, BASE, 256, 256),  # a second free
    ]
    path = tmp_path / "x.pb"
    path.write_bytes(_space(events))
    log = load(path)
    assert [(e.kind, e.address - BASE) for e in log if e.kind in ("alloc", "free")] == [
        ("alloc", 0), ("free", 0), ("alloc", 0), ("free", 0),
    ]  # fmt: skip
    assert any(note.startswith("4 events that contradict the heap") for note in log.meta["notes"])
    replay(log).state_at(-1).check()


def test_a_profile_without_memory_events_says_so(tmp_path: Path) -> None:
    path = tmp_path / "jax.xplane.pb"
    path.write_bytes(_space([], planes=("/device:GPU:0",)))
    log = load(path)
    assert len(log) == 0 and [d.name for d in log.devices] == ["GPU:0"]
    assert log.meta["notes"] == ["the trace holds no MemoryAllocation/MemoryDeallocation events"]


@pytest.mark.parametrize(
    "path",
    [*trace_files([XPLANE, XPROF_JSON]),
     *(pytest.param(p, id=p.name) for p in sorted(TF_BFC.glob("*.xplane.pb.gz")))],
)  # fmt: skip
def test_tags_are_numbered_in_order_of_first_use(path: Path) -> None:
    """The writer interns every tag before writing a row; the string table is still the one
    interning on first use gives: the tags of the log's events, in order, each once."""
    log = load(path)
    used = {}
    for tag in log.columns["tag"].tolist():
        if tag >= 0:
            used.setdefault(tag, len(used))
    assert list(used) == list(range(len(log.strings))) and len(log.strings) > 2
