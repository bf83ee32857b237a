"""TPU XPlanes: memory events on the host plane with no ``allocator_name`` but an ``index_on_host``
stat (the TPU core) become one device per core, named after the TPU device planes.

No such real file is available, so the test writes XSpaces of that layout with the protobuf wire
format itself (field numbers in gpuviz/importers/xplane.py): each core's allocator hands out the
same addresses, so merged onto one device the streams would contradict; split by core each is
consistent, and each core's peak equals the file's ``peak_bytes_in_use``."""

from __future__ import annotations

from pathlib import Path

import pytest
from protowire import varint as _varint

import gpuviz
from gpuviz.analysis.timeline import timeline_series
from gpuviz.importers import xplane
from gpuviz.log.schema import Kind

MiB = 1 << 20
BASE = 99_456_634_752  # a TPU HBM address, as XProf shows them
STATS = {"index_on_host": 1, "addr": 2, "requested_bytes": 3, "allocation_bytes": 4, "bytes_allocated": 5,
         "peak_bytes_in_use": 6, "tf_op": 7, "tensor_shape": 8, "region_type": 9}  # fmt: skip


def _field(number: int, value: int | bytes | str) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    raw = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(raw)) + raw


def _entry(field: int, ident: int, name: str) -> bytes:
    return _field(field, _field(1, ident) + _field(2, _field(1, ident) + _field(2, name)))


Event = tuple[bool, int, dict[str, int | str]]  # is_alloc, offset_ps, stats


def _core_events(core: int) -> tuple[list[Event], int]:
    """Core ``core``'s allocator: the same addresses on every core, sizes scaled by the core;
    returns its events (times interleaved with the other cores') and its peak bytes in use."""
    scale = core + 1
    steps = [("a", 0, 4 * MiB), ("b", 4 * MiB, 2 * MiB), ("-a", 0, 4 * MiB), ("c", 0, 1 * MiB),
             ("d", 6 * MiB, 8 * MiB), ("-b", 4 * MiB, 2 * MiB), ("-d", 6 * MiB, 8 * MiB)]  # fmt: skip
    in_use = peak = 0
    events: list[Event] = []
    for i, (name, offset, size) in enumerate(steps):
        size *= scale
        offset *= scale
        alloc = not name.startswith("-")
        in_use += size if alloc else -size
        peak = max(peak, in_use)
        stats: dict[str, int | str] = {
            "index_on_host": core, "addr": BASE + offset, "allocation_bytes": size, "bytes_allocated": in_use,
            "peak_bytes_in_use": peak, "region_type": "output",
        }  # fmt: skip
        if alloc:
            stats.update(requested_bytes=size, tf_op=f"fusion.{name}", tensor_shape=f"f32[{size // 4}]{{0}}")
        events.append((alloc, (i * 4 + core) * 1_000_000, stats))
    return events, peak


def _space(cores: int, planes: list[str]) -> tuple[bytes, dict[int, int], list[Event]]:
    events: list[Event] = []
    peaks = {}
    for core in range(cores):
        mine, peaks[core] = _core_events(core)
        events += mine
    events.sort(key=lambda e: e[1])
    body = b""
    for alloc, offset_ps, stats in events:
        stat_bytes = b"".join(
            _field(4, _field(1, STATS[k]) + (_field(5, v) if isinstance(v, str) else _field(4, v)))
            for k, v in stats.items()
        )
        body += _field(4, _field(1, 1 if alloc else 2) + _field(2, offset_ps) + stat_bytes)
    line = _field(1, 3) + _field(2, "tpu_runtime") + _field(3, 5_000) + body
    metadata = _entry(4, 1, "MemoryAllocation") + _entry(4, 2, "MemoryDeallocation")
    stat_metadata = b"".join(_entry(5, i, n) for n, i in STATS.items())
    host = _field(1, 0) + _field(2, "/host:CPU") + _field(3, line) + metadata + stat_metadata
    device_planes = b"".join(
        _field(1, _field(1, i + 1) + _field(2, name) + _entry(5, 1, "core_details")) for i, name in enumerate(planes)
    )
    return _field(1, host) + device_planes, peaks, events


@pytest.fixture(params=["native", "python"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "native" and not xplane.native_decoder_available():
        pytest.skip("the C XPlane decoder is not built")
    monkeypatch.setenv("GPUVIZ_NATIVE", "1" if request.param == "native" else "0")
    return str(request.param)


@pytest.mark.parametrize(
    ("planes", "names"),
    [
        (["/device:TPU:0", "/device:TPU:1", "/device:TPU:2", "/device:TPU:3"], ["TPU:0", "TPU:1", "TPU:2", "TPU:3"]),
        (["/device:TPU:4", "/device:TPU:5", "/device:TPU:6", "/device:TPU:7"], ["TPU:4", "TPU:5", "TPU:6", "TPU:7"]),
        ([], ["TPU:0", "TPU:1", "TPU:2", "TPU:3"]),
    ],
)
def test_each_core_is_a_device_named_after_its_plane(tmp_path: Path, decoder: str, planes: list[str],
                                                     names: list[str]) -> None:  # fmt: skip
    data, peaks, events = _space(4, planes)
    path = tmp_path / "tpu.xplane.pb"
    path.write_bytes(data)
    log = gpuviz.load(path)
    assert log.device_names == names
    for core, name in enumerate(names):
        device = log.devices[log.device_index(name)]
        if planes:
            assert device.options["plane"] == planes[core]
        mine = [e for e in events if e[2]["index_on_host"] == core]
        allocs = log.filter(kind="alloc", device=name)
        frees = log.filter(kind="free", device=name)
        # every memory event of the core lands on its device, at the core's addresses and sizes
        assert [(int(a), int(s)) for a, s in zip(allocs["address"], allocs["size"], strict=True)] == [
            (e[2]["addr"], e[2]["allocation_bytes"]) for e in mine if e[0]
        ]
        assert len(frees) == sum(not e[0] for e in mine)
        series = timeline_series(log, name)
        assert int(series.bytes_in_use.max()) == peaks[core] == max(int(e[2]["peak_bytes_in_use"]) for e in mine)
        in_use = [int(e[2]["bytes_allocated"]) for e in mine]
        kinds = log["kind"][series.index]
        assert series.bytes_in_use[(kinds == Kind.ALLOC) | (kinds == Kind.FREE)].tolist() == in_use
    assert [peaks[c] for c in range(4)] == [11 * MiB, 22 * MiB, 33 * MiB, 44 * MiB]
    assert not any("contradict" in note for note in log.meta["notes"])
    assert any(note.startswith("memory events without allocator_name carry the TPU core") for note in log.meta["notes"])
    assert log.meta["source"]["allocators"] == {names[c][4:]: 7 for c in range(4)}


def test_events_with_an_allocator_name_keep_it(tmp_path: Path) -> None:
    """``index_on_host`` names the device only where ``allocator_name`` is missing."""
    assert xplane._allocator({"allocator_name": "GPU_0_bfc", "index_on_host": 3}) == "GPU_0_bfc"
    assert xplane._allocator({"index_on_host": 3}) == "index_on_host:3"
    assert xplane._allocator({"allocator_name": "", "index_on_host": 1}) == "index_on_host:1"
    assert xplane._allocator({}) == ""
