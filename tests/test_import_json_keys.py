"""Content-based detection of JSON traces by their top-level keys (gpuviz/importers/jsontop.py),
wherever the keys sit in the file, with bounded work; and the real H100 trace that needs it."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from traces import REASON

import gpuviz
from gpuviz import LogFormatError, replay
from gpuviz.importers import detect
from gpuviz.importers.jsontop import MAX_DEPTH, scan
from gpuviz.log.schema import Kind

TRACES = os.environ.get("GPUVIZ_TEST_TRACES")
needs_traces = pytest.mark.skipif(not TRACES, reason=REASON)
DOCUMENT = {
    "metadata": {"a": [1, 2, {"b": 'x]}"{['}], "c": "é 🔥 \\"},
    "traceEvents": [{"ph": "i", "args": {"deep": [[[[[[1]]]]]]}}, '\\"', -1.5e-3, True, None],
    "big": "y" * 70_000,
    "schemaVersion": 1,
    "deviceProperties": [{"id": 0, "name": "GPU"}],
    "": None,
}


def _chunks(data: bytes, size: int) -> Iterator[bytes]:
    return (data[i : i + size] for i in range(0, len(data), size))


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 4096, 1 << 20])
@pytest.mark.parametrize("indent", [None, 2])
def test_keys_and_small_values_whatever_the_chunks(size: int, indent: int | None) -> None:
    data = json.dumps(DOCUMENT, indent=indent, ensure_ascii=False).encode()
    top = scan(_chunks(data, size))
    assert (top.kind, top.complete, top.problem) == ("object", True, None)
    assert top.keys == list(DOCUMENT)
    assert top.scanned == len(data)
    for key in ("metadata", "traceEvents", "schemaVersion", "deviceProperties", ""):
        assert top.value(key) == DOCUMENT[key]
    assert top.value("big") is None  # over MAX_VALUE_BYTES: skipped, not kept


@pytest.mark.parametrize(
    ("data", "kind", "describe"),
    [
        (b"[" * 1200 + b"]" * 1200, "array", "a JSON array"),
        (b'  "text"', "string", "a JSON string"),
        (b"-12", "number", "a JSON number"),
        (b"null", "literal", "a JSON literal"),
        (b"{}", "object", "an empty JSON object"),
        (b'{"a": 1, "b": [2], "c": {"d": 3}}', "object", "a JSON object with top-level keys a, b, c"),
    ],
)
def test_what_a_document_is(data: bytes, kind: str, describe: str) -> None:
    top = scan(_chunks(data, 5))
    assert (top.kind, top.describe()) == (kind, describe)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b'{"a": [1, 2', "cut short at byte 11"),
        (b'{"a": "xx', "cut short in a string at byte 9"),
        (b'{"a" 1}', "':' expected at byte 5"),
        (b'{"a": 1 "b": 2}', "',' or '}' expected at byte 8"),
        (b"{1: 2}", "a key (a string) expected at byte 1"),
        (b'{"a": ' + b"[" * (MAX_DEPTH + 5), f"nested more than {MAX_DEPTH} levels deep at byte {6 + MAX_DEPTH}"),
    ],
)
def test_a_scan_that_stops_says_why_and_where(data: bytes, problem: str) -> None:
    top = scan(_chunks(data, 3))
    assert (top.kind, top.complete, top.problem) == ("object", False, problem)


def test_the_scan_stops_at_its_byte_limit() -> None:
    data = b'{"a": "' + b"x" * 10_000 + b'", "b": 1}'
    top = scan(_chunks(data, 1000), max_bytes=5000)
    assert (top.keys, top.complete, top.problem) == (["a"], False, "not scanned past its first 5000 bytes")


def test_a_very_deep_value_is_followed_without_recursion() -> None:
    depth = MAX_DEPTH - 2
    data = b'{"x": ' + b"[" * depth + b"]" * depth + b', "y": 2}'
    top = scan(_chunks(data, 1 << 16))
    assert (top.keys, top.complete, top.value("y")) == (["x", "y"], True, 2)


def test_a_profiler_trace_with_its_keys_after_a_big_prefix_is_detected(tmp_path: Path) -> None:
    """``traceEvents`` and kineto's keys beyond the sniffed head: found by the key scan."""
    events = [
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 2, "ts": 10 + i,
         "args": {"Device Type": 1, "Device Id": 0, "Addr": 4096 * (i + 1), "Bytes": 512,
                  "Total Allocated": 512 * (i + 1), "Total Reserved": 1 << 20}}
        for i in range(3)
    ]  # fmt: skip
    document = {
        "metadata": {"padding": ["z" * 100] * 1000},  # 100 KB before traceEvents
        "traceEvents": events,
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "Test GPU", "totalGlobalMem": 1 << 30}],
    }
    path = tmp_path / "late_keys.json.gz"
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    assert detect(path) == "pytorch-profiler"
    log = gpuviz.load(path)
    assert log.device_names == ["GPU:0"]
    assert log.devices[0].options == {"allocator": "pytorch-caching", "model": "Test GPU", "total_memory": 1 << 30}
    assert log.meta["source"]["version"] == "1"
    assert [e.requested for e in log.filter(kind="alloc")] == [512, 512, 512]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b'{"a": 1, "b": [1, 2], "c": {"d": 4}}', "it is a JSON object with top-level keys a, b, c: not a format gpuviz"
         " opens"),
        (b"[" * 1200 + b"]" * 1200, "it is a JSON array"),
        (b"[" * 1200, "it is a JSON array"),
        (b'{"a": [1, 2', "it looks like a JSON object with top-level keys a (cut short at byte 11)"),
        (b'{"traceEvents": []}', "it is a JSON object with top-level keys traceEvents: not a format gpuviz opens"),
    ],
)  # fmt: skip
def test_valid_json_of_no_known_format_is_named(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(content)
    with pytest.raises(LogFormatError) as info:
        gpuviz.load(path)
    assert f"is not a gpuviz event log nor a trace gpuviz can open: {says}. Formats tried:" in str(info.value)


# ---------------------------------------------------------------------------- the real H100 trace
def _raw_memory_events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rb") as file:
        data = json.load(file)
    events = [(i, e) for i, e in enumerate(data["traceEvents"]) if e.get("name") == "[memory]"]
    events.sort(key=lambda p: (p[1]["ts"], p[1]["args"].get("Ev Idx", -1), p[0]))
    return [e for _, e in events]


def raw_final(raw: list[dict[str, Any]], device_type: int) -> int:
    return int([e["args"] for e in raw if e["args"]["Device Type"] == device_type][-1]["Total Allocated"])


@needs_traces
@pytest.mark.slow
def test_the_h100_tracelens_trace_opens_and_matches_its_own_totals() -> None:
    """A harness's ``metadata`` object before ``traceEvents``, kineto's keys at the very end."""
    path = Path(TRACES or "") / "pt_profiler_h100_owlv2_tracelens.json.gz"
    assert path.is_file(), f"{path} is missing"
    with gzip.open(path, "rb") as file:
        head = file.read(1 << 16)
    assert b'"schemaVersion"' not in head and b'"[memory]"' not in head  # what made the head sniffer miss it
    assert detect(path) == "pytorch-profiler"
    log = gpuviz.load(path)
    raw = _raw_memory_events(path)
    assert log.device_names == ["GPU:0", "CPU:0"]
    assert log.devices[0].options == {
        "allocator": "pytorch-caching", "model": "NVIDIA H100 80GB HBM3", "total_memory": 85_018_279_936,
    }  # fmt: skip
    assert log.meta["source"]["version"] == "1"
    device_of = {1: "GPU:0", 0: "CPU:0"}
    assert [sum(device_of[e["args"]["Device Type"]] == d for e in raw) for d in ("GPU:0", "CPU:0")] == [12270, 1204]
    for device in ("GPU:0", "CPU:0"):
        traced = [e["args"] for e in raw if device_of[e["args"]["Device Type"]] == device]
        sub = log.filter(kind=["alloc", "free"], device=device)
        signed = np.where(sub["kind"] == int(Kind.FREE), -sub["requested"], sub["requested"])
        in_use = np.cumsum(signed).tolist()
        seeded = sum(1 for e in sub if e.tag == "PREEXISTING")
        assert in_use[seeded:] == [a["Total Allocated"] for a in traced]
        assert (in_use[seeded - 1] if seeded else 0) == traced[0]["Total Allocated"] - traced[0]["Bytes"]
    final = replay(log).state_at(-1, device="GPU:0")
    assert sum(c.requested for s in final.segments for c in s.chunks if c.in_use) == raw_final(raw, 1)
    assert not any("contradict" in note for note in log.meta["notes"])


@pytest.mark.slow
def test_a_gzip_bomb_is_scanned_only_to_a_multiple_of_its_size(tmp_path: Path) -> None:
    """80 MiB of white space compress to 80 KB: the key scan stops at SCAN_FLOOR (64 MiB)."""
    from gpuviz.importers.source import SCAN_FLOOR, Source

    path = tmp_path / "bomb.json.gz"
    with gzip.open(path, "wb", compresslevel=9) as file:
        file.write(b'{"a": 1, "b": "')
        block = b" " * (1 << 20)
        for _ in range(80):
            file.write(block)
        file.write(b'", "traceEvents": [], "schemaVersion": 1}')
    top = Source(path).json_top()
    assert top.keys == ["a", "b"] and top.problem == f"not scanned past its first {SCAN_FLOOR} bytes"
    assert SCAN_FLOOR < top.scanned <= SCAN_FLOOR + (1 << 20)
    with pytest.raises(
        LogFormatError, match="it looks like a JSON object with top-level keys a, b \\(not scanned past"
    ):
        gpuviz.load(path)
