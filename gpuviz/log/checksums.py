"""Checksums of the event-log file (format version 2): what the writer stores, the reader verifies.

A digest is XXH3-64 (``xxhash``, ~10 GB/s here; CRC-32 from ``zlib`` reads ~0.6 GB/s on
this machine, too slow to verify a 10M-event log in well under a second), written as 16
hex digits. A batch's digest covers, per chunk of at most ``CHUNK_ROWS`` rows, the bytes
of every column's rows in file order, so a damaged chunk ends the readable prefix exactly
where the damage is, and the prefix before it is still verified.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

__all__ = ["CHUNK_ROWS", "digest", "chunk_digests", "batch_checksum", "verified_rows"]

CHUNK_ROWS = 1 << 16
"""Rows per checksummed chunk of a batch (a batch of fewer rows is one chunk)."""


def digest(data: bytes | memoryview) -> str:
    """The XXH3-64 digest of ``data`` as 16 hex digits."""
    return xxhash.xxh3_64_hexdigest(data)


def chunk_digests(columns: Sequence[np.ndarray], rows: int, chunk_rows: int = CHUNK_ROWS) -> list[str]:
    """One digest per chunk of ``chunk_rows`` rows over the bytes of all ``columns`` (in order)."""
    digests = []
    for start in range(0, rows, chunk_rows):
        end = min(start + chunk_rows, rows)
        state = xxhash.xxh3_64()
        for column in columns:
            state.update(np.ascontiguousarray(column[start:end]).data.cast("B"))
        digests.append(state.hexdigest())
    return digests


def batch_checksum(columns: Sequence[np.ndarray], delta: bytes, chunk_rows: int = CHUNK_ROWS) -> bytes:
    """The ``gpuviz.checksum`` custom metadata of a batch: rows, chunk size, chunk and delta digests."""
    rows = len(columns[0]) if columns else 0
    record = {
        "rows": rows,
        "chunk_rows": chunk_rows,
        "chunks": chunk_digests(columns, rows, chunk_rows),
        "delta": digest(delta),
    }
    return json.dumps(record).encode()


def verified_rows(columns: Sequence[np.ndarray], delta: bytes, checksum: bytes) -> tuple[int, str | None]:
    """How many leading rows of a batch its checksum confirms, and what is wrong (None if nothing).

    A damaged delta or checksum record confirms no row; a damaged chunk confirms the rows of
    the chunks before it.
    """
    try:
        record: Any = json.loads(checksum)
        rows, chunk_rows, chunks, delta_digest = (
            record["rows"],
            record["chunk_rows"],
            record["chunks"],
            record["delta"],
        )
        if not (isinstance(rows, int) and isinstance(chunk_rows, int) and chunk_rows > 0 and isinstance(chunks, list)):
            raise TypeError("malformed fields")
    except (ValueError, KeyError, TypeError) as exc:
        return 0, f"its checksum record is damaged ({type(exc).__name__}: {exc})"
    if digest(delta) != delta_digest:
        return 0, "its side-table entries do not match their checksum"
    actual = len(columns[0]) if columns else 0
    if actual != rows or len(chunks) != -(-rows // chunk_rows):
        return 0, f"it holds {actual} rows where its checksum record says {rows}"
    for index, (found, expected) in enumerate(zip(chunk_digests(columns, rows, chunk_rows), chunks, strict=True)):
        if found != expected:
            start = index * chunk_rows
            return start, f"rows {start}-{min(start + chunk_rows, rows) - 1} of it do not match their checksum"
    return rows, None
