"""EventLog: all events of a run, as users record and read them.

An ``EventLog`` is the log itself (``logdata.LogData``: columns, side tables, queries and
views) with a recorder attached (``recorder.Recorder``: the staging object recorders write
rows into, its flush policy, and the file the log records to, if any). Views of a log (a
slice, ``filter``, ``with_columns``, ``extended``) and logs loaded from a file
(``files.load``) are ``EventLog``s without a recorder: read-only. Every read flushes the
staged rows first, so readers see every event recorded so far.

``Frame``, ``DeviceInfo``, ``Event`` and ``NO_INDEX`` live in ``tables.py`` and
``RowStaging`` in ``recorder.py``; they are importable from here as well.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuviz.base import display
from gpuviz.log.export import save, to_parquet
from gpuviz.log.logdata import LogData
from gpuviz.log.recorder import Recorder, RowStaging
from gpuviz.log.rows import ROW_BYTES
from gpuviz.log.schema import KIND_NAMES, ROW_STRUCT, MarkPhase
from gpuviz.log.tables import MAX_DEVICES, NO_INDEX, DeviceInfo, Event, Frame

__all__ = ["EventLog", "Event", "DeviceInfo", "Frame", "NO_INDEX", "MAX_DEVICES", "RowStaging", "set_renderer"]

_pack = ROW_STRUCT.pack
_MARK = KIND_NAMES.index("mark")
_READ_ONLY = "this EventLog is a read-only view (a slice, filter or loaded file)"


class EventLog(LogData):
    """All events of a run.

    ``len(log)``; ``log[i]`` -> ``Event``; ``log[a:b]`` and ``log.filter(...)`` -> a read-only
    ``EventLog`` view that keeps the original ``seq`` numbers; ``log["size"]`` -> a column.
    ``EventLog(path)`` records incrementally to an Arrow file as well.
    """

    _recorder: Recorder | None = None  # None: a view or a loaded file (read-only)

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        flush_rows: int = 4096,
        flush_interval_s: float = 0.1,
        meta: dict[str, Any] | None = None,
        arena: bool = True,
    ) -> None:
        """``flush_rows``, ``flush_interval_s``: when recording to ``path``, a crash loses at most
        this many events and this many seconds of them (``recorder.py``). ``arena``: recorders
        write rows straight into ``gpuviz.log._staging.Arena``'s chunks, growing from 512 KiB to
        8 MiB for a thread that records as it runs, and a flush hands them out where they are
        (the default); ``False`` for a log built all at once and then read whole (an import):
        rows are staged in a bytearray and flushed into blocks of exactly their size, up to two
        chunks (16 MiB) less at its peak."""
        recorder = Recorder(flush_rows=flush_rows, arena=arena)
        super().__init__(meta=meta)
        self._recorder = recorder
        if path is not None:
            self.record_to(path, flush_interval_s=flush_interval_s)

    def _writable(self) -> Recorder:
        recorder = self._recorder
        if recorder is None or self._readonly:
            raise TypeError(_READ_ONLY)
        return recorder

    # ----------------------------------------------------------------- recording
    def append(self, row: tuple[int, ...]) -> None:
        """Stage one event: the fields of ``ROW_COLUMNS`` in order (all ints)."""
        recorder = self._recorder
        if recorder is None or self._readonly:
            raise TypeError(_READ_ONLY)
        staged = recorder.staged
        staged.extend(_pack(*row))
        if len(staged) >= recorder.flush_len:
            self.flush_staged()

    def row_sink(self) -> tuple[RowStaging, int]:
        """The staging object (``extend(rows)``, ``len()`` in bytes; C recorders write into it
        through csrc/log/_rowsink.h) and its flush threshold in bytes, for recorders that pack
        rows themselves (``ROW_STRUCT``) and call ``flush_staged()`` once it reaches the threshold."""
        recorder = self._writable()
        return recorder.staged, recorder.flush_len

    def mark(self, label: str, *, phase: MarkPhase = MarkPhase.POINT, time_ns: int | None = None) -> None:
        """Record a ``mark`` event (a user or front-end annotation) with ``label`` as its tag."""
        self._writable()
        tag = self.intern_string(str(label))
        now = time.perf_counter_ns() if time_ns is None else time_ns
        self.append((now, _MARK, int(phase), NO_INDEX, NO_INDEX, threading.get_ident(), 0, 0, 0, -1, -1, 0, tag, -1))

    def flush(self) -> None:
        """Move the staged rows into a block, and when recording to a file, write them there:
        once it returns, the file holds every event recorded so far."""
        if self._recorder is not None:
            self._recorder.flush(self)

    def flush_staged(self) -> None:
        """Move the staged rows into a block and hand it to the file's writer (when recording
        to one) without waiting for the write: what recorders call when the staged rows reach
        ``row_sink()``'s threshold, and the background flusher every half interval. The
        writer's thread writes the block while the recording thread goes on."""
        if self._recorder is not None:
            with self._lock:
                self._recorder.flush_locked(self)

    def _settle_locked(self) -> None:
        if self._recorder is not None:
            self._recorder.flush_locked(self)

    def __len__(self) -> int:
        recorder = self._recorder
        return self._n_flushed + (len(recorder.staged) // ROW_BYTES if recorder is not None else 0)

    def record_to(self, path: str | Path, *, flush_interval_s: float = 0.1) -> None:
        """Also write this log to ``path`` (Arrow IPC stream), flushing at least every interval.

        Events already recorded are written first, so the file always holds the whole log.
        """
        self._writable().record_to(self, path, flush_interval_s=flush_interval_s, flush_staged=self.flush_staged)

    def close(self) -> None:
        """Finish the file this log records to (no-op when not recording to a file).

        Flushes, writes the end-of-log marker and replaces the file by its random-access
        form (the whole log as one batch, memory-mapped by ``load``). A log still recording
        when the interpreter exits is closed then.

        Raises ``OSError`` with ``file_error`` (once) when writing the file failed while
        recording; the log in memory holds every event all the same.
        """
        if self._recorder is not None:
            self._recorder.close(self)

    def __del__(self) -> None:
        recorder = self.__dict__.get("_recorder")
        if recorder is not None:
            recorder.stop()

    def _check_writable(self) -> None:
        self._writable()

    # ---------------------------------------------------------------------- files
    def save(self, path: str | Path) -> None:
        """Write the whole log to ``path`` as a gpuviz Arrow IPC file (the random-access form)."""
        save(self, path)

    def to_parquet(self, path: str | Path) -> None:
        """Write the events (with names decoded) as a Parquet file for big-data tools."""
        to_parquet(self, path)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """Rich display (a static summary) when the views layer registered a renderer."""
        if not _renderers:
            display.load("EventLog")  # the views that render it, imported at the first display
        if _renderers:
            return _renderers[0](self)
        return {"text/plain": repr(self)}


_renderers: list[Callable[[EventLog], dict[str, Any]]] = []


def set_renderer(render: Callable[[EventLog], dict[str, Any]]) -> None:
    """Register how an EventLog displays in notebooks (the views layer does, at import);
    the log layer itself never imports views."""
    _renderers[:] = [render]
