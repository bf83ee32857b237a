"""The C decoder of XPlane memory events against the Python decoder (the reference): the same
columns and the same log for the real files (a third-party one where GPUVIZ_TEST_TRACES is set, TF's
own from the fixtures) and for generated XSpaces, the same error for broken ones."""

from __future__ import annotations

import gzip
import math
import mmap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protowire import double as _double
from protowire import field as _field
from test_snapshot_reader import _assert_same_log
from traces import trace_files

from gpuviz.importers import load
from gpuviz.importers import xplane as xp
from gpuviz.importers.memory_columns import MemoryColumns
from gpuviz.importers.source import Source

pytestmark = pytest.mark.skipif(not xp.native_decoder_available(), reason="the C XPlane decoder is not built")

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tf_bfc"
REAL = [
    *trace_files(["tb_xplane_gpu_multiworker.xplane.pb"]),
    *(pytest.param(p, id=p.name) for p in sorted(FIXTURES.glob("*.xplane.pb.gz"))),
    *(pytest.param(p, id=p.name) for p in sorted((FIXTURES.parent / "jax_xplane").glob("*.xplane.pb.gz"))),
]


def _bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def _assert_same_columns(got: MemoryColumns, want: MemoryColumns) -> None:
    assert got.kinds == want.kinds
    assert list(got.columns) == list(want.columns)
    for name, column in want.columns.items():
        assert got.columns[name].dtype == column.dtype, name
        assert np.array_equal(got.columns[name], column, equal_nan=column.dtype.kind == "f"), name


def _outcome(path: Path, monkeypatch: pytest.MonkeyPatch, native: str) -> Any:
    monkeypatch.setenv("GPUVIZ_NATIVE", native)
    try:
        return load(path, progress=False)
    except Exception as exc:  # the same error either way, whatever it is
        return f"{type(exc).__name__}: {exc}"


def _assert_same_import(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    native, python = (_outcome(path, monkeypatch, flag) for flag in ("1", "0"))
    if isinstance(native, str) or isinstance(python, str):
        assert native == python
    else:
        _assert_same_log(native, python)


@pytest.mark.parametrize("path", REAL)
def test_every_real_xplane_decodes_the_same_in_c(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _bytes(path)
    planes, columns = xp._decode_native(data)  # the C decoder itself: no fallback for real files
    want_planes, want = xp._decode_python(data)
    assert planes == want_planes
    _assert_same_columns(columns, want)
    assert len(columns) == {"tb_xplane_gpu_multiworker.xplane.pb": 2493, "keras_fit.xplane.pb.gz": 3811}.get(
        path.name, len(want)
    )
    _assert_same_import(path, monkeypatch)


# ------------------------------------------------------------------ generated XSpaces


STAT_NAMES = [*xp._SLOTS, "other", "addr"]  # a name twice: both ids are read as it
EVENT_NAMES = ["MemoryAllocation", "MemoryDeallocation", "ExecutorState::Process"]
_int64 = st.integers(-(1 << 63), (1 << 63) - 1)
_small = st.integers(0, 1 << 20)
_TEXTS = ["GPU_0_bfc", "gpu_host_bfc", "[2,3]", "f32[4]{0}", "MatMul", ""]


@st.composite
def _value(draw: st.DrawFn, plain: bool) -> bytes:
    """A stat's value fields: int64, uint64, text, double, ref, nothing, or several (the last wins)."""
    kinds = ["int", "small", "text", "double", "ref", "none"] + ([] if plain else ["uint", "odd_double", "bad_utf8"])
    out = b""
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(kinds))
        if kind in ("int", "small"):
            out += _field(4, draw(_int64 if kind == "int" else _small))
        elif kind == "uint":
            out += _field(3, draw(st.integers(0, (1 << 64) - 1)))
        elif kind == "text":
            out += _field(draw(st.sampled_from([5, 6])), draw(st.sampled_from(_TEXTS)).encode())
        elif kind == "bad_utf8":
            out += _field(5, b"\xff\xfeop")
        elif kind == "double":
            out += _double(2, draw(st.floats(-1e15, 1e15, allow_nan=False)))
        elif kind == "odd_double":
            out += _double(2, draw(st.sampled_from([math.nan, math.inf, 1e300])))
        elif kind == "ref":
            out += _field(7, draw(st.integers(0, len(STAT_NAMES) + 2)))
    return out


@st.composite
def _xspace(draw: st.DrawFn, plain: bool) -> bytes:
    planes = b""
    for p in range(draw(st.integers(1, 2))):
        lines = b""
        for _ in range(draw(st.integers(0, 2))):
            events = b""
            for _ in range(draw(st.integers(0, 8))):
                stats = b""
                for _ in range(draw(st.integers(0, 7))):
                    name = _field(1, draw(st.integers(1, len(STAT_NAMES) + 1)))  # one id has no name
                    stats += _field(4, name + draw(_value(plain)))
                event = _field(1, draw(st.integers(1, 4))) + _field(2, draw(st.integers(-(10**9), 10**12))) + stats
                if not plain and draw(st.integers(0, 9)) == 0:
                    event += draw(st.sampled_from([_double(2, 1.0), _field(1, b"x"), b"\x08", _field(1, 3)]))
                events += _field(4, event)
            lines += _field(3, _field(1, draw(_small)) + _field(2, b"line") + _field(3, draw(_small)) + events)
        metadata = b"".join(_field(4, _field(1, i + 1) + _field(2, _field(1, i + 1) + _field(2, n.encode())))
                            for i, n in enumerate(EVENT_NAMES))  # fmt: skip
        stat_metadata = b"".join(
            _field(5, _field(1, i + 1) + _field(2, _field(1, i + 1) + _field(2, n.encode())))
            for i, n in enumerate(STAT_NAMES)
        )
        name = draw(st.sampled_from(["/host:CPU", f"/device:GPU:{p}"]))
        planes += _field(1, _field(1, p) + _field(2, name.encode()) + lines + metadata + stat_metadata)
    if not plain and draw(st.booleans()):
        planes = planes[: draw(st.integers(0, len(planes)))]  # cut short
    return planes


@settings(max_examples=200, deadline=None)
@given(_xspace(plain=True))
def test_generated_plain_xspaces_decode_the_same_in_c(data: bytes) -> None:
    planes, columns = xp._decode_native(data)  # numbers that fit, finite doubles: no fallback
    want_planes, want = xp._decode_python(data)
    assert planes == want_planes
    _assert_same_columns(columns, want)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_xspace(plain=False))
def test_generated_xspaces_import_the_same_with_and_without_the_decoder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes
) -> None:
    try:
        planes, columns = xp._decode_native(data)
    except (xp.WireError, xp._native.Unsupported):
        pass  # the importer falls back to the Python decoder
    else:
        want_planes, want = xp._decode_python(data)
        assert planes == want_planes
        _assert_same_columns(columns, want)
    path = tmp_path / "x.xplane.pb"
    path.write_bytes(data)
    _assert_same_import(path, monkeypatch)


def test_a_mapped_file_is_decoded_the_same_while_its_pages_are_handed_back(tmp_path: Path) -> None:
    stats = [("allocator_name", "GPU_0_bfc"), ("addr", 1 << 40), ("allocation_bytes", 512),
             ("bytes_allocated", 1024), ("tf_op", "l0/MatMul"), ("shape", "[128]")]  # fmt: skip

    def stat(name: str, value: int | str) -> bytes:
        payload = _field(5, value.encode()) if isinstance(value, str) else _field(4, value)
        return _field(4, _field(1, xp._native.SLOT_NAMES.index(name) + 1) + payload)

    common = b"".join(stat(s, v) for s, v in stats)
    events = b"".join(  # 9 MB in one line: the decoder hands pages back every 4 MB
        _field(4, _field(1, 1 + i % 2) + _field(2, i * 1000) + common + stat("addr", i)) for i in range(120_000)
    )
    names = b"".join(_field(5, _field(1, i + 1) + _field(2, _field(1, i + 1) + _field(2, n.encode())))
                     for i, n in enumerate(xp._native.SLOT_NAMES))  # fmt: skip
    metadata = b"".join(_field(4, _field(1, i + 1) + _field(2, _field(1, i + 1) + _field(2, n.encode())))
                        for i, n in enumerate(EVENT_NAMES))  # fmt: skip
    line = _field(1, 3) + _field(3, 5) + events
    path = tmp_path / "big.xplane.pb"
    path.write_bytes(_field(1, _field(2, b"/host:CPU") + _field(3, line) + metadata + names))
    data = path.read_bytes()
    assert len(data) > 8 << 20
    mapped = Source(path).mapped()
    assert isinstance(mapped, mmap.mmap)
    planes, columns = xp._decode_native(mapped)  # drop_behind: the mapping is read, then handed back
    assert mapped[:] == data  # the file reads the same afterwards
    want_planes, want = xp._decode_native(data)
    assert planes == want_planes and len(columns) == 120_000
    _assert_same_columns(columns, want)
    assert columns.columns["address"][:3].tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="drop_behind needs a memory-mapped file"):
        xp._native.decode(data, [], True)
