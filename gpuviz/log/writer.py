"""The file writer of a recording log: its batches appended to an event-log file as it is flushed.

``LogWriter`` writes the stream form of ``arrowfile.py``'s layout: one batch per flushed block,
with the side-table entries new since the batch before (``gpuviz.delta``) and its checksums,
so a file cut short by a crash still yields every event up to its last complete batch; on
close, the end-of-log marker, then the file is replaced by its random-access form
(``arrowfile.write_random_access``). Its batches are written by ``gpuviz.log._batchwriter``
(C: the IPC messages made by hand, split, checksummed and written by a thread of its own that
holds no GIL, while the recording goes on) where it was built, by pyarrow on the flushing
thread otherwise; the two write the same batches (tests/test_batchwriter.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from gpuviz.base import native as registry
from gpuviz.log.arrowfile import (
    NAMES,
    devices_json,
    empty_columns,
    end_marker,
    file_schema,
    record_batch,
    target,
    write_random_access,
)
from gpuviz.log.checksums import CHUNK_ROWS, batch_checksum, digest
from gpuviz.log.logdata import LogData
from gpuviz.log.pathlock import claim
from gpuviz.log.rows import ROW_BYTES, split_rows

__all__ = ["LogWriter"]

# the stream's batches written off the recording thread (csrc/log/_batchwriter.c); where it
# was not built: written with pyarrow by the flushing thread
_batchwriter = registry.load("gpuviz.log._batchwriter")
_BatchWriter: Any = None if _batchwriter is None else _batchwriter.BatchWriter
_RECHECK_S = 0.05  # seconds: how often a recording's devices' options and meta are compared (LogWriter._delta)
_WRITE_BUFFER = 1 << 20  # bytes: a default batch (flush_rows // 3 rows, ~111 KB) and more


class _ArrowBatches:
    """The stream's batches written with pyarrow on the calling thread (without the C writer):
    the interface of ``gpuviz.log._batchwriter.BatchWriter``, plus ``finish``."""

    def __init__(self, file: io.FileIO, schema: pa.Schema) -> None:
        # a batch's ~30 buffers (a column and its padding each) reach the OS as one write at
        # write()'s flush: unbuffered, each was a system call of its own (twice the batch's time)
        self._file = io.BufferedWriter(file, buffer_size=_WRITE_BUFFER)
        self._stream = ipc.new_stream(self._file, schema)
        self._scratch = empty_columns()  # submit's columns, reused from batch to batch
        self.events = 0
        self.batches = 0
        self.waits = self.waited_ns = 0  # nothing is ever in flight

    def write(self, columns: list[np.ndarray], metadata: list[tuple[bytes, bytes]]) -> None:
        self._stream.write_batch(record_batch(columns), custom_metadata=dict(metadata))
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
    """Writes a log's batches to one file (the stream form) as they are flushed.

    ``native``: the batches of flushed blocks are written by the C writer's own thread
    (``gpuviz.log._batchwriter``, the default where it was built), so the thread that flushes
    only hands the block over; ``False``: written with pyarrow by the flushing thread. The two
    write the same file (tests/test_batchwriter.py)."""

    def __init__(self, path: str | Path, log: LogData, *, native: bool | None = None) -> None:
        if native is None:
            native = _BatchWriter is not None
        elif native and _BatchWriter is None:
            raise RuntimeError("the C batch writer (gpuviz.log._batchwriter) was not built")
        self.path = target(path)
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
                self._file, file_schema(log)
            )
            # the header and the side tables reach the disk at once, before any event
            self.write(log, dict(zip(NAMES, empty_columns(), strict=True)))
        except BaseException:
            self._file.close()
            self._claim.release()
            raise

    def _delta(self, log: LogData) -> bytes:
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
        devices = devices_json(log.devices)
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

    def write(self, log: LogData, batch: dict[str, np.ndarray]) -> None:
        """Append one batch of rows, with whatever side-table entries are new since the last one."""
        delta = self._delta(log)
        columns = [np.ascontiguousarray(batch[name]) for name in NAMES]
        self._batches.write(columns, [(b"gpuviz.delta", delta), (b"gpuviz.checksum", batch_checksum(columns, delta))])
        self._wrote(delta)

    def write_rows(self, log: LogData, block: bytes | memoryview, first_seq: int) -> None:
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

    def close(self, log: LogData | None = None, columns: dict[str, np.ndarray] | None = None) -> None:
        """Write the end-of-log marker and close the file; given the ``log`` and all its
        ``columns``, then replace the file by its random-access form (``save``)."""
        self._batches.wait()
        self._batches.write(empty_columns(), end_marker(self._batches.events, self._batches.batches))
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
