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
so a file cut short by a crash still yields every event up to its last complete batch. Its
batches are written by ``gpuviz.log._batchwriter`` (C: the IPC messages made by hand, off the
recording thread) where it was built, by pyarrow otherwise; the two write the same batches.
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
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from gpuviz.base import native as registry
from gpuviz.base.errors import LogFormatError
from gpuviz.log.checksums import CHUNK_ROWS, batch_checksum, digest
from gpuviz.log.eventlog import DeviceInfo, EventLog
from gpuviz.log.pathlock import check_free, claim, temporary_name
from gpuviz.log.reader import ARROW_SCHEMA, read_log
from gpuviz.log.rows import ROW_BYTES, split_rows
from gpuviz.log.schema import COLUMNS, DTYPES, FORMAT_MAGIC, FORMAT_VERSION, KIND_NAMES

__all__ = ["LogWriter", "save", "load", "to_parquet", "ARROW_SCHEMA"]

logger = logging.getLogger("gpuviz")

_NAMES = tuple(name for name, _ in COLUMNS)
# the stream's batches written off the recording thread (csrc/log/_batchwriter.c); where it
# was not built: written with pyarrow by the flushing thread
_batchwriter = registry.load("gpuviz.log._batchwriter")
_BatchWriter: Any = None if _batchwriter is None else _batchwriter.BatchWriter
_RECHECK_S = 0.05  # seconds: how often a recording's devices' options and meta are compared (LogWriter._delta)
_WRITE_BUFFER = 1 << 20  # bytes: a default batch (flush_rows // 3 rows, ~111 KB) and more


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


def _empty_columns() -> list[np.ndarray]:
    return [np.empty(0, dtype=DTYPES[name]) for name in _NAMES]


def _end_marker(events: int, batches: int) -> list[tuple[bytes, bytes]]:
    """The custom metadata of the end-of-log batch (no rows): ``gpuviz.end`` = {events,
    batches before it}, and its digest."""
    text = json.dumps({"events": events, "batches": batches}).encode()
    return [(b"gpuviz.end", text), (b"gpuviz.checksum", digest(text).encode())]


def _target(path: str | Path) -> Path:
    """The file ``path`` names, symlinks followed (a link stays a link to the new file)."""
    return Path(os.path.realpath(path))


class _ArrowBatches:
    """The stream's batches written with pyarrow on the calling thread (without the C writer):
    the interface of ``gpuviz.log._batchwriter.BatchWriter``, plus ``finish``."""

    def __init__(self, file: io.FileIO, schema: pa.Schema) -> None:
        # a batch's ~30 buffers (a column and its padding each) reach the OS as one write at
        # write()'s flush: unbuffered, each was a system call of its own (twice the batch's time)
        self._file = io.BufferedWriter(file, buffer_size=_WRITE_BUFFER)
        self._stream = ipc.new_stream(self._file, schema)
        self._scratch = _empty_columns()  # submit's columns, reused from batch to batch
        self.events = 0
        self.batches = 0
        self.waits = self.waited_ns = 0  # nothing is ever in flight

    def write(self, columns: list[np.ndarray], metadata: list[tuple[bytes, bytes]]) -> None:
        self._stream.write_batch(_record(columns), custom_metadata=dict(metadata))
        self._file.flush()
        self.events += len(columns[0])
        self.batches += 1

    def submit(self, block: bytes | memoryview, first_seq: int, delta: bytes, delta_digest: bytes) -> None:
        n = len(block) // ROW_BYTES
        if len(self._scratch[0]) < n:
            self._scratch = [np.empty(max(n, 2 * len(column)), dtype=column.dtype) for column in self._scratch]
        columns = [column[:n] for column in self._scratch]
        split_rows(block, columns, first_seq)
        self.write(columns, [(b"gpuviz.delta", delta), (b"gpuviz.checksum", batch_checksum(columns, delta))])

    def wait(self) -> None:
        """Nothing is ever in flight: each batch is written by the call that makes it."""

    def finish(self) -> None:
        self._stream.close()  # Arrow's end-of-stream marker
        self._file.flush()

    def abandon(self) -> None:
        for close in (self._stream.close, self._file.close):
            with contextlib.suppress(OSError, ValueError):  # the failure that made us abandon it, again; closed
                close()


class _NativeBatches:
    """The stream's batches written by ``gpuviz.log._batchwriter.BatchWriter``: the blocks of
    rows split, checksummed and written by its own thread, which holds no GIL."""

    def __init__(self, file: io.FileIO, schema: pa.Schema) -> None:
        self._file = file
        _write_all(file, schema.serialize().to_pybytes())
        self._writer = _BatchWriter(file.fileno(), CHUNK_ROWS)
        self.write = self._writer.write
        self.submit = self._writer.submit
        self.wait = self._writer.wait

    @property
    def events(self) -> int:
        return int(self._writer.events)

    @property
    def batches(self) -> int:
        return int(self._writer.batches)

    @property
    def waits(self) -> int:
        return int(self._writer.waits)

    @property
    def waited_ns(self) -> int:
        return int(self._writer.waited_ns)

    def finish(self) -> None:
        self._writer.wait()
        _write_all(self._file, _END_OF_STREAM)

    def abandon(self) -> None:
        with contextlib.suppress(OSError):  # the failure that made us abandon it, again
            self._writer.wait()  # the writer's thread is done with the file before it closes


def _write_all(file: io.FileIO, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[file.write(view) or 0 :]


class LogWriter:
    """Writes an EventLog's batches to one file (the stream form) as they are flushed.

    ``native``: the batches of flushed blocks are written by the C writer's own thread
    (``gpuviz.log._batchwriter``, the default where it was built), so the thread that flushes
    only hands the block over; ``False``: written with pyarrow by the flushing thread. The two
    write the same file (tests/test_batchwriter.py)."""

    def __init__(self, path: str | Path, log: EventLog, *, native: bool | None = None) -> None:
        if native is None:
            native = _BatchWriter is not None
        elif native and _BatchWriter is None:
            raise RuntimeError("the C batch writer (gpuviz.log._batchwriter) was not built")
        self.path = _target(path)
        self._claim = claim(self.path)  # PathInUse while another recorder writes there
        self._file = self._claim.file  # closed in close() or abandon(); the claim released after

        self._strings = 0
        self._stacks = 0
        self._devices: list[dict[str, Any]] = []
        self._meta = "{}"
        self._pending: tuple[int, int, list[dict[str, Any]], str] = (0, 0, [], "{}")  # what _delta's batch adds
        self._recheck_at = 0.0  # time.monotonic() from which _delta looks at options and meta again
        try:
            self._batches: _ArrowBatches | _NativeBatches = (_NativeBatches if native else _ArrowBatches)(
                self._file, _schema(log)
            )
            # the header and the side tables reach the disk at once, before any event
            self.write(log, dict(zip(_NAMES, _empty_columns(), strict=True)))
        except BaseException:
            self._file.close()
            self._claim.release()
            raise

    def _delta(self, log: EventLog) -> bytes:
        """The side-table entries new since the last batch, as ``gpuviz.delta``'s JSON; the
        writer's record of what it wrote is updated once the batch is written (``_wrote``).

        New strings, stacks and devices go with the first batch after them (its rows may refer
        to them). Whether a device's options or ``log.meta`` changed is looked at once every
        ``_RECHECK_S`` at most (and on every ``recheck()``), which spares the recording thread
        two JSON encodings per batch: such a change reaches the file within the crash bound's
        interval, and the random-access form written on close holds them all."""
        strings, stacks = len(log.strings), len(log.stacks)
        now = time.monotonic()
        counts = (strings, stacks, len(log.devices))
        if counts == (self._strings, self._stacks, len(self._devices)) and now < self._recheck_at:
            return _NO_DELTA
        self._recheck_at = now + _RECHECK_S
        devices = _devices_json(log.devices)
        meta = json.dumps(log.meta, default=str, sort_keys=True)
        if strings == self._strings and stacks == self._stacks and devices == self._devices and meta == self._meta:
            return _NO_DELTA
        delta: dict[str, Any] = {"strings": log.strings[self._strings :]}
        delta["stacks"] = [[list(frame) for frame in stack] for stack in log.stacks[self._stacks :]]
        if devices != self._devices:
            delta["devices"] = devices
        if meta != self._meta:
            delta["meta"] = json.loads(meta)
        self._pending = (strings, stacks, devices, meta)
        return json.dumps(delta, default=str).encode()

    def recheck(self) -> None:
        """Look at the devices' options and ``log.meta`` for changes at the next batch."""
        self._recheck_at = 0.0

    def _wrote(self, delta: bytes) -> None:
        if delta is not _NO_DELTA:
            self._strings, self._stacks, self._devices, self._meta = self._pending

    def write(self, log: EventLog, batch: dict[str, np.ndarray]) -> None:
        """Append one batch of rows, with whatever side-table entries are new since the last one."""
        delta = self._delta(log)
        columns = [np.ascontiguousarray(batch[name]) for name in _NAMES]
        self._batches.write(columns, [(b"gpuviz.delta", delta), (b"gpuviz.checksum", batch_checksum(columns, delta))])
        self._wrote(delta)

    def write_rows(self, log: EventLog, block: bytes | memoryview, first_seq: int) -> None:
        """Append one batch made of a flushed block of packed rows (``seq`` from ``first_seq``),
        with the side-table entries new since the last batch. With the C writer the block is
        handed to its thread (which keeps it until written); without, the rows are split into
        columns the writer reuses from batch to batch (warm memory, not the log's) and written."""
        delta = self._delta(log)
        self._batches.submit(block, first_seq, delta, _NO_DELTA_DIGEST if delta is _NO_DELTA else _digest16(delta))
        self._wrote(delta)

    def wait(self) -> None:
        """Until every batch handed over is written; ``OSError`` if a write failed."""
        self._batches.wait()

    @property
    def events(self) -> int:
        """Events written to the file whole so far."""
        return self._batches.events

    @property
    def waits(self) -> int:
        """Flushes that found two blocks still to be written and waited for the older (and
        waits for all of them): how often the file held the recording up (0 without the C
        writer, which writes each batch on the flushing thread)."""
        return self._batches.waits

    @property
    def waited_ns(self) -> int:
        """How long those waits held the recording up in all, ns."""
        return self._batches.waited_ns

    def abandon(self) -> None:
        """Close the file as it is, after a write failed: no end-of-log marker, so it loads
        flagged ``truncated`` with the batches written whole before the failure."""
        self._batches.abandon()
        with contextlib.suppress(OSError, ValueError):  # the failure, again; closed
            self._file.close()
        self._claim.release()

    def close(self, log: EventLog | None = None, columns: dict[str, np.ndarray] | None = None) -> None:
        """Write the end-of-log marker and close the file; given the ``log`` and all its
        ``columns``, then replace the file by its random-access form (``save``)."""
        self._batches.wait()
        self._batches.write(_empty_columns(), _end_marker(self._batches.events, self._batches.batches))
        self._batches.finish()
        self._file.close()
        try:
            if log is not None and columns is not None:
                write_random_access(log, columns, self.path, claimed=True)
        finally:
            self._claim.release()


_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # Arrow IPC: a continuation marker and a length of 0
_NO_DELTA = json.dumps({"strings": [], "stacks": []}).encode()  # nothing new since the last batch


def _digest16(data: bytes) -> bytes:
    return digest(data).encode()


_NO_DELTA_DIGEST = _digest16(_NO_DELTA)


def write_random_access(
    log: EventLog, columns: dict[str, np.ndarray], path: str | Path, *, claimed: bool = False
) -> None:
    """Write ``log`` with these ``columns`` to ``path`` in the random-access form (one data
    batch, then the end marker), through a temporary file renamed over ``path``. Unless the
    caller is the recorder that holds ``path`` (``claimed``), ``PathInUse`` when a live
    recorder writes there."""
    path = _target(path)
    if not claimed:
        check_free(path)
    temporary = temporary_name(path)
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
            writer.write_batch(_record(_empty_columns()), custom_metadata=dict(_end_marker(len(arrays[0]), 1)))
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
