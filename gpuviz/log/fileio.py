"""The gpuviz event-log file: Apache Arrow IPC, format version 2.

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

Two forms share that layout. While recording (``LogWriter``) the file is an Arrow IPC
*stream*, one batch per flush, each self-contained together with the batches before it,
so a file cut short by a crash still yields every event up to its last complete batch.
On close, and by ``save``, the file is replaced by the *random-access* form: an Arrow IPC
file (``ARROW1`` magic, the same stream, a footer) whose events are one batch, which
``load`` memory-maps and hands to the log as zero-copy NumPy views.

Writers never rewrite a file in place: they write a new file and rename it over the old
one (or remove the old name first), so a log loaded earlier from that path, whose columns
are views of the old file's mapping, stays valid.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from gpuviz.base.errors import LogFormatError
from gpuviz.log.checksums import batch_checksum, digest
from gpuviz.log.eventlog import DeviceInfo, EventLog
from gpuviz.log.reader import ARROW_SCHEMA, read_log
from gpuviz.log.rows import ROW_BYTES, split_rows
from gpuviz.log.schema import COLUMNS, DTYPES, FORMAT_MAGIC, FORMAT_VERSION, KIND_NAMES

__all__ = ["LogWriter", "save", "load", "to_parquet", "ARROW_SCHEMA"]

logger = logging.getLogger("gpuviz")

_NAMES = tuple(name for name, _ in COLUMNS)
_WRITE_BUFFER = 1 << 20  # bytes: a default batch (flush_rows // 2 rows, ~166 KB) and more


def _gpuviz_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpuviz")
    except PackageNotFoundError:
        return "unknown"


def _devices_json(devices: list[DeviceInfo]) -> list[dict[str, Any]]:
    return [{"name": d.name, "options": d.options} for d in devices]


def _schema(log: EventLog) -> pa.Schema:
    """``ARROW_SCHEMA`` with the version-2 metadata: magic, version, header and its digest."""
    header = {
        "clock": "time.perf_counter_ns (monotonic)",
        "units": {"time": "ns", "size": "bytes", "address": "bytes"},
        "created_unix_ns": time.time_ns(),
        "gpuviz_version": _gpuviz_version(),
        "devices": _devices_json(log.devices),
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


def _record(columns: list[np.ndarray]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(column) for column in columns], schema=ARROW_SCHEMA)


def _end_marker(events: int, batches: int) -> tuple[pa.RecordBatch, dict[bytes, bytes]]:
    """The end-of-log batch: no rows, ``gpuviz.end`` = {events, batches before it}."""
    text = json.dumps({"events": events, "batches": batches}).encode()
    empty = _record([np.empty(0, dtype=DTYPES[name]) for name in _NAMES])
    return empty, {b"gpuviz.end": text, b"gpuviz.checksum": digest(text).encode()}


def _target(path: str | Path) -> Path:
    """The file ``path`` names, symlinks followed (a link stays a link to the new file)."""
    return Path(os.path.realpath(path))


def _remove_old(path: Path) -> None:
    """Remove ``path`` (if it is a file) so that a new file gets a new inode: a log loaded
    from the old file keeps its memory mapping intact."""
    if path.is_file():
        path.unlink()


class LogWriter:
    """Writes an EventLog's batches to one file (the stream form) as they are flushed."""

    def __init__(self, path: str | Path, log: EventLog) -> None:
        self.path = _target(path)
        _remove_old(self.path)
        # a batch's ~30 buffers (a column and its padding each) reach the OS as one write at
        # write()'s flush: unbuffered, each was a system call of its own (twice the batch's time)
        self._file = io.BufferedWriter(io.FileIO(self.path, "w"), buffer_size=_WRITE_BUFFER)  # closed in close()
        self._strings = 0
        self._stacks = 0
        self._devices: list[dict[str, Any]] = []
        self._meta = "{}"
        self._events = 0
        self._batches = 0
        self._scratch = [np.empty(0, dtype=DTYPES[name]) for name in _NAMES]  # write_rows' columns, reused
        self._stream = ipc.new_stream(self._file, _schema(log))
        # the header and the side tables reach the disk at once, before any event
        self.write(log, {name: np.empty(0, dtype=dt) for name, dt in DTYPES.items()})

    def _delta(self, log: EventLog) -> tuple[bytes, list[dict[str, Any]], str]:
        delta: dict[str, Any] = {"strings": log.strings[self._strings :]}
        delta["stacks"] = [[list(frame) for frame in stack] for stack in log.stacks[self._stacks :]]
        devices = _devices_json(log.devices)
        if devices != self._devices:
            delta["devices"] = devices
        meta = json.dumps(log.meta, default=str, sort_keys=True)
        if meta != self._meta:
            delta["meta"] = json.loads(meta)
        return json.dumps(delta, default=str).encode(), devices, meta

    def write(self, log: EventLog, batch: dict[str, np.ndarray]) -> None:
        """Append one batch of rows, with whatever side-table entries are new since the last one."""
        strings, stacks = len(log.strings), len(log.stacks)
        delta, devices, meta = self._delta(log)
        columns = [np.ascontiguousarray(batch[name]) for name in _NAMES]
        custom = {b"gpuviz.delta": delta, b"gpuviz.checksum": batch_checksum(columns, delta)}
        self._stream.write_batch(_record(columns), custom_metadata=custom)
        self._file.flush()
        self._strings, self._stacks = strings, stacks
        self._devices = devices
        self._meta = meta
        self._events += len(columns[0])
        self._batches += 1

    def write_rows(self, log: EventLog, block: bytes | memoryview, first_seq: int) -> None:
        """Append one batch made of a flushed block of packed rows (``seq`` from ``first_seq``):
        the rows are split into columns this writer reuses from batch to batch (warm memory, not
        the log's), so the recording thread that flushes pays for no new pages."""
        n = len(block) // ROW_BYTES
        if len(self._scratch[0]) < n:
            self._scratch = [np.empty(max(n, 2 * len(column)), dtype=column.dtype) for column in self._scratch]
        columns = [column[:n] for column in self._scratch]
        split_rows(block, columns, first_seq)
        self.write(log, dict(zip(_NAMES, columns, strict=True)))

    @property
    def events(self) -> int:
        """Events written to the file so far."""
        return self._events

    def abandon(self) -> None:
        """Close the file as it is, after a write failed: no end-of-log marker, so it loads
        flagged ``truncated`` with the batches written whole before the failure."""
        for close in (self._stream.close, self._file.close):
            with contextlib.suppress(OSError, ValueError):  # the failure that made us abandon it, again; closed
                close()

    def close(self, log: EventLog | None = None, columns: dict[str, np.ndarray] | None = None) -> None:
        """Write the end-of-log marker and close the file; given the ``log`` and all its
        ``columns``, then replace the file by its random-access form (``save``)."""
        record, custom = _end_marker(self._events, self._batches)
        self._stream.write_batch(record, custom_metadata=custom)
        self._stream.close()
        self._file.close()
        if log is not None and columns is not None:
            write_random_access(log, columns, self.path)


def write_random_access(log: EventLog, columns: dict[str, np.ndarray], path: str | Path) -> None:
    """Write ``log`` with these ``columns`` to ``path`` in the random-access form (one data
    batch, then the end marker), through a temporary file renamed over ``path``."""
    path = _target(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    arrays = [np.ascontiguousarray(columns[name]) for name in _NAMES]
    delta: dict[str, Any] = {
        "strings": list(log.strings),
        "stacks": [[list(frame) for frame in stack] for stack in log.stacks],
        "devices": _devices_json(log.devices),
        "meta": json.loads(json.dumps(log.meta, default=str, sort_keys=True)),
    }
    text = json.dumps(delta, default=str).encode()
    try:
        with pa.OSFile(str(temporary), "wb") as sink, ipc.new_file(sink, _schema(log)) as writer:
            custom = {b"gpuviz.delta": text, b"gpuviz.checksum": batch_checksum(arrays, text)}
            writer.write_batch(_record(arrays), custom_metadata=custom)
            record, end = _end_marker(len(arrays[0]), 1)
            writer.write_batch(record, custom_metadata=end)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def save(log: EventLog, path: str | Path) -> None:
    """Write ``log`` to ``path`` (replacing it) in the random-access form."""
    write_random_access(log, log.columns, path)


def load(path: str | Path) -> EventLog:
    """Read a gpuviz event-log file (format version 1 or 2), memory-mapped.

    Raises ``LogFormatError`` with the reason when the file is not a gpuviz log, has another
    format version, has a damaged header, or holds an index outside its side tables;
    ``OSError`` when it cannot be opened. A file cut short (a crashed recorder) or damaged
    after its header loads up to its last intact batch (or checksummed chunk): the log then
    has ``truncated == True``, ``corrupt == True`` when damage (not only a cut) ended it,
    and ``problems`` says where.
    """
    path = Path(path)
    if path.is_file() and path.stat().st_size == 0:
        raise LogFormatError(f"{path} is not a gpuviz event log (it is empty, truncated before its header)")
    buffer = pa.memory_map(str(path)).read_buffer()  # OSError for a missing or unreadable file
    try:
        log = read_log(buffer, str(path))
    except LogFormatError:
        raise
    except Exception as exc:  # whatever damage made the reader trip on: a clear error naming the file
        raise LogFormatError(f"{path} cannot be read as a gpuviz event log ({type(exc).__name__}: {exc})") from None
    for problem in log.problems:
        logger.warning("%s: %s", path, problem)
    return log


_NAME_INDEX: dict[str, Any] = {"kind": pa.int8(), "device": pa.int16(), "peer": pa.int16(), "tag": pa.int32()}
PARQUET_SCHEMA = pa.schema(
    [
        pa.field(name, pa.dictionary(_NAME_INDEX[name], pa.string()))
        if name in _NAME_INDEX
        else pa.field(name, pa.from_numpy_dtype(DTYPES[name]))
        for name, _ in COLUMNS
    ]
)
"""The columns of ``to_parquet``: those of the log, with ``kind``, ``device``, ``peer`` and ``tag``
decoded to their names (dictionary-encoded strings; null where the log has -1). The same for
every log, so the files of many logs form one dataset."""


def _decoded(codes: np.ndarray, names: Sequence[str], index: pa.DataType) -> pa.Array[Any]:
    indices = codes.astype(np.dtype(index.to_pandas_dtype()))
    return pa.DictionaryArray.from_arrays(indices, pa.array(list(names), type=pa.string()), mask=codes < 0)


def to_parquet(log: EventLog, path: str | Path) -> None:
    """Write the events as Parquet (``PARQUET_SCHEMA``: names decoded), with the devices and
    format version as metadata."""
    import pyarrow.parquet as pq

    cols = log.columns
    tables = {"kind": KIND_NAMES, "device": log.device_names, "peer": log.device_names, "tag": log.strings}
    arrays = [
        _decoded(cols[field.name], tables[field.name], field.type.index_type)
        if field.name in tables
        else pa.array(cols[field.name], type=field.type)
        for field in PARQUET_SCHEMA
    ]
    extra = {
        "gpuviz.magic": FORMAT_MAGIC,
        "gpuviz.format_version": str(FORMAT_VERSION),
        "gpuviz.devices": json.dumps(_devices_json(log.devices), default=str),
    }
    table = pa.Table.from_arrays(arrays, schema=PARQUET_SCHEMA.with_metadata(extra))
    pq.write_table(table, path)
