"""RMM's ``logging_resource_adaptor`` CSV (``rmm.enable_logging()`` / ``rmm.reinitialize(logging=True)``).

One row per call on the wrapped memory resource, after the header
``Thread,Time,Action,Pointer,Size,Stream``::

    140210341947200,23:59:59.998000,allocate,0x7f2c4a000000,1048576,0
    140210341947200,00:00:00.000250,free,0x7f2c4a000000,1048576,0
    140210341947200,00:00:00.000300,allocate failure,(nil),68719476736,0x1

Mapping: ``allocate`` -> ``alloc`` (chunk size = requested = Size: the log has no rounding),
``free`` -> ``free``, ``allocate failure`` -> ``oom``. Time is the local wall clock of the day
(``HH:MM:SS.ffffff``, no date): ns since the first row's midnight, a step back of more than
12 h is a midnight passed; a smaller step back (threads logging out of order) keeps the
previous time. Thread = the OS thread id. Segments are not logged: inferred as the address
ranges ever used; a free of a pointer never allocated in the log was allocated before logging
began and is seeded (``PREEXISTING``). The device is ``GPU:<n>`` from the file name RMM's
Python API gives each device's log (``log.dev<n>.csv``, older ``log.csv.dev<n>``), else ``GPU:0``.
Stream is not kept. The legacy CSV of RMM <= 0.13 (``Event Type,Device ID,...``) is
recognised and rejected with a clear error.
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import re
import zlib
from array import array
from collections.abc import Iterator

from gpuviz.base.errors import LogFormatError
from gpuviz.importers.addressed import Change, apply, prepare
from gpuviz.importers.builder import HeapBuilder, finish, set_source_meta
from gpuviz.importers.source import Progress, Source
from gpuviz.importers.textlines import TextLines
from gpuviz.log.eventlog import EventLog

__all__ = ["NAME", "DESCRIPTION", "sniff", "read", "HEADER"]

NAME = "rmm-csv"
DESCRIPTION = "an RMM logging_resource_adaptor CSV (Thread,Time,Action,Pointer,Size,Stream)"
HEADER = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"]
_LEGACY = ["Event Type", "Device ID", "Address", "Stream", "Size (bytes)", "Free Memory", "Total Memory"]
_TIME = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{1,9})$")
_DEVICE = re.compile(r"\.dev(\d+)(?:\.|$)")
_DAY_NS = 86_400 * 10**9
_HALF_DAY_NS = _DAY_NS // 2
_ACTIONS = ("allocate", "free", "allocate failure")


def _first_line(head: bytes) -> list[str]:
    line = head.lstrip(b"\xef\xbb\xbf").split(b"\n", 1)[0].rstrip(b"\r")
    return [field.strip() for field in line.decode("utf-8", errors="replace").split(",")]


def sniff(head: bytes) -> bool:
    """The first line is the adaptor's header (or the legacy one, to reject it clearly)."""
    fields = _first_line(head)
    return fields == HEADER or fields[: len(_LEGACY)] == _LEGACY


def _time_ns(text: str, row: int) -> int:
    """RMM's ``HH:MM:SS.ffffff`` (a time of day: hours 0-23, minutes and seconds 0-59) in ns."""
    if len(text) == 15 and text[2] == ":" and text[5] == ":" and text[8] == "." and text.isascii():
        try:  # RMM's own form, HH:MM:SS.ffffff
            hours, minutes, seconds, micros = int(text[:2]), int(text[3:5]), int(text[6:8]), int(text[9:])
        except ValueError:
            pass
        else:
            if hours < 24 and minutes < 60 and seconds < 60 and micros >= 0:
                return ((hours * 60 + minutes) * 60 + seconds) * 10**9 + micros * 1000
            raise LogFormatError(f"row {row}: time {text!r} is not a time of day (HH < 24, MM and SS < 60)")
    match = _TIME.match(text.strip())
    if match is None:
        raise LogFormatError(f"row {row}: time {text!r} is not HH:MM:SS.ffffff")
    h, m, sec = int(match[1]), int(match[2]), int(match[3])
    if h >= 24 or m >= 60 or sec >= 60:
        raise LogFormatError(f"row {row}: time {text!r} is not a time of day (HH < 24, MM and SS < 60)")
    return ((h * 60 + m) * 60 + sec) * 10**9 + int(match[4].ljust(9, "0"))


def _pointer(text: str, row: int) -> int:
    text = text.strip()
    if text == "(nil)":
        return 0
    if text.startswith("0x") or text == "0":
        try:
            return int(text, 16)
        except ValueError:
            pass
    raise LogFormatError(f"row {row}: pointer {text!r} is not 0x... or (nil)")


def _ends_with_newline(source: Source) -> bool:
    """Whether the file's content ends with a newline (a compressed file's cut shows as EOFError instead)."""
    if source.compressed:
        return True
    with open(source.path, "rb") as file:
        file.seek(max(source.size - 1, 0))
        return file.read(1) in (b"\n", b"")


class _Rows:
    """The parsed rows: changes in order, failures ``(position among changes, time, size, thread)``."""

    def __init__(self) -> None:
        # the changes as columns (a row costs 32 bytes, not a tuple of four ints)
        self.times, self.addresses, self.deltas, self.threads = array("q"), array("q"), array("q"), array("q")
        self.failures: list[tuple[int, int, int, int]] = []
        self.rows = self.day = self.previous = self.reordered = self.first_ns = 0

    def add(self, number: int, fields: list[str]) -> None:
        """Row ``number`` (1 = header); ``LogFormatError`` (nothing added) when it is not a valid row."""
        if not fields:
            return
        if len(fields) != len(HEADER):
            raise LogFormatError(f"row {number} has {len(fields)} fields, not {len(HEADER)}: {fields!r}")
        thread_text, time_text, action, pointer_text, size_text, _ = fields
        try:
            size, thread = int(size_text), int(thread_text)
        except ValueError:
            size = thread = -1
        if size < 0 or thread < 0:
            raise LogFormatError(f"row {number}: thread {thread_text!r} and size {size_text!r} must be integers")
        action = action.strip()
        if action not in _ACTIONS:
            raise LogFormatError(f"row {number}: action {action!r} is not allocate, free or allocate failure")
        pointer = _pointer(pointer_text, number)
        day = self.day
        time_ns = day + _time_ns(time_text, number)
        if time_ns < self.previous - _HALF_DAY_NS:
            day += _DAY_NS
            time_ns += _DAY_NS
        if time_ns < self.previous:
            self.reordered += 1
            time_ns = self.previous
        if action == "allocate failure":
            self.failures.append((len(self.times), time_ns, size, thread))
        else:
            self.times.append(time_ns)
            self.addresses.append(pointer)
            self.deltas.append(size if action == "allocate" else -size)
            self.threads.append(thread)
        if not self.rows:
            self.first_ns = time_ns
        self.rows += 1
        self.day, self.previous = day, time_ns

    def changes(self) -> Iterator[Change]:
        """The allocations and frees in order."""
        for row in zip(self.times, self.addresses, self.deltas, self.threads, strict=True):
            yield Change(*row)


def read(source: Source, *, progress: Progress) -> EventLog:
    if _first_line(source.head) != HEADER:
        raise LogFormatError(
            f"{source.path} is the legacy RMM (<= 0.13) CSV (Event Type,Device ID,...), which gpuviz does not read;"
            " log with a current RMM (logging_resource_adaptor: Thread,Time,Action,Pointer,Size,Stream)"
        )
    match = _DEVICE.search(source.path.name)
    log = EventLog(arena=False)  # built at once, then read whole
    device = f"GPU:{match[1] if match else 0}"
    heap = HeapBuilder(log, log.add_device(device, allocator="rmm"))
    parsed = _Rows()
    notes: list[str] = []
    lines: TextLines | None = None
    try:
        with source.open() as stream:
            lines = TextLines(io.TextIOWrapper(stream, encoding="utf-8", newline=""))
            rows = csv.reader(lines)
            next(rows, None)  # the header (a cut stream may end before it: see lines.cut)
            number, current = 2, next(rows, None)
            while current is not None:
                following = next(rows, None)
                if following is None and (not lines.complete or lines.cut is not None):
                    log.truncated = True  # the last row was cut: even if it parses, its last field may be short
                    notes.append(f"the file is cut short inside row {number}: imported the rows before it")
                    break
                try:
                    parsed.add(number, current)
                except LogFormatError:
                    if following is not None or _ends_with_newline(source):
                        raise
                    log.truncated = True
                    notes.append(f"the file is cut short inside row {number}: imported the rows before it")
                number, current = number + 1, following
            if lines.cut is not None and not log.truncated:
                log.truncated = True
                notes.append(f"the compressed file is cut short ({lines.cut}): imported the rows before the cut")
    except csv.Error as exc:  # a field over the csv module's limit (131,072 characters), a NUL byte
        line = lines.count if lines is not None else 1
        raise LogFormatError(f"{source.name}: line {line} is not CSV gpuviz reads ({exc})") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        log.truncated = True
        notes.append(f"the compressed file is cut short ({exc}): imported the rows before the cut")
    failures = parsed.failures
    if parsed.day:
        notes.append(f"the log passes midnight {parsed.day // _DAY_NS} time(s): times continue into the next day")
    if parsed.reordered:
        notes.append(
            f"{parsed.reordered} rows are earlier than the row before (threads logging out of order): kept in order"
        )
    if parsed.rows:
        notes.extend(prepare(heap, parsed.changes(), start_ns=parsed.first_ns))
    skipped = 0
    pending = iter(failures)
    failure = next(pending, None)
    for position, change in enumerate(itertools.chain(parsed.changes(), [None])):
        while failure is not None and failure[0] == position:
            heap.oom(failure[1], failure[2], failure[2], thread=failure[3])
            failure = next(pending, None)
        if change is not None and not apply(heap, change):
            skipped += 1
    if skipped:
        notes.append(f"{skipped} rows contradict the heap built so far (overlap, unknown free): skipped")
    set_source_meta(
        log,
        format=NAME,
        file=source.name,
        tool="RMM logging_resource_adaptor",
        columns={
            "time_ns": "exact",
            "device": "inferred",
            "thread": "exact",
            "address": "exact",
            "size": "inferred",
            "requested": "exact",
            "segment": "inferred",
            "largest_free": "inferred",
            "tag": "absent",
            "stack": "absent",
        },
        notes=[
            "chunk size = requested = Size: the log records no rounding",
            "segments are not logged: inferred as the address ranges ever used",
            "time: wall clock of the day without date: ns since the first row's midnight",
            f"device {device}: from the file name (RMM's Python API names each device's log .dev<n>)",
            "stream: not kept",
            *notes,
        ],
    )
    return finish(log)
