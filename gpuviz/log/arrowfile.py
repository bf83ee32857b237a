"""The gpuviz event-log file: Apache Arrow IPC, format version 2 (docs/file-format.md).

Layout (format version 2):
    schema metadata   ``gpuviz.magic`` = "gpuviz-eventlog", ``gpuviz.format_version`` = "2",
                      ``gpuviz.header`` = JSON {clock, units, created_unix_ns, gpuviz_version,
                      devices, meta}, ``gpuviz.header_checksum`` = digest of that JSON text
    data batches      the columns of ``schema.COLUMNS``; custom metadata ``gpuviz.delta`` =
                      JSON {strings: [new strings], stacks: [new stacks], devices: [all
                      devices, when changed], meta: {..., when changed}} and
                      ``gpuviz.checksum`` = JSON {rows, chunk_rows, chunks: [digest of each
                      chunk's column bytes], delta: digest of the delta} (``checksums.py``)
    end marker        a batch of no rows whose custom metadata ``gpuviz.end`` = JSON
                      {events, batches} (and its digest as ``gpuviz.checksum``), written on
                      close: a file without it was cut short

Two forms share that layout. While recording (``writer.LogWriter``) the file is an Arrow IPC
*stream*, one batch per flush, each self-contained together with the batches before it, so a
file cut short by a crash still yields every event up to its last complete batch. On close,
and by ``save``, the file is replaced by the *random-access* form (``write_random_access``
here): an Arrow IPC file (``ARROW1`` magic, the same stream, a footer) whose events are one
batch, which ``files.load`` memory-maps and hands to the log as zero-copy NumPy views.

This module holds the pieces of that layout that the writers and the reader share.
Writers never rewrite a file in place: they write a new file and rename it over the old
one (or remove the old name first), so a log loaded earlier from that path, whose columns
are views of the old file's mapping, stays valid.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from gpuviz.log.checksums import batch_checksum, digest
from gpuviz.log.logdata import LogData
from gpuviz.log.pathlock import check_free, temporary_name
from gpuviz.log.schema import COLUMNS, DTYPES, FORMAT_MAGIC, FORMAT_VERSION
from gpuviz.log.tables import DeviceInfo

__all__ = ["ARROW_SCHEMA", "NAMES", "write_random_access"]

ARROW_SCHEMA = pa.schema([pa.field(name, pa.from_numpy_dtype(np.dtype(dt)), nullable=False) for name, dt in COLUMNS])
"""The columns of every batch (``schema.COLUMNS``), without the file's metadata."""

NAMES = tuple(name for name, _ in COLUMNS)


def _gpuviz_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpuviz")
    except PackageNotFoundError:
        return "unknown"


def devices_json(devices: list[DeviceInfo]) -> list[dict[str, Any]]:
    return [{"name": d.name, "options": d.options} for d in devices]


def file_schema(log: LogData) -> pa.Schema:
    """``ARROW_SCHEMA`` with the version-2 metadata: magic, version, header and its digest."""
    header = {
        "clock": "time.perf_counter_ns (monotonic)",
        "units": {"time": "ns", "size": "bytes", "address": "bytes"},
        "created_unix_ns": time.time_ns(),
        "gpuviz_version": _gpuviz_version(),
        "devices": devices_json(log.devices),
        "meta": log.meta,
    }
    text = json.dumps(header, default=str).encode()
    metadata: dict[str | bytes, str | bytes] = {
        "gpuviz.magic": FORMAT_MAGIC,
        "gpuviz.format_version": str(FORMAT_VERSION),
        "gpuviz.header": text,
        "gpuviz.header_checksum": digest(text),
    }
    return ARROW_SCHEMA.with_metadata(metadata)


def record_batch(columns: list[np.ndarray]) -> pa.RecordBatch:
    # each column's buffer as it is (every column is a fixed-width integer): no copy, and unlike
    # pa.array no check for a pandas object, which would import pandas (even at interpreter exit,
    # where a log still recording is finished and importing pandas fails)
    arrays = [
        pa.Array.from_buffers(
            field.type,
            len(column),
            [None, pa.py_buffer(np.ascontiguousarray(column, field.type.to_pandas_dtype()).data)],
        )
        for field, column in zip(ARROW_SCHEMA, columns, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def empty_columns() -> list[np.ndarray]:
    return [np.empty(0, dtype=DTYPES[name]) for name in NAMES]


def end_marker(events: int, batches: int) -> list[tuple[bytes, bytes]]:
    """The custom metadata of the end-of-log batch (no rows): ``gpuviz.end`` = {events,
    batches before it}, and its digest."""
    text = json.dumps({"events": events, "batches": batches}).encode()
    return [(b"gpuviz.end", text), (b"gpuviz.checksum", digest(text).encode())]


def target(path: str | Path) -> Path:
    """The file ``path`` names, symlinks followed (a link stays a link to the new file)."""
    return Path(os.path.realpath(path))


def write_random_access(
    log: LogData, columns: dict[str, np.ndarray], path: str | Path, *, claimed: bool = False
) -> None:
    """Write ``log`` with these ``columns`` to ``path`` in the random-access form (one data
    batch, then the end marker), through a temporary file renamed over ``path``. Unless the
    caller is the recorder that holds ``path`` (``claimed``), ``PathInUse`` when a live
    recorder writes there."""
    path = target(path)
    if not claimed:
        check_free(path)
    temporary = temporary_name(path)
    arrays = [np.ascontiguousarray(columns[name]) for name in NAMES]
    delta: dict[str, Any] = {
        "strings": list(log.strings),
        "stacks": [[list(frame) for frame in stack] for stack in log.stacks],
        "devices": devices_json(log.devices),
        "meta": json.loads(json.dumps(log.meta, default=str, sort_keys=True)),
    }
    text = json.dumps(delta, default=str).encode()
    try:
        with pa.OSFile(str(temporary), "wb") as sink, ipc.new_file(sink, file_schema(log)) as writer:
            custom = {b"gpuviz.delta": text, b"gpuviz.checksum": batch_checksum(arrays, text)}
            writer.write_batch(record_batch(arrays), custom_metadata=custom)
            writer.write_batch(record_batch(empty_columns()), custom_metadata=dict(end_marker(len(arrays[0]), 1)))
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
