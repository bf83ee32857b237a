"""The streaming reader of snapshot pickles (C) against pickle + the restricted Unpickler: the same
snapshot, the same trace columns and the same log for every real file and for generated ones; the
same error for every refused or broken pickle."""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch_snapshots import SNAPSHOT_NAMES, SNAPSHOTS
from traces import trace_path

from gpuviz import EventLog, LogFormatError
from gpuviz.importers import load
from gpuviz.importers import snapshot_reader as sr
from gpuviz.importers.source import Source

pytestmark = pytest.mark.skipif(not sr.native_reader_available(), reason="the C snapshot reader is not built")

_FIELDS = ("action", "flags", "addr", "size", "time_us", "block_size")


def _native(path: Path) -> tuple[dict[str, Any], list[sr.TraceColumns], list[list[int]], EventLog]:
    log = EventLog()
    stacks = sr.Stacks(log)
    with Source(path).open() as stream:
        root, traces = sr._native.read(stream.read, stacks.provisional)
    columns = [sr.TraceColumns.from_bytes(parts) for _, parts in traces]
    return root, columns, [[stacks.final(s) for s in c.stack.tolist()] for c in columns], log


def _python(data: dict[str, Any]) -> tuple[list[sr.TraceColumns], list[list[int]], EventLog]:
    log = EventLog()
    stacks = sr.Stacks(log)
    columns = sr.traces_of(data, stacks)
    return columns, [[stacks.final(s) for s in c.stack.tolist()] for c in columns], log


def _assert_same_read(path: Path) -> None:
    root, columns, stacks, log = _native(path)
    data = pickle.loads(path.read_bytes())
    want_columns, want_stacks, want_log = _python(data)
    assert root == {**data, "device_traces": [[] for _ in data["device_traces"]]}
    assert len(columns) == len(want_columns)
    for got, want in zip(columns, want_columns, strict=True):
        for name in _FIELDS:
            assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert stacks == want_stacks and log.stacks == want_log.stacks


def _assert_same_import(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``load`` with the C reader and without it: the same log or the same error."""
    outcomes: list[Any] = []
    for native in ("1", "0"):
        monkeypatch.setenv("GPUVIZ_NATIVE", native)
        try:
            outcomes.append(load(path, progress=False))
        except LogFormatError as exc:
            outcomes.append(str(exc))
    if isinstance(outcomes[0], str) or isinstance(outcomes[1], str):
        assert outcomes[0] == outcomes[1], path
    else:
        _assert_same_log(outcomes[0], outcomes[1])


def _assert_same_log(a: EventLog, b: EventLog) -> None:
    assert len(a) == len(b)
    for name, column in b.columns.items():
        assert np.array_equal(a.columns[name], column), name
    assert (a.strings, a.stacks, a.meta) == (b.strings, b.stacks, b.meta)
    assert [(d.name, d.options) for d in a.devices] == [(d.name, d.options) for d in b.devices]


EXPORTED = Path(__file__).resolve().parent / "fixtures" / "torch_snapshot_export" / "simulated.pickle"
"""A snapshot gpuviz's exporter wrote (in the repository, unlike the real ones)."""


@pytest.mark.parametrize("path", [*SNAPSHOTS, pytest.param(EXPORTED, id="exported-fixture")])
def test_every_real_snapshot_reads_the_same_as_pickle(path: Path) -> None:
    _assert_same_read(path)
    assert sum(len(c) for c in _native(path)[1]) == sum(
        len(t) for t in pickle.loads(path.read_bytes())["device_traces"]
    )


# ------------------------------------------------------------------ generated snapshots
_frame = st.fixed_dictionaries(
    {"filename": st.sampled_from(["train.py", "??", "<string>", "lib.cpp"]), "line": st.integers(0, 500),
     "name": st.sampled_from(["forward", "step", "malloc"])}
)  # fmt: skip
_plain_int = st.integers(0, 1 << 50)
_odd = st.one_of(st.floats(allow_nan=False), st.booleans(), st.integers(1 << 64, 1 << 70), st.text(max_size=3))


@st.composite
def _snapshot(draw: st.DrawFn, plain: bool) -> dict[str, Any]:
    frames = draw(st.lists(_frame, min_size=1, max_size=6))
    lists = [draw(st.lists(st.sampled_from(frames), max_size=5)) for _ in range(draw(st.integers(1, 4)))]
    actions = [*sr.ACTIONS, "alloc", "alloc", "free_completed"] + ([] if plain else ["weird", None])

    def entry() -> dict[str, Any]:
        e: dict[str, Any] = {"action": draw(st.sampled_from(actions)), "addr": draw(st.sampled_from([0, 512, 1024]))}
        for key in ("size", "time_us", "block_size", "stream"):
            if draw(st.booleans()):
                e[key] = draw(_plain_int if plain or draw(st.booleans()) else _odd)
        if draw(st.booleans()):
            e["frames"] = draw(st.sampled_from(lists)) if draw(st.booleans()) else list(draw(st.sampled_from(lists)))
        if not plain and draw(st.integers(0, 9)) == 0:
            del e["addr"]
        return e

    traces = [[entry() for _ in range(draw(st.integers(0, 12)))] for _ in range(draw(st.integers(0, 3)))]
    blocks = [{"address": 0, "size": 512, "state": "active_allocated", "frames": draw(st.sampled_from(lists))}]
    snapshot = {
        "segments": [{"device": 0, "address": 0, "total_size": 2048, "blocks": blocks}],
        "device_traces": traces,
        # a frames list referenced again after the traces is not plain: the C reader leaves it to pickle
        "allocator_settings": {"a": (1, 2.5, None, True), "b": [] if plain else draw(st.sampled_from(lists))},
    }
    if draw(st.booleans()):
        snapshot["external_annotations"] = [{"stage": "START", "name": "x", "time_us": draw(_plain_int)}]
    return snapshot


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_snapshot(plain=True), st.integers(2, 5))
def test_generated_plain_snapshots_read_the_same_natively(
    tmp_path: Path, snapshot: dict[str, Any], protocol: int
) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=protocol))
    _assert_same_read(path)  # read by the C reader itself: no fallback for plain data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_snapshot(plain=False), st.integers(2, 5))
def test_generated_snapshots_import_the_same_with_and_without_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, snapshot: dict[str, Any], protocol: int
) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=protocol))
    _assert_same_import(path, monkeypatch)


# ------------------------------------------------------------------ refused and broken pickles
_HEAD, _TAIL = b"\x80\x04}(\x8c\x08segments", b"\x8c\x0ddevice_traces]u."
_REFUSED = {
    "GLOBAL": b"cposix\nsystem\n",
    "STACK_GLOBAL": b"\x8c\x05posix\x8c\x06system\x93",
    "INST": b"(iposix\nsystem\n",
    "OBJ": b"(N)o",
    "REDUCE": b"N)R",
    "BUILD": b"}}b",
    "NEWOBJ": b"N)\x81",
    "PERSID": b"Pid\n",
    "BINPERSID": b"NQ",
    "EXT1": b"\x82\x01",
}


@pytest.mark.parametrize("name", sorted(_REFUSED))
def test_every_refused_opcode_gets_the_restricted_unpicklers_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    path = tmp_path / "refused.pickle"
    path.write_bytes(_HEAD + _REFUSED[name] + _TAIL)
    with pytest.raises(sr._native.Unsupported), Source(path).open() as stream:
        sr._native.read(stream.read, lambda frames: -1)
    messages = []
    for native in ("1", "0"):
        monkeypatch.setenv("GPUVIZ_NATIVE", native)
        with pytest.raises(LogFormatError) as caught:
            load(path, progress=False)
        messages.append(str(caught.value))
    assert messages[0] == messages[1] and str(path) in messages[0]
    if name in ("GLOBAL", "STACK_GLOBAL", "INST"):
        assert "names the global posix.system, so it is refused and nothing of it was run" in messages[0]


@pytest.mark.parametrize("source", ["exported-fixture", "real"])
def test_cut_and_garbled_pickles_get_the_same_error_or_log(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = (EXPORTED if source == "exported-fixture" else trace_path(SNAPSHOT_NAMES[0])).read_bytes()
    rng = random.Random(9)
    damaged = [whole[:n] for n in sorted(rng.sample(range(1, len(whole)), 20))]
    for _ in range(20):
        data = bytearray(whole)
        at = rng.randrange(64, len(data))
        data[at] = rng.randrange(256)
        damaged.append(bytes(data))
    for i, data in enumerate(damaged):
        path = tmp_path / f"{i}.pickle"
        path.write_bytes(data)
        _assert_same_import(path, monkeypatch)


def test_a_short_string_repeated_in_every_entry_is_one_object(tmp_path: Path) -> None:
    """PyTorch writes e.g. ``compile_context: "N/A"`` in every entry, each a string of its own in the
    pickle's memo; the reader keeps one per distinct value (up to 64 bytes), the snapshot unchanged."""
    long = "x" * 65
    segments = [{"address": i << 21, "total_size": 1 << 21, "segment_type": "".join(["lar", "ge"]), "blocks": [],
                 "note": "".join([long[:30], long[30:]])} for i in range(3)]  # fmt: skip
    trace = [{"action": "alloc", "addr": i << 21, "size": 512, "compile_context": "".join(["N/", "A"]), "frames": []}
             for i in range(3)]  # fmt: skip
    data = {"segments": segments, "device_traces": [trace]}
    path = tmp_path / "strings.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    assert len({id(s["segment_type"]) for s in pickle.loads(path.read_bytes())["segments"]}) == 3
    root, columns, _, _ = _native(path)
    assert root == {**data, "device_traces": [[]]} and len(columns[0]) == 3
    assert len({id(s["segment_type"]) for s in root["segments"]}) == 1
    assert len({id(s["note"]) for s in root["segments"]}) == 3  # longer than 64 bytes: not shared
