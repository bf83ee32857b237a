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
"""

from __future__ import annotations

import json
import re

from gpuviz.base.errors import LogFormatError
from gpuviz.importers.addressed import PREEXISTING, Unaddressed, unmatched_frees
from gpuviz.importers.builder import HeapBuilder, finish, set_source_meta
from gpuviz.importers.source import Progress, Source
from gpuviz.log.eventlog import EventLog

__all__ = ["NAME", "DESCRIPTION", "sniff", "read", "CATEGORIES"]

NAME = "pytorch-memory-timeline"
DESCRIPTION = "a PyTorch memory timeline (export_memory_timeline_raw: [[time_ns, action, bytes, category], ...])"
CATEGORIES = ("parameter", "optimizer_state", "input", "temporary", "activation", "gradient", "autograd_detail",
              "unknown")  # fmt: skip
_PREEXISTING, _CREATE, _INCREMENT_VERSION, _DESTROY = 1, 2, 3, 4
_ROW = rb"\[\s*-?\d+\s*,\s*[1-4]\s*,\s*-?\d+\s*,\s*[0-7]\s*\]"
_HEAD = re.compile(rb"^\s*\[\s*" + _ROW + rb"\s*,\s*" + _ROW + rb"\s*(?:,|\])")


def sniff(head: bytes) -> bool:
    """A JSON list whose first two rows are ``[int, 1..4, int, 0..7]``."""
    return _HEAD.match(head) is not None


def _rows(data: bytes, name: str) -> tuple[list[list[int]], bool]:
    """The rows and whether the file was cut short (then the complete rows before the cut)."""
    try:
        rows = json.loads(data)
        truncated = False
    except ValueError:
        cut = data.rfind(b"]", 0, len(data))
        while cut > 0:
            try:
                rows = json.loads(data[: cut + 1] + b"]")
                break
            except ValueError:
                cut = data.rfind(b"]", 0, cut)
        else:
            raise LogFormatError(f"{name} is not a readable memory timeline: no complete row") from None
        truncated = True
    if not isinstance(rows, list):
        raise LogFormatError(f"{name} is not a JSON list of rows")
    for number, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == 4 and all(type(v) is int for v in row)):
            raise LogFormatError(f"{name}: row {number} is {row!r}, not [time_ns, action, bytes, category]")
        if row[1] not in (1, 2, 3, 4) or not 0 <= row[3] < len(CATEGORIES):
            raise LogFormatError(f"{name}: row {number} has action {row[1]} / category {row[3]} out of range")
    return rows, truncated


def read(source: Source, *, progress: Progress) -> EventLog:
    rows, truncated = _rows(source.read_all(), source.name)
    log = EventLog(arena=False)  # built at once, then read whole
    log.truncated = truncated
    heap = HeapBuilder(log, log.add_device("GPU:0", allocator="pytorch-caching"))
    times = [row[0] for row in rows if row[0] >= 0]
    start = times[0] if times else 0
    tags = [log.intern_string(category) for category in CATEGORIES]
    preexisting = log.intern_string(PREEXISTING)
    synthetic = Unaddressed(heap)
    notes: list[str] = []
    # by size only (a version increment keeps the size); a seed takes the category of its DESTROY row
    seeds = unmatched_frees((abs(n), n) for _, action, n, _ in rows if action != _INCREMENT_VERSION)
    categories = {size: c for _, action, n, c in rows if action == _DESTROY for size in (-n,)}
    for _, size in seeds:
        synthetic.alloc(start, size, (size, categories[size]), tag=preexisting)
    if seeds:
        notes.append(f"{len(seeds)} DESTROY rows have no earlier live tensor of their size: seeded as {PREEXISTING}")
    previous = start
    pending_move: tuple[int, int] | None = None
    for number, (time_ns, action, size, category) in enumerate(rows):
        now = max(time_ns, previous)  # PREEXISTING rows (-1) at the first time; never backwards
        previous = now
        if action in (_PREEXISTING, _CREATE):
            synthetic.alloc(now, size, (size, category), tag=tags[category])
        elif action == _DESTROY:
            if not synthetic.free(now, (-size, category)) and not _free_any_category(synthetic, now, -size):
                raise LogFormatError(f"{source.name}: row {number} destroys {-size} bytes that are not live")
        elif size < 0:
            pending_move = (-size, category)
        elif pending_move is not None:
            synthetic.rekey(pending_move, (size, category))
            pending_move = None
    set_source_meta(
        log,
        format=NAME,
        file=source.name,
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
