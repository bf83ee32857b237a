"""Hostile foreign traces, each opened in a subprocess under a memory and a time limit: every one
ends cleanly, loaded or refused with a gpuviz error, and what it loads can be shown and saved."""

from __future__ import annotations

import json
import pickle
import textwrap
from pathlib import Path

import pytest
from limited import cap, run_limited

TIMEOUT_S = 120  # a case past this never ends for a user either: the bound is on the input, not the machine

OPEN = textwrap.dedent(
    f"""
    import sys
    import gpuviz
    from gpuviz.views.text import summary_text
    {cap()}
    try:
        log = gpuviz.load(sys.argv[1], progress=False)
    except gpuviz.GpuvizError as error:
        print("refused:", str(error).replace(sys.argv[1], "FILE")[:300])
    else:
        str(log.meta)
        summary_text(log)
        log.save(sys.argv[1] + ".arrow")
        print("loaded:", len(log), "events")
    """
)


def _open(path: Path) -> str:
    return run_limited(OPEN, [str(path)], timeout=TIMEOUT_S).strip()


def _memory_event(**fields: object) -> dict[str, object]:
    args = {"Addr": 4096, "Bytes": 512, "Total Allocated": 512, "Total Reserved": 512, "Device Id": 0, "Device Type": 1}
    event = {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 1, "pid": 1, "tid": 1, "args": args}
    for name, value in fields.items():
        (args if name in args else event)[name] = value
    return event


def _trace(event: dict[str, object]) -> str:
    return json.dumps({"schemaVersion": 1, "traceEvents": [event]})


def _shared_settings() -> bytes:
    shared: list[object] = [0]
    for _ in range(40):  # 2^40 leaves when expanded, 300 bytes as a pickle
        shared = [shared, shared]
    return pickle.dumps({"segments": [], "device_traces": [[]], "allocator_settings": {"x": shared}})


CASES: dict[str, tuple[str, bytes, str]] = {  # name -> (file name, bytes, expected outcome's start)
    "huge Bytes": ("t.json", _trace(_memory_event(Bytes=1)).replace('"Bytes": 1', '"Bytes": 1e999999').encode(),
                   "refused: [memory] event #0: Bytes is Decimal('1E+999999'), not a 64-bit integer"),
    "huge ts": ("t.json", _trace(_memory_event(ts=1)).replace('"ts": 1', '"ts": 1e999999999').encode(),
                "refused: [memory] event #0 has no numeric ts in range"),
    "negative address": ("t.json", _trace(_memory_event(Addr=-5)).encode(),
                         "refused: [memory] event #0: Addr is -5, a negative address"),
    "deep nesting": ("n.json", b"[" * 1_000_000 + b"]" * 1_000_000, "refused: "),
    "shared references in settings": ("s.pickle", _shared_settings(), "loaded: 0 events"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_trace_ends_cleanly(tmp_path: Path, case: str) -> None:
    name, data, expected = CASES[case]
    path = tmp_path / name
    path.write_bytes(data)
    assert _open(path).startswith(expected)


def test_a_long_json_value_is_read_in_linear_work_and_refused_past_the_cap() -> None:
    import json as jsonlib

    from gpuviz.importers.jsonstream import MAX_VALUE, JsonStream

    def stream(length: int) -> JsonStream:
        head, tail = '{"a": "', '", "b": 1}'
        body = (("x" * 65536) for _ in range(length // 65536))
        return JsonStream(iter([head, *body, tail]))

    doc = stream(1 << 22)  # read in chunks of 64 KiB: decoded a few times over, not once per chunk
    assert [(key, len(doc.value()) if key == "a" else doc.value()) for key in doc.items()] == [("a", 1 << 22), ("b", 1)]
    doc = stream(MAX_VALUE + (1 << 20))
    with pytest.raises(jsonlib.JSONDecodeError, match=f"a value longer than {MAX_VALUE:,} characters"):
        for _ in doc.items():
            doc.value()


PLACEMENT_LINE = b"Executing op MatMul in device /job:localhost/replica:0/task:0/device:GPU:0\n"


def _gzip_bomb(path: Path, head: bytes, filler: bytes, total: int) -> None:
    """``head`` then ``filler`` repeated to ``total`` bytes, gzip-compressed as it is made (never whole in memory)."""
    import zlib

    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = filler * ((1 << 20) // len(filler))
    with open(path, "wb") as out:
        out.write(packer.compress(head))
        for _ in range((total - len(head)) // len(block)):
            out.write(packer.compress(block))
        out.write(packer.flush())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "head", "filler"),
    [
        ("snapshot.pickle.gz", b"\x80\x04}\x94\x8c\x08segments\x94\x8d" + (3 << 30).to_bytes(8, "little"), b"x"),
        (
            "placement.txt.gz",
            b"Executing op MatMul in device /job:localhost/replica:0/task:0/device:GPU:0\n",
            b"x" * 1023 + b"\n",
        ),
        ("timeline.raw.json.gz", b"[[1, 2, 512, 3], [2, 4, 512, 3]," + b" " * 64, b" "),  # white space after a row
        ("rmm_log.dev0.csv.gz", b"Thread,Time,Action,Pointer,Size,Stream\n", b"1,00:00:00.000001,allocate,0x1,1,0x0\n"),
    ],
)
def test_a_gzip_bomb_is_refused_within_the_limits(tmp_path: Path, name: str, head: bytes, filler: bytes) -> None:
    path = tmp_path / name
    _gzip_bomb(path, head, filler, (1 << 30) + (64 << 20))  # past the 1 GiB floor, ~1000x its compressed size
    assert path.stat().st_size < 8 << 20
    outcome = _open(path)
    assert outcome.startswith("refused: "), outcome
    if name.startswith("snapshot"):  # the string's declared length is past the decompression limit: refused at once
        assert "a string of 3,221,225,472 bytes declared at byte 24, where at most 1,073,741,800 bytes remain" in (
            outcome
        ), outcome
    else:
        assert "decompresses to more than 1,073,741,824 bytes" in outcome or "MemoryError" in outcome, outcome


def test_rmm_times_must_be_times_of_day_and_xprof_numbers_in_range(tmp_path: Path) -> None:
    import gpuviz

    header = "Thread,Time,Action,Pointer,Size,Stream\n"
    path = tmp_path / "rmm_log.dev0.csv"
    path.write_text(header + "1,99:99:99.999999,allocate,0x1000,512,0x0\n")
    with pytest.raises(gpuviz.LogFormatError, match=r"row 2: time '99:99:99.999999' is not a time of day"):
        gpuviz.load(path)
    path.write_text(header + "1,23:59:59.999999,allocate,0x1000,512,0x0\n")
    assert len(gpuviz.load(path)) > 0
    snapshot = {
        "timeOffsetPs": "1500",
        "aggregationStats": {"heapAllocatedBytes": "256", "peakBytesInUse": "256"},
        "activityMetadata": {"memoryActivity": "ALLOCATION", "address": "-4096", "allocationBytes": "256",
                             "requestedBytes": "256", "tfOpName": "Op", "stepId": "4"},
    }  # fmt: skip
    document = {"memoryProfilePerAllocator": {"GPU_0_bfc": {"sampledTimelineSnapshots": [snapshot],
                "profileSummary": {"memoryCapacity": "1024"}}}, "memoryIds": ["GPU_0_bfc"], "version": 1}  # fmt: skip
    bad = tmp_path / "bad.memory_profile.json"
    bad.write_text(json.dumps(document))
    with pytest.raises(gpuviz.LogFormatError, match="-4096 is out of range"):
        gpuviz.load(bad)


def test_rmm_times_in_other_writers_forms_are_checked_too() -> None:
    from gpuviz.importers.rmm_csv import _time_ns

    assert _time_ns(" 01:02:03.5 ", 2) == 3_723_500_000_000
    with pytest.raises(Exception, match=r"row 2: time '01:99:03.5' is not a time of day"):
        _time_ns("01:99:03.5", 2)


@pytest.mark.slow
def test_a_notebook_too_large_to_read_for_placement_lines_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "placement.ipynb.gz"
    line = PLACEMENT_LINE.rstrip(b"\n") + b"\\n"
    head = b'{"cells": [{"cell_type": "code", "outputs": [{"text": "' + line + b'"}]}], "x": "'
    _gzip_bomb(path, head, b" ", (300 << 20))
    outcome = _open(path)
    assert outcome.startswith("refused: FILE is a notebook of more than 256 MiB: too large to read"), outcome
