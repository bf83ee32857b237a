"""TensorFlow's log, joined to the memory events of the same run: ``placement`` and ``oom`` events.

The lines are those of ``tf.debugging.set_log_device_placement(True)`` (read with
``gpuviz.importers.tf_placement.placements``): eager ``Executing op X in device D`` lines and
the graph placer's ``node: (Op): D`` lines, a placer line counted once per (node, op, device)
as the importer does. Their absl prefix holds the wall-clock time (µs); the XSpace's times are
ns since the profile started (its ``Task Environment`` plane's ``profile_start_time``), so each
line's time is its wall-clock time minus that start. A line without a time, or a profile
without a start, puts the placement at the start of the log (said in the log's notes).

The profile has no event for a request the BFC allocator refused; its log has one line,
``Allocator (NAME) ran out of memory trying to allocate 5.00MiB (rounded to 5242880)requested
by op Empty``, which becomes an ``oom`` event of NAME's device: ``size`` the rounded bytes
(exact), ``requested`` the same (the log gives the request only rounded for display), ``tag``
the op.
"""

from __future__ import annotations

import re

import numpy as np

from gpuviz.importers import xplane
from gpuviz.importers.source import Source
from gpuviz.importers.tf_memory import allocator_device
from gpuviz.importers.tf_placement import placements
from gpuviz.log.eventlog import NO_INDEX, EventLog
from gpuviz.log.schema import DTYPES, ROW_COLUMNS, Kind

__all__ = ["is_placement_line", "is_oom_line", "is_kept_line", "with_log_events", "profile_start_ns"]

_LINE = re.compile(r"Executing op \S+ in device /|^\S+: \([A-Za-z0-9_]+\):? ?/(?:job:|device:)")
_PREFIX = re.compile(r"^(?:[IWEF]\d{4} [\d:.]+\s+\d+ [^\]]*\] |\d{4}-\d\d-\d\d [\d:.]+: [IWEF] [^\]]*\] )")


_OOM = re.compile(
    r"Allocator \((?P<allocator>[^)]+)\) ran out of memory trying to allocate .*?\(rounded to (?P<rounded>\d+)\)"
    r"\s*(?:requested by op (?P<op>\S+))?"
)
_EPOCH = re.compile(r"^[IWEF]0000 00:00:(\d+)\.(\d+)")


def is_oom_line(line: str) -> bool:
    """Whether ``line`` is TensorFlow's BFC allocator saying it refused a request."""
    return "ran out of memory trying to allocate" in line and _OOM.search(line) is not None


def is_kept_line(line: str) -> bool:
    """A line ``with_log_events`` turns into an event: a placement or an out-of-memory line."""
    return is_placement_line(line) or is_oom_line(line)


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


def _oom_rows(log: EventLog, lines: list[str], start: int | None) -> list[tuple[int, int, int, int]]:
    """(time_ns, device, rounded bytes, tag) of each out-of-memory line."""
    devices = {d.options.get("allocator"): i for i, d in enumerate(log.devices) if d.options.get("allocator")}
    rows = []
    for line in lines:
        match = _OOM.search(line)
        if match is None:
            continue
        stamp = _EPOCH.match(line)
        time_ns = 0
        if stamp is not None and start is not None:
            time_ns = max(int(stamp[1]) * 10**9 + int(stamp[2].ljust(9, "0")[:9]) - start, 0)
        allocator = match["allocator"]
        device = devices.get(allocator)
        if device is None:
            device = log.add_device(allocator_device(allocator, {}), allocator=allocator)
        tag = log.intern_string(match["op"]) if match["op"] else NO_INDEX
        rows.append((time_ns, device, int(match["rounded"]), tag))
    return rows


def with_log_events(log: EventLog, lines: list[str], source: Source | None) -> EventLog:
    """``log`` with a ``placement`` event per placement line and an ``oom`` event per
    out-of-memory line, every event in time order (a read-only view sharing ``log``'s tables,
    with the devices and op names it adds)."""
    start = profile_start_ns(source) if source is not None and lines else None
    rows: list[tuple[int, int, int, int, int]] = []  # (time_ns, kind, device, size, tag)
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
        rows.append((time_ns, int(Kind.PLACEMENT), log.add_device(line.device), 0, log.intern_string(line.op)))
    placed = len(rows)
    ooms = _oom_rows(log, lines, start)
    rows += [(time_ns, int(Kind.OOM), device, size, tag) for time_ns, device, size, tag in ooms]
    notes = log.meta.setdefault("notes", [])
    notes.append(
        f"{placed} placement events from TensorFlow's placement log (time: its log line's, on the profile's clock)"
    )
    if ooms:
        notes.append(
            f"{len(ooms)} out-of-memory events from TensorFlow's log (rounded bytes exact; requested = rounded)"
        )
    if untimed:
        notes.append(f"{untimed} placement lines without a usable time are put at the start of the log")
    if not rows:
        return log
    n = len(rows)
    columns = {name: np.zeros(n, dtype=DTYPES[name]) for name in ROW_COLUMNS}
    times, kinds, devices, sizes, tags = zip(*rows, strict=True)
    columns["time_ns"][:] = times
    columns["kind"][:] = kinds
    columns["device"][:] = devices
    columns["size"][:] = sizes
    columns["requested"][:] = sizes
    columns["tag"][:] = tags
    for name in ("peer", "segment", "largest_free", "stack"):
        columns[name][:] = NO_INDEX
    joined = log.extended(columns)
    order = np.argsort(joined["time_ns"], kind="stable")
    return joined.with_columns(**{name: joined[name][order] for name in ROW_COLUMNS})
