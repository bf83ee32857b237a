"""Checks that every index of a log's columns points into its side tables.

Analysis indexes the device, string and stack tables with the log's columns; a file
written by another tool, an old file without checksums or a buggy importer could hold an
index past the end of a table, which would surface much later as an ``IndexError`` in a
view. ``index_problem`` finds the first such row before anything else sees the log.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gpuviz.log.schema import KIND_NAMES, Direction, Kind, MarkPhase

__all__ = ["index_problem"]

_STEP = 1 << 20  # rows per piece when comparing ``seq`` (bounds the temporary memory)

# flags whose meaning the schema defines, per kind (other kinds' flags are not checked)
_FLAGS: dict[int, tuple[int, ...]] = {
    Kind.MARK: tuple(int(p) for p in MarkPhase),
    Kind.TRANSFER: tuple(int(d) for d in Direction),
    Kind.PLACEMENT: (0, 1),
}


def _first_outside(column: np.ndarray, low: int, high: int) -> int | None:
    """Position of the first value outside ``[low, high)``, or None when all are inside."""
    if not len(column):
        return None
    if int(column.min()) >= low and int(column.max()) < high:
        return None
    return int(np.flatnonzero((column < low) | (column >= high))[0])


def index_problem(columns: Mapping[str, np.ndarray], *, devices: int, strings: int, stacks: int) -> str | None:
    """What is wrong with the indices of ``columns``, or None when every one is in range.

    ``devices``/``strings``/``stacks``: the sizes of the side tables. Checked: ``seq`` is
    0, 1, 2, ...; ``kind`` is a known kind; ``device`` and ``peer`` index the device table
    or are -1; ``tag`` the string table and ``stack`` the stack table or are -1; ``flags``
    of marks, transfers and placements is one of the values the schema defines.
    """
    seq = columns["seq"]
    for start in range(0, len(seq), _STEP):
        piece = seq[start : start + _STEP]
        if not np.array_equal(piece, np.arange(start, start + len(piece))):
            bad = start + int(np.flatnonzero(piece != np.arange(start, start + len(piece)))[0])
            return f"event {bad} has sequence number {int(seq[bad])} (expected {bad})"
    tables = (
        ("kind", 0, len(KIND_NAMES), "kinds"),
        ("device", -1, devices, "devices"),
        ("peer", -1, devices, "devices"),
        ("tag", -1, strings, "strings"),
        ("stack", -1, stacks, "stacks"),
    )
    for name, low, high, what in tables:
        bad_row = _first_outside(columns[name], low, high)
        if bad_row is not None:
            value = int(columns[name][bad_row])
            return f"event {bad_row} has {name} {value}, outside the {high} {what} of the log"
    kinds = columns["kind"]
    for kind, allowed in _FLAGS.items():
        rows = np.flatnonzero(kinds == kind)
        flags = columns["flags"][rows]
        outside = ~np.isin(flags, allowed)
        if outside.any():
            first = int(rows[np.flatnonzero(outside)[0]])
            return (
                f"event {first} ({KIND_NAMES[kind]}) has flags {int(columns['flags'][first])}; "
                f"a {KIND_NAMES[kind]}'s flags are one of {list(allowed)}"
            )
    return None
