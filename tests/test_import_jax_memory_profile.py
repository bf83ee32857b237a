"""JAX device memory profiles (``jax.profiler.save_device_memory_profile``): the live buffers per
device, exactly as JAX reported them, with the stacks that made them; bad profiles are refused."""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from protowire import field as _field
from protowire import varint as _varint

import gpuviz
from gpuviz import LogFormatError, replay
from gpuviz.importers import detect
from gpuviz.importers.jax_memory_profile import MAX_BUFFERS, load_jax_memory_profile, sniff
from gpuviz.log.eventlog import EventLog, Frame

FIXTURE = Path(__file__).parent / "fixtures" / "jax_memory_profile"
GENERATOR = FIXTURE / "generate.py"


def _creating_line(text: str) -> int:
    """The line of generate.py holding ``text``."""
    return next(i for i, line in enumerate(GENERATOR.read_text().splitlines(), 1) if text in line)


def _check(log: EventLog, expected: dict[str, Any]) -> None:
    allocs = log.filter(kind="alloc")
    assert log.device_names == ["CPU:0"] and expected["devices"] == ["cpu:0"]
    assert len(allocs) == expected["buffers"] == 6
    assert sorted(allocs["size"].tolist()) == expected["sizes"] == [7, 64, 400, 400, 400, 8192]
    assert int(allocs["size"].sum()) == expected["bytes"] == 9463
    assert allocs["requested"].tolist() == allocs["size"].tolist()
    assert set(log["time_ns"].tolist()) == {0}
    assert {e.kind for e in log} == {"segment_alloc", "alloc"}
    # each buffer's stack names the line of generate.py that made it
    made = {8192: "weights = ", 64: "bias = ", 400: "jnp.full((100,)", 7: "steps = "}
    for event in allocs:
        ours = [f for f in log.stacks[event.stack] if Path(f.filename).name == "generate.py"]
        assert ours, f"no generate.py frame for the {event.size}-byte buffer"
        assert ours[0].lineno == _creating_line(made[event.size])
        assert ours[-1].function == "<module>"
    state = replay(log).state_at(-1, device="CPU:0")
    assert state.bytes_in_use == state.pool_bytes == 9463  # a segment of its own per buffer
    source = log.meta["source"]
    assert (source["format"], source["tool"], source["buffers"], source["buffer_bytes"]) == (
        "jax-memory-profile", "jax.profiler.save_device_memory_profile", 6, 9463,
    )  # fmt: skip
    assert log.meta["columns"]["address"] == "inferred" and log.meta["columns"]["stack"] == "exact"


def test_the_committed_profile_is_what_jax_reported() -> None:
    path = FIXTURE / "memory.prof"
    assert detect(path) == "jax-memory-profile"
    expected = json.loads((FIXTURE / "expected.json").read_text())
    log = gpuviz.load(path)
    _check(log, expected)
    from_bytes = load_jax_memory_profile(path.read_bytes())
    assert from_bytes.columns["size"].tolist() == log.columns["size"].tolist()
    assert load_jax_memory_profile(gzip.decompress(path.read_bytes())).columns["size"].tolist() == (
        log.columns["size"].tolist()
    )
    assert load_jax_memory_profile(str(path)).device_names == ["CPU:0"]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_a_fresh_profile_from_this_jax_matches_its_live_arrays(tmp_path: Path) -> None:
    env = {"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, str(GENERATOR), str(tmp_path)], check=True, env=env, timeout=300)
    expected = json.loads((tmp_path / "expected.json").read_text())
    _check(gpuviz.load(tmp_path / "memory.prof"), expected)


# ---------------------------------------------------------------------------- hand-made profiles


def _profile(samples: list[tuple[list[int], list[int], dict[str, str]]], *,
             types: tuple[str, ...] = ("allocations", "count", "space", "bytes")) -> bytes:  # fmt: skip
    strings = ["", *types, "kind", "device", "buffer", "executable", "f", "train.py", "cuda:1", "tpu:0"]
    index = {s: i for i, s in enumerate(strings)}
    out = b"".join(_field(1, _field(1, index[types[i]]) + _field(2, index[types[i + 1]])) for i in (0, 2))
    for ids, values, labels in samples:
        body = _field(1, b"".join(map(_varint, ids))) + _field(2, b"".join(map(_varint, values)))
        for key, value in labels.items():
            body += _field(3, _field(1, index[key]) + _field(2, index[value]))
        out += _field(2, body)
    out += _field(4, _field(1, 1) + _field(4, _field(1, 1) + _field(2, 42)))
    out += _field(5, _field(1, 1) + _field(2, index["f"]) + _field(4, index["train.py"]))
    out += b"".join(_field(6, s.encode()) for s in strings)
    return gzip.compress(out)


def test_devices_counts_and_executables(tmp_path: Path) -> None:
    data = _profile([
        ([1], [3, 3 * 1024], {"kind": "buffer", "device": "cuda:1"}),
        ([1], [1, 4096], {"kind": "buffer", "device": "tpu:0"}),
        ([], [1, 512], {"kind": "executable", "device": "cuda:1"}),
        ([1], [1, 2048], {"kind": "executable"}),  # names no device, two devices: left out
    ])  # fmt: skip
    assert sniff(gzip.decompress(data))
    log = load_jax_memory_profile(data)
    assert log.device_names == ["GPU:1", "TPU:0"]
    rows = [(e.device, e.size, e.tag) for e in log.filter(kind="alloc")]
    assert rows == [("GPU:1", 1024, None)] * 3 + [("TPU:0", 4096, None), ("GPU:1", 512, "executable")]
    stacks = {log.stacks[e.stack] if e.stack >= 0 else () for e in log.filter(kind="alloc")}
    assert stacks == {(Frame("train.py", 42, "f"),), ()}
    assert any(note.startswith("1 compiled executables (2048 bytes) name no device") for note in log.meta["notes"])
    path = tmp_path / "p.prof"
    path.write_bytes(data)
    assert detect(path) == "jax-memory-profile"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_profile([([1], [2, 3], {"kind": "buffer", "device": "cuda:1"})]), "are not \\(count, count x size bytes\\)"),
        (_profile([([1], [MAX_BUFFERS + 1, MAX_BUFFERS + 1], {"kind": "buffer", "device": "cuda:1"})]),
         f"declares {MAX_BUFFERS + 1} buffers"),
        (_profile([([9], [1, 8], {"kind": "buffer", "device": "cuda:1"})]), "names location 9, which is not defined"),
        (_profile([([1], [1, 8], {"kind": "train.py", "device": "cuda:1"})]), "kind is 'train.py'"),
        (_profile([([1], [1, 8], {"kind": "buffer"})], types=("alloc_objects", "count", "alloc_space", "bytes")),
         "not a JAX device memory profile"),
        (_profile([([1], [1, 8], {"kind": "buffer", "device": "cuda:1"})])[:-12], "gzip stream is cut short"),
    ],
)  # fmt: skip
def test_bad_profiles_are_refused_with_a_reason(tmp_path: Path, data: bytes, message: str) -> None:
    with pytest.raises(LogFormatError, match=message):
        load_jax_memory_profile(data)
