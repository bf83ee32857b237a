"""Damaged event-log files: bytes flipped and files cut at many offsets (fixed seeds).

Whatever the damage, ``load`` either raises ``LogFormatError`` or returns a prefix of the
original log — the same events, decoded the same way — flagged ``truncated`` whenever it
is shorter than the original. Never another exception, never a silently wrong log.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuviz import EventLog, LogFormatError, SimUpstream, load, mark
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.log.writer import LogWriter


def run(log: EventLog) -> None:
    """~600 events in several flushes: two devices, tags, stacks, marks, new strings late on."""
    gpu0 = ReferenceBFCAllocator(SimUpstream("1GiB"), log=log, stacks=True)
    gpu1 = ReferenceBFCAllocator(SimUpstream("1GiB"), device="GPU:1", log=log)
    live: list[tuple[ReferenceBFCAllocator, int]] = []
    for step in range(60):
        mark(f"step {step}", log=log)
        live.append((gpu0, gpu0.allocate(1000 + 37 * step, tag=f"layer {step % 7}")))
        live.append((gpu1, gpu1.allocate(5000 + step)))
        if len(live) > 10:
            allocator, address = live.pop(0)
            allocator.free(address)
    log.meta["finished"] = True


def saved(tmp_path: Path) -> tuple[EventLog, bytes]:
    log = EventLog(flush_rows=128)
    run(log)
    log.save(tmp_path / "saved.arrow")
    return log, (tmp_path / "saved.arrow").read_bytes()


def recording(tmp_path: Path) -> tuple[EventLog, bytes]:
    """The stream form of a recording still in progress (no end marker)."""
    log = EventLog(tmp_path / "live.arrow", flush_rows=128)
    run(log)
    log.flush()
    data = (tmp_path / "live.arrow").read_bytes()
    log.close()
    return log, data


def finished_stream(tmp_path: Path) -> tuple[EventLog, bytes]:
    """The stream form with its end marker (what close leaves before it writes the random-access form)."""
    log = EventLog(flush_rows=128)
    run(log)
    columns = log.columns
    writer = LogWriter(tmp_path / "stream.arrow", log)
    for start in range(0, len(log), 64):
        writer.write(log, {name: column[start : start + 64] for name, column in columns.items()})
    writer.close()
    return log, (tmp_path / "stream.arrow").read_bytes()


FORMS: dict[str, Callable[[Path], tuple[EventLog, bytes]]] = {
    "saved": saved,
    "recording": recording,
    "finished_stream": finished_stream,
}


def check(original: EventLog, path: Path, data: bytes) -> str:
    """Load the damaged ``data``: 'error', 'flagged' or 'intact'; fails on anything else."""
    path.write_bytes(data)
    try:
        loaded = load(path)
    except LogFormatError:
        return "error"
    n = len(loaded)
    assert n <= len(original)
    assert list(loaded) == list(original)[:n], "a damaged file loaded different events"
    if n < len(original) or loaded.truncated or loaded.corrupt:
        assert loaded.truncated or loaded.corrupt, "a prefix was not flagged"
        assert loaded.problems
        return "flagged"
    assert loaded.devices == original.devices and loaded.meta == original.meta
    assert loaded.strings == original.strings and loaded.stacks == original.stacks
    return "intact"


@pytest.mark.parametrize("form", sorted(FORMS))
def test_flipped_bytes_are_detected(tmp_path: Path, form: str) -> None:
    original, data = FORMS[form](tmp_path)
    assert check(original, tmp_path / "copy.arrow", data) == ("flagged" if form == "recording" else "intact")
    rng = random.Random(f"flip-{form}")
    outcomes: dict[str, int] = {}
    for case in range(300):
        offset = rng.randrange(len(data))
        damaged = bytearray(data)
        if case % 3 == 0:  # one flipped bit
            damaged[offset] ^= 1 << rng.randrange(8)
        elif case % 3 == 1:  # one garbled byte
            damaged[offset] = (damaged[offset] + rng.randrange(1, 256)) % 256
        else:  # a garbled run of up to 16 bytes
            for i in range(offset, min(offset + rng.randrange(1, 17), len(data))):
                damaged[i] = rng.randrange(256)
        outcome = check(original, tmp_path / "damaged.arrow", bytes(damaged))
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # most damage lands in event data, which checksums catch; padding bytes can change harmlessly
    assert outcomes.get("error", 0) + outcomes.get("flagged", 0) >= 200, outcomes


@pytest.mark.parametrize("form", sorted(FORMS))
def test_files_cut_anywhere_load_a_flagged_prefix_or_fail_clearly(tmp_path: Path, form: str) -> None:
    original, data = FORMS[form](tmp_path)
    rng = random.Random(f"cut-{form}")
    offsets = sorted({0, 1, 7, 8, len(data) - 1, *(rng.randrange(len(data)) for _ in range(150))})
    # after the end marker come only the stream's 8-byte end and, in the saved form, the footer
    # for other Arrow tools: a file cut there still holds every event
    after_marker = len(data) - 8
    if form == "saved":
        after_marker -= 10 + int.from_bytes(data[-10:-6], "little")
    outcomes = [check(original, tmp_path / "cut.arrow", data[:offset]) for offset in offsets]
    for offset, outcome in zip(offsets, outcomes, strict=True):
        assert outcome in (("error", "flagged") if offset < after_marker else ("intact", "flagged")), offset
    assert outcomes.count("flagged") >= 100  # most cuts leave a readable header and some batches
