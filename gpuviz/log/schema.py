"""The single source of truth for event kinds, columns and the file format version.

Every event is one row. Columns and their meaning per kind:

=============  =====================================================================
column         meaning
=============  =====================================================================
seq            sequence number: position in the whole log (kept by filtered views)
time_ns        monotonic clock (``time.perf_counter_ns``), nanoseconds
kind           one of ``Kind``
flags          per kind: mark -> ``MarkPhase``; transfer -> ``Direction``;
               placement -> 1 when soft placement moved the op, else 0
device         index into the log's device table (the device the event happened on;
               for transfers the source device)
peer           index into the device table: transfer destination, placement's
               requested device; -1 when not applicable
thread         ``threading.get_ident()`` of the recording thread
address        chunk address (alloc/free/split/merge), segment base
               (segment_alloc/free), start of the mapped or unmapped range
               (segment_map/unmap); 0 when not applicable
size           bytes: chunk size (alloc/free), size of the first part after a split,
               merged size (merge), segment size, bytes mapped or unmapped
               (segment_map/unmap), rounded request (oom),
               transferred bytes (transfer)
requested      bytes the caller asked for (alloc/free/oom), else 0
segment        base address of the segment holding the chunk, -1 when not applicable
largest_free   largest free chunk of the device's pool right after the event
               (allocator events), -1 when not applicable; exactly what replay finds
               at that event (a split's first part counts as free until its alloc)
duration_ns    transfer or op duration in nanoseconds, else 0
tag            index into the string table (op name, scope, label, dtype/shape), -1 none
stack          index into the stack table, -1 when stacks are off
=============  =====================================================================

Event kinds (design.md): a split of the chunk at ``address`` leaves it with ``size``
bytes and makes the remainder, at ``address + size``, a new free chunk; a merge leaves
the chunk at ``address`` with ``size`` bytes, absorbing its free upper neighbour.

Segments that grow and shrink (PyTorch's expandable segments): a ``segment_map`` of
``[address, address + size)`` adds that range as one free chunk; where a segment of the
device ends at ``address`` or starts at ``address + size`` the ranges join into one segment
(the lower segment's base is the joined one's; ``segment`` is that base). Free chunks at a
seam are then coalesced by ``merge`` events. A ``segment_unmap`` of ``[address, address +
size)`` removes exactly one free chunk; what remains of its segment below and above becomes
one or two segments (``segment`` is the base before). The kinds' codes are appended to the
older ones, so logs written before they existed read unchanged.
"""

from __future__ import annotations

import struct
from enum import IntEnum

import numpy as np

__all__ = [
    "Kind",
    "KIND_NAMES",
    "MarkPhase",
    "Direction",
    "COLUMNS",
    "ROW_COLUMNS",
    "DTYPES",
    "ROW_STRUCT",
    "ROW_DTYPE",
    "FORMAT_MAGIC",
    "FORMAT_VERSION",
    "kind_code",
]

FORMAT_MAGIC = "gpuviz-eventlog"
FORMAT_VERSION = 2


class Kind(IntEnum):
    SEGMENT_ALLOC = 0
    SEGMENT_FREE = 1
    ALLOC = 2
    FREE = 3
    SPLIT = 4
    MERGE = 5
    OOM = 6
    TRANSFER = 7
    PLACEMENT = 8
    MARK = 9
    SEGMENT_MAP = 10
    SEGMENT_UNMAP = 11


KIND_NAMES: tuple[str, ...] = tuple(k.name.lower() for k in Kind)


class MarkPhase(IntEnum):
    POINT = 0
    BEGIN = 1
    END = 2


class Direction(IntEnum):
    H2D = 1
    D2H = 2
    D2D = 3


# (name, numpy dtype) in file order. ``seq`` is assigned when rows are flushed; the
# other columns are the fields of one staged row, in ROW_COLUMNS order.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("seq", "int64"),
    ("time_ns", "int64"),
    ("kind", "uint8"),
    ("flags", "int8"),
    ("device", "int16"),
    ("peer", "int16"),
    ("thread", "int64"),
    ("address", "int64"),
    ("size", "int64"),
    ("requested", "int64"),
    ("segment", "int64"),
    ("largest_free", "int64"),
    ("duration_ns", "int64"),
    ("tag", "int32"),
    ("stack", "int32"),
)
ROW_COLUMNS: tuple[str, ...] = tuple(name for name, _ in COLUMNS[1:])
DTYPES: dict[str, np.dtype] = {name: np.dtype(dt) for name, dt in COLUMNS}


def kind_code(kind: str | Kind | int) -> int:
    """Kind code for a kind name (``"alloc"``), a ``Kind`` or an int; ``ValueError`` otherwise."""
    if isinstance(kind, str):
        try:
            return KIND_NAMES.index(kind)
        except ValueError:
            raise ValueError(f"unknown event kind {kind!r}; kinds are {', '.join(KIND_NAMES)}") from None
    code = int(kind)
    if not 0 <= code < len(KIND_NAMES):
        raise ValueError(f"unknown event kind code {code}")
    return code


# One staged row: the ROW_COLUMNS packed little-endian without padding. ``ROW_STRUCT``
# packs a row on the recording path; ``ROW_DTYPE`` reads packed rows back as columns.
_FORMAT_CODES = {"int64": "q", "uint8": "B", "int8": "b", "int16": "h", "int32": "i"}
ROW_STRUCT = struct.Struct("<" + "".join(_FORMAT_CODES[dt] for _, dt in COLUMNS[1:]))
ROW_DTYPE = np.dtype([(name, "<" + np.dtype(dt).str[1:]) for name, dt in COLUMNS[1:]])
assert ROW_DTYPE.itemsize == ROW_STRUCT.size
