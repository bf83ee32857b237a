"""TensorFlow's placement log, joined to the memory events of the same run as ``placement`` events.

The lines are those of ``tf.debugging.set_log_device_placement(True)`` (read with
``gpuviz.importers.tf_placement.placements``): eager ``Executing op X in device D`` lines and
the graph placer's ``node: (Op): D`` lines, a placer line counted once per (node, op, device)
as the importer does. Their absl prefix holds the wall-clock time (µs); the XSpace's times are
ns since the profile started (its ``Task Environment`` plane's ``profile_start_time``), so each
line's time is its wall-clock time minus that start. A line without a time, or a profile
without a start, puts the placement at the start of the log (said in the log's notes).
"""

from __future__ import annotations

import re

import numpy as np

from gpuviz.importers import xplane
from gpuviz.importers.source import Source
from gpuviz.importers.tf_placement import placements
from gpuviz.log.eventlog import NO_INDEX, EventLog
from gpuviz.log.schema import DTYPES, ROW_COLUMNS, Kind

__all__ = ["is_placement_line", "with_placements", "profile_start_ns"]

_LINE = re.compile(r"Executing op \S+ in device /|^\S+: \([A-Za-z0-9_]+\):? ?/(?:job:|device:)")
_PREFIX = re.compile(r"^(?:[IWEF]\d{4} [\d:.]+\s+\d+ [^\]]*\] |\d{4}-\d\d-\d\d [\d:.]+: [IWEF] [^\]]*\] )")


def is_placement_line(line: str) -> bool:
    """Whether ``line`` is one TensorFlow writes for ``log_device_placement`` (with or without its log prefix)."""
    return _LINE.search(_PREFIX.sub("", line, count=1)) is not None


def profile_start_ns(source: Source) -> int | None:
    """The wall-clock time (ns since the epoch) at which the profile in ``source`` started, if it says."""
    planes, _ = xplane.decode_memory_records(source.mapped())
    for plane in planes:
        start = plane.stats.get("profile_start_time")
        if isinstance(start, int) and start > 0:
            return start
    return None


def with_placements(log: EventLog, lines: list[str], source: Source | None) -> EventLog:
    """``log`` followed by a ``placement`` event per placement line, every event in time order
    (a read-only view sharing ``log``'s tables, with the devices and op names it adds)."""
    start = profile_start_ns(source) if source is not None and lines else None
    rows: list[tuple[int, int, int]] = []  # (time_ns, device, tag)
    seen: set[tuple[str, str, str]] = set()
    untimed = 0
    for line in placements(lines):
        if line.node is not None:
            if (line.node, line.op, line.device) in seen:
                continue
            seen.add((line.node, line.op, line.device))
        if line.time_ns is None or start is None:
            untimed += 1
            time_ns = 0
        else:
            time_ns = max(line.time_ns - start, 0)
        rows.append((time_ns, log.add_device(line.device), log.intern_string(line.op)))
    notes = log.meta.setdefault("notes", [])
    notes.append(
        f"{len(rows)} placement events from TensorFlow's placement log (time: its log line's, on the profile's clock)"
    )
    if untimed:
        notes.append(f"{untimed} placement lines without a usable time are put at the start of the log")
    if not rows:
        return log
    n = len(rows)
    columns = {name: np.zeros(n, dtype=DTYPES[name]) for name in ROW_COLUMNS}
    times, devices, tags = zip(*rows, strict=True)
    columns["time_ns"][:] = times
    columns["kind"][:] = int(Kind.PLACEMENT)
    columns["device"][:] = devices
    columns["tag"][:] = tags
    for name in ("peer", "segment", "largest_free", "stack"):
        columns[name][:] = NO_INDEX
    joined = log.extended(columns)
    order = np.argsort(joined["time_ns"], kind="stable")
    return joined.with_columns(**{name: joined[name][order] for name in ROW_COLUMNS})
