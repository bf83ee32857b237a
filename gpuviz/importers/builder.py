"""Building an EventLog from a foreign trace: the heap builder (``gpuviz.log.heapbuilder``),
inferred segments, and where the log came from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from gpuviz.log.eventlog import EventLog
from gpuviz.log.heapbuilder import HeapBuilder, HeapConflict, event_row

__all__ = [
    "HeapBuilder",
    "HeapConflict",
    "event_row",
    "infer_segments",
    "infer_segments_of",
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
    pairs = list(intervals)
    addresses = np.array([a for a, _ in pairs], dtype=np.int64)
    sizes = np.array([n for _, n in pairs], dtype=np.int64)
    return infer_segments_of(addresses, sizes)


def infer_segments_of(addresses: np.ndarray, sizes: np.ndarray) -> list[tuple[int, int]]:
    """``infer_segments`` of allocations given as two int64 arrays (addresses, sizes in bytes)."""
    keep = sizes > 0
    starts, ends = addresses[keep], addresses[keep] + sizes[keep]
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], np.maximum.accumulate(ends[order])
    if not len(starts):
        return []
    first = np.flatnonzero(np.r_[True, starts[1:] > ends[:-1]])  # a range starts past every end before it
    last = np.r_[first[1:] - 1, len(starts) - 1]
    return [(b, e - b) for b, e in zip(starts[first].tolist(), ends[last].tolist(), strict=True)]


META_NODES = 10_000
"""The most values (containers, strings, numbers) an importer copies from a file into ``meta``."""
META_DEPTH = 32
"""The deepest nesting copied into ``meta``; deeper values become ``"…"``."""
META_TEXT = 4_096
"""The longest string copied into ``meta``, in characters; longer ones are cut and say so."""


def bounded(value: Any) -> Any:
    """``value`` (from a file) as plain JSON-able data within ``META_NODES`` values and
    ``META_DEPTH`` levels: a structure whose parts are shared many times over (a pickle's
    memo makes 300 bytes hold 2^40 leaves) costs at most the budget, never its expansion."""
    left = [META_NODES]

    def copy(item: Any, depth: int) -> Any:
        left[0] -= 1
        if left[0] < 0 or depth > META_DEPTH:
            return "…"
        if item is None or isinstance(item, (bool, float)):
            return item
        if isinstance(item, int):
            return item if item.bit_length() <= 64 else f"{str(item)[:20]}… ({item.bit_length()}-bit integer)"
        if isinstance(item, (str, bytes)):
            text = item if isinstance(item, str) else repr(item)
            return text if len(text) <= META_TEXT else f"{text[:META_TEXT]}… ({len(text):,} characters)"
        if isinstance(item, Mapping):
            out: dict[str, Any] = {}
            for key, inner in item.items():
                if left[0] <= 0:
                    out["…"] = f"{len(item) - len(out)} more"
                    break
                out[str(copy(key, depth + 1))] = copy(inner, depth + 1)
            return out
        if isinstance(item, (list, tuple)):
            items: list[Any] = []
            for inner in item:
                if left[0] <= 0:
                    items.append(f"… {len(item) - len(items)} more")
                    break
                items.append(copy(inner, depth + 1))
            return items
        return copy(repr(item), depth)

    return copy(value, 0)


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
    inferred or skipped, in words. ``extra`` is copied ``bounded``: what came from the file
    costs at most ``META_NODES`` values, however its parts are shared.
    """
    bad = {name: value for name, value in columns.items() if value not in COLUMN_FIDELITY}
    if bad:
        raise ValueError(f"column fidelity must be one of {COLUMN_FIDELITY}, got {bad}")
    log.meta["source"] = {"format": format, "version": version, "tool": tool, "file": file, **bounded(extra or {})}
    log.meta["columns"] = dict(columns)
    log.meta["notes"] = list(notes)


def finish(log: EventLog) -> EventLog:
    """Flush ``log`` and make it read-only, as a loaded log is."""
    log.flush()
    log._readonly = True
    return log
