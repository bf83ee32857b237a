"""Small logs the event-log tests share."""

from __future__ import annotations

from pathlib import Path

from gpuviz import EventLog, SimUpstream, mark
from gpuviz.capture import ReferenceBFCAllocator

BASE = 1 << 40


def small_run(log: EventLog | None = None) -> ReferenceBFCAllocator:
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), growth=False, log=log)
    a = alloc.allocate(1000, tag="weights")
    b = alloc.allocate(2000, tag="grads")
    alloc.free(a)
    alloc.free(b)
    return alloc


def recorded_stream(tmp_path: Path) -> tuple[EventLog, bytes]:
    """A log of 10 events recorded to a file in batches of 4, 4 and 2 (``flush_rows=12``), and
    the file's bytes before ``close``: the stream form, every batch on disk, no end marker."""
    log = EventLog(flush_rows=12)
    small_run(log)
    mark("end", log=log)
    path = tmp_path / "recording.arrow"
    log.record_to(path)
    stream = path.read_bytes()
    log.close()
    return log, stream
