"""Building an EventLog from a foreign trace: the heap builder (``gpuviz.log.heapbuilder``),
inferred segments, and where the log came from.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpuviz.log.eventlog import EventLog
from gpuviz.log.heapbuilder import HeapBuilder, HeapConflict, event_row

__all__ = [
    "HeapBuilder",
    "HeapConflict",
    "event_row",
    "infer_segments",
    "set_source_meta",
    "finish",
    "COLUMN_FIDELITY",
]

COLUMN_FIDELITY = ("exact", "inferred", "absent")


def infer_segments(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Segments for a source that records none: the connected address ranges ever allocated.

    ``intervals`` are ``(address, size)`` of every allocation; overlapping or touching ranges
    join. Returns sorted ``(base, size)``.
    """
    merged: list[list[int]] = []
    for start, size in sorted((a, s) for a, s in intervals if s > 0):
        end = start + size
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end - start) for start, end in merged]


def set_source_meta(
    log: EventLog,
    *,
    format: str,
    file: str,
    version: str | None = None,
    tool: str | None = None,
    columns: dict[str, str],
    notes: Iterable[str] = (),
    extra: dict[str, Any] | None = None,
) -> None:
    """Record where an imported log came from in ``log.meta``.

    ``meta["source"]`` = {format, version, tool, file, **extra}; ``meta["columns"]`` says for
    each column whether it is ``exact`` (from the source), ``inferred`` (derived by the
    importer) or ``absent`` (the source has no such data); ``meta["notes"]`` lists what was
    inferred or skipped, in words.
    """
    bad = {name: value for name, value in columns.items() if value not in COLUMN_FIDELITY}
    if bad:
        raise ValueError(f"column fidelity must be one of {COLUMN_FIDELITY}, got {bad}")
    log.meta["source"] = {"format": format, "version": version, "tool": tool, "file": file, **(extra or {})}
    log.meta["columns"] = dict(columns)
    log.meta["notes"] = list(notes)


def finish(log: EventLog) -> EventLog:
    """Flush ``log`` and make it read-only, as a loaded log is."""
    log.flush()
    log._readonly = True
    return log
