"""PyTorch's raw memory timeline (``torch.profiler.profile(...).export_memory_timeline_raw(path, device)``).

A JSON list of ``[time_ns, action, bytes, category]`` for one device, written by
torch/profiler/_memory_profiler.py: action 1 PREEXISTING (time -1), 2 CREATE, 3 INCREMENT_VERSION
(a pair: ``-bytes`` in the old category, ``+bytes`` in the new), 4 DESTROY (``-bytes``); category
index 0 PARAMETER, 1 OPTIMIZER_STATE, 2 INPUT, 3 TEMPORARY, 4 ACTIVATION, 5 GRADIENT,
6 AUTOGRAD_DETAIL, 7 unknown.

Mapping: PREEXISTING and CREATE -> ``alloc`` tagged with the category (``activation``...),
DESTROY -> ``free`` of the latest live allocation of that size and category (LIFO; the file
names no tensor); INCREMENT_VERSION moves a live allocation to its new category without an
event (its tag stays the one it was created with). The file has no addresses: each allocation
gets a synthetic address in a segment of its own (reserved = in use, no fragmentation shown).
PREEXISTING rows (time -1) are placed at the first real time. The file names no device: the
log calls it ``GPU:0`` (the device is what was passed to ``export_memory_timeline_raw``).
Bytes in use after each row equal the running sum of the file's ``bytes``.

The file is read as a stream, twice (16 KiB of decompressed content at a time, the complete
rows in it decoded at once): a first pass checks every row and finds what the log needs before
its first event (the allocations alive before the file began, the first time), a second writes
the events as the rows come, so no row outlives its piece and the content is never whole in
memory (the log's rows are the peak: 78 bytes an event, ~1.9x the JSON). A file that
is not a plain list of valid rows (cut short, invalid JSON, a bad row) is read whole instead,
which gives its readable prefix flagged ``truncated`` or the error naming the first bad row.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence

from gpuviz.base.errors import LogFormatError
from gpuviz.importers.addressed import PREEXISTING, Unaddressed, unmatched_frees
from gpuviz.importers.builder import HeapBuilder, finish, set_source_meta
from gpuviz.importers.source import Passes, Progress, Source
from gpuviz.log.eventlog import EventLog

__all__ = ["NAME", "DESCRIPTION", "sniff", "read", "CATEGORIES"]

NAME = "pytorch-memory-timeline"
DESCRIPTION = "a PyTorch memory timeline (export_memory_timeline_raw: [[time_ns, action, bytes, category], ...])"
CATEGORIES = ("parameter", "optimizer_state", "input", "temporary", "activation", "gradient", "autograd_detail",
              "unknown")  # fmt: skip
_PREEXISTING, _CREATE, _INCREMENT_VERSION, _DESTROY = 1, 2, 3, 4
_ROW = rb"\[\s*-?\d+\s*,\s*[1-4]\s*,\s*-?\d+\s*,\s*[0-7]\s*\]"
_HEAD = re.compile(rb"^\s*\[\s*" + _ROW + rb"\s*,\s*" + _ROW + rb"\s*(?:,|\])")
_CHUNK = 1 << 14  # decompressed bytes read, and rows decoded, at a time (~0.07 MB of Python objects)
_SPACE = " \t\n\r"  # JSON's white space
_PIECE_LIMIT = 1 << 20  # characters without a row's end ("],") after which the file is read whole
Row = Sequence[int]  # [time_ns, action, bytes, category]


def sniff(head: bytes) -> bool:
    """A JSON list whose first two rows are ``[int, 1..4, int, 0..7]``."""
    return _HEAD.match(head) is not None


def _rows(data: bytes, name: str) -> tuple[list[list[int]], bool]:
    """The rows and whether the file was cut short (then the complete rows before the cut)."""
    try:
        rows = json.loads(data)
        truncated = False
    except ValueError as exc:
        # the complete rows before where decoding failed (rows hold only numbers: characters are
        # bytes); a few tries back from there, never one per ']' of the file (quadratic)
        cut = data.rfind(b"]", 0, getattr(exc, "pos", len(data)))
        for _ in range(3):
            if cut <= 0:
                break
            try:
                rows = json.loads(data[: cut + 1] + b"]")
                break
            except ValueError:
                cut = data.rfind(b"]", 0, cut)
        else:
            cut = -1
        if cut <= 0:
            raise LogFormatError(f"{name} is not a readable memory timeline: no complete row") from None
        truncated = True
    if not isinstance(rows, list):
        raise LogFormatError(f"{name} is not a JSON list of rows")
    for number, row in enumerate(rows):
        problem = _problem(row)
        if problem:
            raise LogFormatError(f"{name}: row {number} {problem}")
    return rows, truncated


def _problem(row: object) -> str:
    """What is wrong with a row, in words ('' when nothing is)."""
    if not (type(row) is list and len(row) == 4 and all(type(v) is int for v in row)):
        return f"is {row!r}, not [time_ns, action, bytes, category]"
    if row[1] not in (1, 2, 3, 4) or not 0 <= row[3] < len(CATEGORIES):
        return f"has action {row[1]} / category {row[3]} out of range"
    return ""


class _Irregular(Exception):
    """The stream is not a plain list of valid rows: the file is read whole instead."""


def _streamed_rows(source: Source, *, progress: Progress) -> Iterator[Row]:
    """The rows of ``source`` as they are read (the reads advance ``progress``); ``_Irregular``
    where the content is not a complete JSON list of valid rows.

    The text read so far is cut after its last ``],`` (the end of a row: rows hold only
    numbers) and the rows before it are decoded at once (``json.loads`` of ``[`` + them + ``]``):
    pieces that each decode to valid rows, joined by the commas between them, are the list."""
    progress, source.progress = source.progress, progress
    try:
        raw = source.open(buffered=False)
    finally:
        source.progress = progress
    decoder = codecs.getincrementaldecoder("utf-8")()
    with raw:
        try:
            text, eof, opened, rows = "", False, False, 0
            while not eof:
                block = raw.read(_CHUNK)
                eof = not block
                text += decoder.decode(block, final=eof)
                if not opened:  # the list's "["
                    text = text.lstrip(_SPACE)
                    if not text:
                        continue
                    if text[0] != "[":
                        raise _Irregular
                    text, opened = text[1:], True
                if eof:  # the rest, then the list's "]"
                    body = text.rstrip(_SPACE)
                    if not body.endswith("]") or (rows and not body[:-1].strip(_SPACE)):
                        raise _Irregular
                    piece, text = body[:-1], ""
                else:
                    cut = text.rfind("],")
                    if cut < 0:
                        if len(text) > _PIECE_LIMIT:
                            raise _Irregular
                        continue
                    piece, text = text[: cut + 1], text[cut + 2 :]
                for row in json.loads("[" + piece + "]"):
                    if _problem(row):
                        raise _Irregular
                    rows += 1
                    yield row
            if not opened:
                raise _Irregular
        except (ValueError, EOFError, OSError, RecursionError) as exc:  # JSON, UTF-8, gzip (zlib.error: OSError)
            raise _Irregular from exc


def read(source: Source, *, progress: Progress, streamed: bool = True) -> EventLog:
    """The log of ``source``; ``streamed=False`` reads the content whole (what a file that is not
    a plain list of valid rows gets, and the reference the streamed reading is tested against)."""
    try:
        if streamed:
            passes = Passes(source.progress, 2)  # the file is read twice: each read moves the bar half way
            return _build(source.name, lambda first: _streamed_rows(source, progress=passes), truncated=False)
    except _Irregular:
        pass
    rows, truncated = _rows(source.read_all(), source.name)
    return _build(source.name, lambda first: rows, truncated=truncated)


def _build(name: str, rows: Callable[[bool], Iterable[Row]], *, truncated: bool) -> EventLog:
    """The log of the rows ``rows(first)`` gives, twice: ``first`` True, then False."""
    first_time: list[int] = []
    categories: dict[int, int] = {}  # size -> the category of the last DESTROY row of that size

    def survey() -> Iterator[tuple[int, int]]:
        for time_ns, action, n, category in rows(True):
            if time_ns >= 0 and not first_time:
                first_time.append(time_ns)
            if action == _DESTROY:
                categories[-n] = category
            if action != _INCREMENT_VERSION:
                yield abs(n), n

    # by size only (a version increment keeps the size); a seed takes the category of its DESTROY row
    seeds = unmatched_frees(survey())
    start = first_time[0] if first_time else 0
    log = EventLog(arena=False)  # built at once, then read whole
    log.truncated = truncated
    heap = HeapBuilder(log, log.add_device("GPU:0", allocator="pytorch-caching"))
    tags = [log.intern_string(category) for category in CATEGORIES]
    preexisting = log.intern_string(PREEXISTING)
    synthetic = Unaddressed(heap)
    notes: list[str] = []
    for _, size in seeds:
        synthetic.alloc(start, size, (size, categories[size]), tag=preexisting)
    if seeds:
        notes.append(f"{len(seeds)} DESTROY rows have no earlier live tensor of their size: seeded as {PREEXISTING}")
    previous = start
    pending_move: tuple[int, int] | None = None
    for number, (time_ns, action, size, category) in enumerate(rows(False)):
        now = max(time_ns, previous)  # PREEXISTING rows (-1) at the first time; never backwards
        previous = now
        if action in (_PREEXISTING, _CREATE):
            synthetic.alloc(now, size, (size, category), tag=tags[category])
        elif action == _DESTROY:
            if not synthetic.free(now, (-size, category)) and not _free_any_category(synthetic, now, -size):
                raise LogFormatError(f"{name}: row {number} destroys {-size} bytes that are not live")
        elif size < 0:
            pending_move = (-size, category)
        elif pending_move is not None:
            synthetic.rekey(pending_move, (size, category))
            pending_move = None
    set_source_meta(
        log,
        format=NAME,
        file=name,
        tool="torch.profiler (export_memory_timeline_raw)",
        columns={
            "time_ns": "exact",
            "device": "absent",
            "address": "absent",
            "size": "inferred",
            "requested": "exact",
            "segment": "absent",
            "tag": "exact",
            "stack": "absent",
        },
        notes=[
            "no addresses: synthetic, one segment per allocation (reserved = in use); frees paired LIFO by size"
            " and category",
            "tags: the category a tensor was created with; version increments (category changes) are not events",
            "device: the file names none; shown as GPU:0",
            *notes,
        ],
    )
    return finish(log)


def _free_any_category(synthetic: Unaddressed, time_ns: int, size: int) -> bool:
    """Free the latest live allocation of ``size`` bytes whatever its category."""
    return any(synthetic.free(time_ns, (size, category)) for category in range(len(CATEGORIES)))
