"""Packed rows (``schema.ROW_STRUCT``, as recorders stage them) into the log's columns.

``split_rows`` is the one place that turns a flushed block of rows into columns: the C pass of
``gpuviz.log._staging.split`` (one read of each row) where the module was built, one NumPy copy
per column (``ROW_DTYPE``'s view of the rows) otherwise; the two give equal columns
(tests/test_staging.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpuviz.base import native as registry
from gpuviz.log.schema import DTYPES, ROW_COLUMNS, ROW_DTYPE, ROW_STRUCT

__all__ = ["ROW_BYTES", "split_rows"]

ROW_BYTES = ROW_STRUCT.size  # one packed row, bytes

_staging = registry.load("gpuviz.log._staging")  # None where it was not built
_split: Callable[[Any, Sequence[np.ndarray], int], None] | None = None if _staging is None else _staging.split


def split_rows(block: bytes | memoryview, columns: Sequence[np.ndarray], first_seq: int) -> None:
    """Write the rows of ``block`` (whole packed rows) into ``columns``: one writable array per
    column of ``schema.DTYPES``, in that order, each exactly as long as the block has rows;
    ``seq`` counts from ``first_seq``."""
    if _split is not None:
        _split(block, columns, first_seq)
        return
    if len(columns) != len(DTYPES):
        raise ValueError(f"split: {len(DTYPES)} columns expected, got {len(columns)}")
    rows = np.frombuffer(block, dtype=ROW_DTYPE)
    columns[0][:] = np.arange(first_seq, first_seq + len(rows))
    for column, name in zip(columns[1:], ROW_COLUMNS, strict=True):
        column[:] = rows[name]
