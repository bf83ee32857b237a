"""The recording side of an EventLog: where recorders put rows, when they are flushed, and the
file they are written to.

Rows are packed (``schema.ROW_STRUCT``, no Python object per event) into the recorder's
staging object, ``staged`` (what ``EventLog.row_sink()`` hands out): ``gpuviz.log._staging.Arena``,
whose huge-page chunks the rows are written into where they stay, or a ``bytearray`` without
the C module and for logs built with ``arena=False``. A flush makes the staged rows one
immutable block (a read-only view of the arena's chunk, no copy; a ``bytes`` object taken off
a ``bytearray``) and hands it to the log (``LogData._add_block``), which splits blocks into
columns when it is read. A log recorded in memory has no crash bound to keep: its C recorders
flush only where the arena's window says, once per chunk (``Arena.set_flush``), the bytearray
and the Python recorders every ``flush_rows // 3`` events. Recording to a file
(``record_to``), each block also goes at its flush to the file's writer (``writer.LogWriter``:
with the C module, a thread of its own that holds no GIL splits, checksums and writes it while
the recording goes on), and the recorder flushes every ``flush_rows // 3`` events and every
``flush_interval_s / 2`` seconds (a background thread that sleeps in between).
``EventLog.flush()`` returns once the file holds every event so far; recorders and the
background flusher call ``flush_staged()``, which does not wait for the write.

Appending takes no lock: a row is added by one C-level call holding the GIL (``extend``, or
a C recorder's write through csrc/log/_rowsink.h), and a flush takes the staged rows in
one (``Arena.take()``; a slice and a ``del`` of a ``bytearray``), so concurrent appends are
never lost or torn. Flushes are serialised by the log's lock.

Crash bound when recording to a file: rows are on their way to the disk from the moment a
flush takes them until their write returns (two blocks at most: a flush that finds two still
to be written waits for the older, ``_batchwriter.c``), and meanwhile the recording thread
stages up to one more third. Flushing at a third of ``flush_rows`` keeps the rows not yet
written to at most ``flush_rows`` (plus one per further recording thread), and flushing every
half interval keeps their age under ``flush_interval_s``: a process killed at any moment loses
at most 4096 events and 100 ms by default, and its file has no end-of-log marker, so it loads
flagged ``truncated``.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from gpuviz.base import native as registry
from gpuviz.log.logdata import LogData
from gpuviz.log.rows import ROW_BYTES
from gpuviz.log.writer import LogWriter

__all__ = ["Recorder", "RowStaging"]

logger = logging.getLogger("gpuviz")

# rows written in place into huge-page chunks, flushed without a copy (csrc/log/_staging.c);
# where it was not built: a bytearray, one bytes object per flush
_staging = registry.load("gpuviz.log._staging")
_Arena: Callable[[], Any] | None = None if _staging is None else _staging.Arena


class RowStaging(Protocol):
    """Where recorders put rows until a flush: a ``bytearray``, or ``gpuviz.log._staging.Arena``
    (its rows written where they are kept; ``take()`` hands them out without a copy)."""

    def extend(self, data: bytes, /) -> None: ...

    def __len__(self) -> int: ...


class Recorder:
    """A log's staging object, its flush policy, and the file it records to (if any).

    ``flush_rows``: the crash bound in events when recording to a file (flushed every third
    of it); ``arena``: stage rows in ``gpuviz.log._staging.Arena``'s chunks (where built), else
    in a ``bytearray``. The log is passed to each call that moves rows into it: the recorder
    keeps no reference to it, so a log dropped by its user is freed at once."""

    def __init__(self, *, flush_rows: int, arena: bool) -> None:
        if not isinstance(flush_rows, int) or flush_rows < 3:
            raise ValueError(f"flush_rows must be an int >= 3, got {flush_rows!r}")
        self.arena = _Arena() if _Arena is not None and arena else None
        self.staged: RowStaging = self.arena if self.arena is not None else bytearray()
        self.flush_len = flush_rows // 3 * ROW_BYTES  # bytes; see the crash bound above
        self.writer: LogWriter | None = None
        self._file_error_due = False  # close() has not raised the log's file_error yet
        self._stop_flusher: threading.Event | None = None

    def flush_locked(self, log: LogData) -> None:
        """Move the staged rows into a block of ``log`` (and to the file's writer); with
        ``log``'s lock held."""
        staged = self.staged
        nbytes = len(staged)
        if not nbytes:
            return
        block: bytes | memoryview
        if self.arena is not None:
            block = self.arena.take()  # the rows where they were written
        else:
            assert isinstance(staged, bytearray)
            block = bytes(staged[:nbytes])
            del staged[:nbytes]
        first_seq = log._add_block(block)
        if self.writer is not None:  # the block stays as it is: columns are made when the log is read
            try:
                self.writer.write_rows(log, block, first_seq)
            except OSError as exc:
                self._file_failed_locked(log, exc)

    def flush(self, log: LogData) -> None:
        """``EventLog.flush``: the staged rows into a block, and into the file (waited for)."""
        with log._lock:
            if self.writer is not None:
                self.writer.recheck()  # this batch carries any change of the devices' options or meta
            self.flush_locked(log)
            if self.writer is not None:
                try:
                    self.writer.wait()
                except OSError as exc:
                    self._file_failed_locked(log, exc)

    def _file_failed_locked(self, log: LogData, exc: OSError) -> None:
        """A write to the file failed (a full disk, a file-size limit): the file is left as it
        is (it loads flagged truncated) and the log goes on recording in memory, so that the
        recorders' callers (an allocation that flushed) never see the file's error."""
        writer = self.writer
        assert writer is not None
        self.writer = None
        self._set_due()
        writer.abandon()
        log.file_error = (
            f"writing the event log to {writer.path} failed after {writer.events} events ({exc}); the file "
            f"stops there and loads flagged truncated, and recording goes on in memory: every event is "
            f"still in the log (log.save(path) writes it whole)"
        )
        self._file_error_due = True
        self.stop()
        _recording.discard(log)
        logger.error("gpuviz: %s", log.file_error)

    def _set_due(self) -> None:
        """When the arena's C recorders flush: every ``flush_rows // 3`` rows while recording to a
        file (the crash bound), only once per chunk in memory (``Arena.set_flush``)."""
        if self.arena is not None:
            self.arena.set_flush(self.flush_len if self.writer is not None else 0)

    def record_to(
        self, log: LogData, path: str | Path, *, flush_interval_s: float, flush_staged: Callable[[], None]
    ) -> None:
        """``EventLog.record_to``: write ``log`` to ``path`` from now on, its rows so far first;
        ``flush_staged`` (the log's method) is what the background flusher calls."""
        if self.writer is not None:
            raise RuntimeError(f"this log already records to {self.writer.path}")
        if not flush_interval_s > 0:
            raise ValueError(f"flush_interval_s must be > 0, got {flush_interval_s}")
        writer = LogWriter(path, log)
        with log._lock:
            columns = log._columns_locked()
            n = len(columns["seq"])
            step = self.flush_len // ROW_BYTES  # the rows so far, in batches of flush_rows // 3
            try:
                for start in range(0, n, step):
                    writer.write(log, {name: column[start : start + step] for name, column in columns.items()})
            except OSError:
                writer.abandon()
                raise
            self.writer = writer
            self._set_due()
            log.file_error, self._file_error_due = None, False
        stop = threading.Event()
        self._stop_flusher = stop
        thread = threading.Thread(
            target=_flush_periodically,
            args=(weakref.WeakMethod(flush_staged), stop, flush_interval_s / 2),
            name="gpuviz-log-flusher",
            daemon=True,
        )
        thread.start()
        _recording.add(log)

    def close(self, log: LogData) -> None:
        """``EventLog.close``: finish the file (see there)."""
        self.stop()
        with log._lock:
            self.flush_locked(log)
            if self._file_error_due:
                self._file_error_due = False
                raise OSError(f"the event log's file was not finished: {log.file_error}")
            if self.writer is not None:
                columns = log._columns_locked()
                writer, self.writer = self.writer, None
                self._set_due()
                try:
                    writer.close(log, columns)
                except OSError as exc:
                    writer.abandon()
                    log.file_error = (
                        f"finishing the event log's file {writer.path} failed ({exc}); every event is still in "
                        f"the log in memory (log.save(path) writes it whole)"
                    )
                    raise OSError(f"the event log's file was not finished: {log.file_error}") from exc
        _recording.discard(log)

    def stop(self) -> None:
        """Stop the background flusher (if any)."""
        if self._stop_flusher is not None:
            self._stop_flusher.set()


_recording: weakref.WeakSet[Any] = weakref.WeakSet()  # the EventLogs recording to a file (their close())


@atexit.register
def _close_recording_logs() -> None:
    """Finish the files of logs still recording at exit, so they load complete."""
    for log in list(_recording):
        try:
            log.close()
        except Exception:
            logger.exception("finishing the event-log file at exit failed")


def _flush_periodically(ref: weakref.WeakMethod[Callable[[], None]], stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        flush_staged = ref()
        if flush_staged is None:
            return
        try:
            flush_staged()
        except Exception:  # the flusher must never kill the process; the next flush retries
            logger.exception("flushing the event log to its file failed")
        del flush_staged
