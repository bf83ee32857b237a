"""EventLog: all events of a run, columnar, plus side tables (devices, strings, stacks).

Rows are packed (``schema.ROW_STRUCT``, no Python object per event) into the log's staging
object, ``row_sink()``: ``gpuviz.log._staging.Arena``, whose huge-page chunks (mapped by the
recording thread as it needs them) the rows are written into where they stay, or a ``bytearray``
without the C module and for logs built with ``arena=False``. On ``flush()``, at every read,
and, when recording to a file, every ``flush_rows // 3`` events and every
``flush_interval_s / 2`` seconds (a background thread), the staged rows become one immutable
block (a read-only view of the arena's chunk, no copy; a ``bytes`` object taken off a
``bytearray``); blocks are split into NumPy columns when the log is read
(``rows.split_rows``). A log recorded in memory has no crash bound to keep: its C recorders
flush only where the arena's window says, once per chunk (``Arena.set_flush``), the
bytearray and the Python recorders every ``flush_rows // 3`` events. A log recording to a file hands each
block at its flush to the file's writer (``fileio.LogWriter``: with the C module, a thread of
its own that holds no GIL splits, checksums and writes it while the recording goes on) and
keeps the block as it is, like a log recorded in memory. ``flush()`` returns once the file
holds every event so far; recorders and the background flusher call ``flush_staged()``,
which does not wait for the write.
Columns grow by doubling their capacity, so a reader that comes back (a live view) pays
only for the rows added since, and the arrays it got earlier never change.
Readers see flushed and staged rows alike: every read flushes first.

Appending takes no lock: a row is added by one C-level call holding the GIL (``extend``, or
a C recorder's write through csrc/log/_rowsink.h), and a flush takes the staged rows in
one (``Arena.take()``; a slice and a ``del`` of a ``bytearray``), so concurrent appends are
never lost or torn.
Flushes are serialised by the log's lock.

Crash bound when recording to a file: rows are on their way to the disk from the moment a
flush takes them until their write returns (two blocks at most: a flush that finds two still
to be written waits for the older, ``_batchwriter.c``), and meanwhile the recording thread
stages up to one more third. Flushing at a third of ``flush_rows`` keeps the rows not yet
written to at most ``flush_rows`` (plus one per further recording thread), and flushing every half interval
keeps their age under ``flush_interval_s``: a process killed at any moment loses at most
4096 events and 100 ms by default, and its file has no end-of-log marker, so it loads
flagged ``truncated``.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from gpuviz.base import display
from gpuviz.base import native as registry
from gpuviz.log.rows import split_rows
from gpuviz.log.schema import COLUMNS, DTYPES, KIND_NAMES, ROW_COLUMNS, ROW_DTYPE, ROW_STRUCT, MarkPhase, kind_code
from gpuviz.log.strings import StringTable

# rows written in place into huge-page chunks, flushed without a copy (csrc/log/_staging.c);
# where it was not built: a bytearray, one bytes object per flush
_staging = registry.load("gpuviz.log._staging")
_Arena: Callable[[], Any] | None = None if _staging is None else _staging.Arena


class RowStaging(Protocol):
    """Where recorders put rows until a flush: a ``bytearray``, or ``gpuviz.log._staging.Arena``
    (its rows written where they are kept; ``take()`` hands them out without a copy)."""

    def extend(self, data: bytes, /) -> None: ...

    def __len__(self) -> int: ...


if TYPE_CHECKING:
    import pandas as pd

    from gpuviz.log.fileio import LogWriter

__all__ = ["EventLog", "Event", "DeviceInfo", "Frame", "NO_INDEX"]

NO_INDEX = -1
logger = logging.getLogger("gpuviz")
_ROW = ROW_STRUCT.size
_pack = ROW_STRUCT.pack
_MARK = KIND_NAMES.index("mark")


class Frame(NamedTuple):
    """One frame of a recorded Python stack."""

    filename: str
    lineno: int
    function: str


@dataclass(frozen=True)
class DeviceInfo:
    """A device of the log: its name (``"GPU:0"``) and the options of its allocator."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)


class Event(NamedTuple):
    """One event, decoded for reading (names instead of table indices)."""

    seq: int
    time_ns: int
    kind: str
    flags: int
    device: str | None
    peer: str | None
    thread: int
    address: int
    size: int
    requested: int
    segment: int
    largest_free: int
    duration_ns: int
    tag: str | None
    stack: int


MAX_DEVICES = 32_767
"""The most devices one log holds: device indexes are stored as int16."""


class EventLog:
    """All events of a run.

    ``len(log)``; ``log[i]`` -> ``Event``; ``log[a:b]`` and ``log.filter(...)`` -> a read-only
    ``EventLog`` view that keeps the original ``seq`` numbers; ``log["size"]`` -> a column.
    ``EventLog(path)`` records incrementally to an Arrow file as well.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        flush_rows: int = 4096,
        flush_interval_s: float = 0.1,
        meta: dict[str, Any] | None = None,
        arena: bool = True,
    ) -> None:
        """``arena``: recorders write rows straight into ``gpuviz.log._staging.Arena``'s chunks,
        growing from 512 KiB to 8 MiB for a thread that records as it runs, and a flush hands them
        out where they are (the default); ``False`` for a log built all at once and then read
        whole (an import): rows are staged in a bytearray and flushed into blocks of exactly
        their size, up to two chunks (16 MiB) less at its peak."""
        if not isinstance(flush_rows, int) or flush_rows < 3:
            raise ValueError(f"flush_rows must be an int >= 3, got {flush_rows!r}")
        self._lock = threading.Lock()
        self._arena = _Arena() if _Arena is not None and arena else None
        self._staged: RowStaging = self._arena if self._arena is not None else bytearray()
        self._flush_len = flush_rows // 3 * _ROW  # see the crash bound above
        self._blocks: list[bytes | memoryview] = []  # flushed rows not yet split into columns (ROW_STRUCT layout)
        self._block_rows = 0
        # columns with spare capacity (doubling): rows [0, _n_columns) are valid
        self._columns: dict[str, np.ndarray] = {name: np.empty(0, dtype=dt) for name, dt in DTYPES.items()}
        self._n_columns = 0
        self._n_flushed = 0  # rows in blocks and columns
        self._readonly = False
        self.strings = StringTable()  # compact: one UTF-8 buffer (gpuviz/log/strings.py)
        self.stacks: list[tuple[Frame, ...]] = []
        self._stack_ids: dict[tuple[Frame, ...], int] = {}
        self.devices: list[DeviceInfo] = []
        # name -> index in devices, kept by add_device; ``devices`` may be replaced by a new list
        # (noticed by its id and length), not edited in place other than through add_device
        self._device_index: dict[str, int] = {}
        self._indexed: tuple[int, int] = (0, 0)  # (id, length) of the devices list when indexed
        self.meta: dict[str, Any] = dict(meta or {})
        self.header: dict[str, Any] = {}  # a loaded file's header (clock, units, versions)
        self.truncated = False  # a loaded file ended before its end-of-log marker (not the whole log)
        self.corrupt = False  # ... because of damage (a checksum or content check failed)
        self.problems: list[str] = []  # what loading found wrong, in words
        self._writer: LogWriter | None = None
        self.file_error: str | None = None  # why recording to the file stopped (a write failed), else None
        self._file_error_due = False  # close() has not raised file_error yet
        self._stop_flusher: threading.Event | None = None
        if path is not None:
            self.record_to(path, flush_interval_s=flush_interval_s)

    # ----------------------------------------------------------------- recording
    def append(self, row: tuple[int, ...]) -> None:
        """Stage one event: the fields of ``ROW_COLUMNS`` in order (all ints)."""
        if self._readonly:
            self._check_writable()
        staged = self._staged
        staged.extend(_pack(*row))
        if len(staged) >= self._flush_len:
            self.flush_staged()

    def row_sink(self) -> tuple[RowStaging, int]:
        """The staging object (``extend(rows)``, ``len()`` in bytes; C recorders write into it
        through csrc/log/_rowsink.h) and its flush threshold in bytes, for recorders that pack
        rows themselves (``ROW_STRUCT``) and call ``flush_staged()`` once it reaches the threshold."""
        self._check_writable()
        return self._staged, self._flush_len

    def _intern(self, value: Any, table: list[Any], ids: dict[Any, int]) -> int:
        index = ids.get(value)
        if index is None:
            with self._lock:
                index = ids.get(value)
                if index is None:
                    index = len(table)
                    table.append(value)
                    ids[value] = index
        return index

    def intern_string(self, text: str) -> int:
        """Index of ``text`` in the string table, adding it if new."""
        index = self.strings.recent.get(text)  # the common case: used lately, no lock
        if index is None:
            with self._lock:
                index = self.strings.intern(text)
        return index

    def string_id(self, text: str) -> int:
        """Index of ``text`` in the string table, or ``NO_INDEX`` when the log never used it."""
        index = self.strings.recent.get(text)
        if index is None:
            with self._lock:
                index = self.strings.find(text)
        return index

    def intern_stack(self, frames: tuple[Frame, ...]) -> int:
        """Index of ``frames`` in the stack table, adding it if new."""
        return self._intern(frames, self.stacks, self._stack_ids)

    def add_device(self, name: str, **options: Any) -> int:
        """Index of device ``name``, registering it (with its allocator options) if new.

        Constant time: a name index, rebuilt only when ``devices`` was changed from outside.
        ``ValueError`` past ``MAX_DEVICES`` (the ``device`` column is int16)."""
        with self._lock:
            devices = self.devices
            index = self._device_index.get(name)
            if index is None or index >= len(devices) or devices[index].name != name:
                if self._indexed != (id(devices), len(devices)):  # changed from outside: index again
                    self._device_index = {info.name: i for i, info in reversed(list(enumerate(devices)))}
                index = self._device_index.get(name)
            if index is not None and index < len(devices) and devices[index].name == name:
                if options:
                    devices[index] = DeviceInfo(name, {**devices[index].options, **options})
                self._indexed = (id(devices), len(devices))
                return index
            if len(devices) >= MAX_DEVICES:
                raise ValueError(f"a log holds at most {MAX_DEVICES:,} devices; {name!r} would be one more")
            devices.append(DeviceInfo(name, dict(options)))
            self._device_index[name] = len(devices) - 1
            self._indexed = (id(devices), len(devices))
            return len(devices) - 1

    def mark(self, label: str, *, phase: MarkPhase = MarkPhase.POINT, time_ns: int | None = None) -> None:
        """Record a ``mark`` event (a user or front-end annotation) with ``label`` as its tag."""
        import time

        self._check_writable()
        tag = self.intern_string(str(label))
        now = time.perf_counter_ns() if time_ns is None else time_ns
        self.append((now, _MARK, int(phase), NO_INDEX, NO_INDEX, threading.get_ident(), 0, 0, 0, -1, -1, 0, tag, -1))

    def flush(self) -> None:
        """Move the staged rows into a block, and when recording to a file, write them there:
        once it returns, the file holds every event recorded so far."""
        with self._lock:
            if self._writer is not None:
                self._writer.recheck()  # this batch carries any change of the devices' options or meta
            self._flush_locked()
            if self._writer is not None:
                try:
                    self._writer.wait()
                except OSError as exc:
                    self._file_failed_locked(exc)

    def flush_staged(self) -> None:
        """Move the staged rows into a block and hand it to the file's writer (when recording
        to one) without waiting for the write: what recorders call when the staged rows reach
        ``row_sink()``'s threshold, and the background flusher every half interval. The
        writer's thread writes the block while the recording thread goes on (one block in
        flight at a time: the next flush waits for it)."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        staged = self._staged
        nbytes = len(staged)
        if not nbytes:
            return
        block: bytes | memoryview
        if self._arena is not None:
            block = self._arena.take()  # the rows where they were written
        else:
            assert isinstance(staged, bytearray)
            block = bytes(staged[:nbytes])
            del staged[:nbytes]
        n = nbytes // _ROW
        self._blocks.append(block)
        self._block_rows += n
        self._n_flushed += n
        if self._writer is not None:  # the block stays as it is: columns are made when the log is read
            try:
                self._writer.write_rows(self, block, self._n_flushed - n)
            except OSError as exc:
                self._file_failed_locked(exc)

    def _file_failed_locked(self, exc: OSError) -> None:
        """A write to the file failed (a full disk, a file-size limit): the file is left as it
        is (it loads flagged truncated) and this log goes on recording in memory, so that the
        recorders' callers (an allocation that flushed) never see the file's error."""
        writer = self._writer
        assert writer is not None
        self._writer = None
        self._set_due_locked()
        writer.abandon()
        self.file_error = (
            f"writing the event log to {writer.path} failed after {writer.events} events ({exc}); the file "
            f"stops there and loads flagged truncated, and recording goes on in memory: every event is "
            f"still in the log (log.save(path) writes it whole)"
        )
        self._file_error_due = True
        if self._stop_flusher is not None:
            self._stop_flusher.set()
        _recording.discard(self)
        logger.error("gpuviz: %s", self.file_error)

    def _set_due_locked(self) -> None:
        """When the arena's C recorders flush: every ``flush_rows // 3`` rows while recording to a
        file (the crash bound), only once per chunk in memory (``Arena.set_flush``)."""
        if self._arena is not None:
            self._arena.set_flush(self._flush_len if self._writer is not None else 0)

    def _split_blocks_locked(self) -> None:
        """Split each flushed block into the columns."""
        start = self._n_columns
        needed = start + self._block_rows
        capacity = len(self._columns["seq"])
        if needed > capacity:  # grow by doubling: appending n rows costs O(n) overall
            capacity = max(needed, 2 * capacity, 4096)
            grown = {name: np.empty(capacity, dtype=dt) for name, dt in DTYPES.items()}
            for name, old in self._columns.items():
                grown[name][:start] = old[:start]
            self._columns = grown
        cols = self._columns
        for block in self._blocks:
            end = start + len(block) // _ROW
            split_rows(block, [cols[name][start:end] for name in DTYPES], start)
            start = end
        self._n_columns = start
        self._blocks = []
        self._block_rows = 0

    def _set_columns(self, columns: dict[str, np.ndarray]) -> None:
        """Make ``columns`` (all of ``DTYPES``, equal lengths) this log's rows (views and loaded files)."""
        self._columns = columns
        self._n_columns = self._n_flushed = len(columns["seq"])

    def record_to(self, path: str | Path, *, flush_interval_s: float = 0.1) -> None:
        """Also write this log to ``path`` (Arrow IPC stream), flushing at least every interval.

        Events already recorded are written first, so the file always holds the whole log.
        """
        from gpuviz.log.fileio import LogWriter

        self._check_writable()
        if self._writer is not None:
            raise RuntimeError(f"this log already records to {self._writer.path}")
        if not flush_interval_s > 0:
            raise ValueError(f"flush_interval_s must be > 0, got {flush_interval_s}")
        writer = LogWriter(path, self)
        with self._lock:
            self._flush_locked()
            if self._blocks:
                self._split_blocks_locked()
            step = self._flush_len // _ROW  # the rows so far, in batches of flush_rows // 3
            try:
                for start in range(0, self._n_columns, step):
                    end = min(start + step, self._n_columns)
                    writer.write(self, {name: column[start:end] for name, column in self._columns.items()})
            except OSError:
                writer.abandon()
                raise
            self._writer = writer
            self._set_due_locked()
            self.file_error, self._file_error_due = None, False
        stop = threading.Event()
        self._stop_flusher = stop
        ref = weakref.ref(self)
        thread = threading.Thread(
            target=_flush_periodically, args=(ref, stop, flush_interval_s / 2), name="gpuviz-log-flusher", daemon=True
        )
        thread.start()
        _recording.add(self)

    def close(self) -> None:
        """Finish the file this log records to (no-op when not recording to a file).

        Flushes, writes the end-of-log marker and replaces the file by its random-access
        form (the whole log as one batch, memory-mapped by ``load``). A log still recording
        when the interpreter exits is closed then.

        Raises ``OSError`` with ``file_error`` (once) when writing the file failed while
        recording; the log in memory holds every event all the same.
        """
        if self._stop_flusher is not None:
            self._stop_flusher.set()
        with self._lock:
            self._flush_locked()
            if self._file_error_due:
                self._file_error_due = False
                raise OSError(f"the event log's file was not finished: {self.file_error}")
            if self._writer is not None:
                if self._blocks:
                    self._split_blocks_locked()
                n = self._n_columns
                writer, self._writer = self._writer, None
                self._set_due_locked()
                try:
                    writer.close(self, {name: column[:n] for name, column in self._columns.items()})
                except OSError as exc:
                    writer.abandon()
                    self.file_error = (
                        f"finishing the event log's file {writer.path} failed ({exc}); every event is still in "
                        f"the log in memory (log.save(path) writes it whole)"
                    )
                    raise OSError(f"the event log's file was not finished: {self.file_error}") from exc
        _recording.discard(self)

    def __del__(self) -> None:
        stop = getattr(self, "_stop_flusher", None)
        if stop is not None:
            stop.set()

    def _check_writable(self) -> None:
        if self._readonly:
            raise TypeError("this EventLog is a read-only view (a slice, filter or loaded file)")

    # ------------------------------------------------------------------- reading
    @property
    def columns(self) -> dict[str, np.ndarray]:
        """All columns as NumPy arrays (a shared, read-only snapshot; do not modify)."""
        with self._lock:
            self._flush_locked()
            if self._blocks:
                self._split_blocks_locked()
            n = self._n_columns
            return {name: column[:n] for name, column in self._columns.items()}

    def rows_since(self, start: int) -> np.ndarray:
        """The rows from position ``start`` on, as one read-only ``ROW_DTYPE`` record array (a
        copy of those rows only): what a live view reads each time it comes back. Rows still
        in flushed blocks are copied from the blocks, which stay unsplit (``columns`` splits
        them when the whole log is read), so the cost is that of the new rows alone."""
        return np.frombuffer(b"".join(self.row_pieces_since(start)), dtype=ROW_DTYPE)  # blocks never change: no lock

    def row_pieces_since(self, start: int) -> list[bytes | memoryview]:
        """The rows from position ``start`` on as packed ``ROW_STRUCT`` pieces in order, not
        joined: read-only views of the flushed blocks that hold them (blocks never change), and
        the rows already split into columns packed again."""
        if not isinstance(start, (int, np.integer)) or start < 0:
            raise ValueError(f"start must be a row position >= 0, got {start!r}")
        with self._lock:
            self._flush_locked()
            pieces: list[bytes | memoryview] = []
            end = self._n_columns + self._block_rows
            for block in reversed(self._blocks):  # the newest first: only the blocks holding new rows
                if end <= start:
                    break
                first = end - len(block) // _ROW
                pieces.append(memoryview(block)[max(0, start - first) * _ROW :])
                end = first
            if start < self._n_columns:  # rows already split into columns: packed again
                rows = np.empty(self._n_columns - start, dtype=ROW_DTYPE)
                for name in ROW_COLUMNS:
                    rows[name] = self._columns[name][start : self._n_columns]
                pieces.append(rows.tobytes())
        return pieces[::-1]

    def column(self, name: str) -> np.ndarray:
        if name not in DTYPES:
            raise KeyError(f"no column {name!r}; columns are {', '.join(DTYPES)}")
        return self.columns[name]

    def __len__(self) -> int:
        return self._n_flushed + len(self._staged) // _ROW

    def __iter__(self) -> Iterator[Event]:
        cols = self.columns
        lists = [cols[name].tolist() for name, _ in COLUMNS]
        for values in zip(*lists, strict=True):
            yield self._decode(values)

    def __getitem__(self, key: int | slice | str) -> Any:
        if isinstance(key, str):
            return self.column(key)
        cols = self.columns
        n = len(cols["seq"])
        if isinstance(key, slice):
            return self._view({name: array_[key] for name, array_ in cols.items()})
        if isinstance(key, (int, np.integer)):
            index = int(key)
            if not -n <= index < n:
                raise IndexError(f"event index {index} out of range for a log of {n} events")
            return self._decode(tuple(cols[name][index].item() for name, _ in COLUMNS))
        raise TypeError(f"EventLog indices must be int, slice or column name, not {type(key).__name__}")

    def _decode(self, values: tuple[Any, ...]) -> Event:
        seq, time_ns, kind, flags, device, peer, thread, address, size, requested, segment, largest, dur, tag, stack = (
            values
        )
        return Event(
            seq,
            time_ns,
            KIND_NAMES[kind],
            flags,
            self.devices[device].name if device >= 0 else None,
            self.devices[peer].name if peer >= 0 else None,
            thread,
            address,
            size,
            requested,
            segment,
            largest,
            dur,
            self.strings[tag] if tag >= 0 else None,
            stack,
        )

    @property
    def device_names(self) -> list[str]:
        return [d.name for d in self.devices]

    def device_index(self, device: str) -> int:
        """Index of a device name in the device table; ``ValueError`` naming the known ones."""
        for index, info in enumerate(self.devices):
            if info.name == device:
                return index
        known = ", ".join(self.device_names) or "none"
        raise ValueError(f"device {device!r} is not in this log (devices: {known})")

    def filter(
        self,
        *,
        kind: str | Iterable[str] | None = None,
        device: str | None = None,
        start_ns: int | None = None,
        end_ns: int | None = None,
        tag: str | None = None,
    ) -> EventLog:
        """A view of the events matching every given criterion.

        ``kind``: one kind name or several; ``device``: a device name; ``start_ns``/``end_ns``:
        the half-open time range ``[start_ns, end_ns)`` in ns; ``tag``: an exact tag string.
        """
        cols = self.columns
        mask = np.ones(len(cols["seq"]), dtype=bool)
        if kind is not None:
            codes = [kind_code(k) for k in ([kind] if isinstance(kind, str) else list(kind))]
            mask &= (cols["kind"] == codes[0]) if len(codes) == 1 else np.isin(cols["kind"], codes)
        if device is not None:
            mask &= cols["device"] == self.device_index(device)
        if start_ns is not None:
            mask &= cols["time_ns"] >= start_ns
        if end_ns is not None:
            mask &= cols["time_ns"] < end_ns
        if tag is not None:
            tag_id = self.string_id(tag)
            mask &= cols["tag"] == (tag_id if tag_id != NO_INDEX else -2)
        rows = np.flatnonzero(mask)  # once: indexing each column by a boolean mask scans the mask again
        return self._view({name: array_[rows] for name, array_ in cols.items()})

    def with_columns(self, **replacements: np.ndarray) -> EventLog:
        """A read-only view of this log with some columns replaced (same length and dtype cast),
        sharing its side tables: e.g. ``log.with_columns(time_ns=times)``."""
        cols = dict(self.columns)
        n = len(cols["seq"])
        for name, values in replacements.items():
            if name not in DTYPES or name == "seq":
                raise KeyError(f"no replaceable column {name!r}")
            if len(values) != n:
                raise ValueError(f"column {name!r} has {len(values)} values for a log of {n} events")
            cols[name] = np.asarray(values).astype(DTYPES[name], copy=False)
        return self._view(cols)

    def extended(self, rows: dict[str, np.ndarray]) -> EventLog:
        """A read-only view of this log followed by ``rows``, given as columns (each of
        ``ROW_COLUMNS``, of equal lengths and their dtypes), sharing its side tables. A log
        without rows takes the arrays as they are; otherwise each column is copied once."""
        n = len(rows[ROW_COLUMNS[0]])
        for name in ROW_COLUMNS:
            if len(rows[name]) != n or rows[name].dtype != DTYPES[name]:
                raise ValueError(f"column {name!r}: {len(rows[name])} values of {rows[name].dtype}, expected "
                                 f"{n} of {DTYPES[name]}")  # fmt: skip
        cols = self.columns
        before = len(cols["seq"])
        columns = {"seq": np.arange(before + n, dtype=np.int64)}
        for name in ROW_COLUMNS:
            columns[name] = np.concatenate([cols[name], rows[name]]) if before else rows[name]
        return self._view(columns)

    def _view(self, columns: dict[str, np.ndarray]) -> EventLog:
        view = EventLog.__new__(EventLog)
        view._lock = threading.Lock()
        view._staged = bytearray()
        view._flush_len = self._flush_len
        view._arena = None
        view._blocks = []
        view._block_rows = 0
        view._set_columns(columns)
        view._readonly = True
        view.strings = self.strings
        view.stacks = self.stacks
        view._stack_ids = self._stack_ids
        view.devices = self.devices
        view.meta = self.meta
        view.header = self.header
        view.truncated = self.truncated
        view.corrupt = self.corrupt
        view.problems = self.problems
        view.file_error = self.file_error
        view._file_error_due = False
        view._device_index = {}
        view._indexed = (0, 0)
        view._writer = None
        view._stop_flusher = None
        return view

    def to_pandas(self) -> pd.DataFrame:
        """One row per event; kind, device, peer and tag as names (categoricals/strings)."""
        import pandas as pd

        cols = self.columns
        frame: pd.DataFrame = pd.DataFrame({name: cols[name] for name, _ in COLUMNS})
        frame["kind"] = pd.Categorical.from_codes(cols["kind"].astype(np.int64), categories=pd.Index(KIND_NAMES))
        names = pd.Index(self.device_names, dtype=object)
        for column in ("device", "peer"):
            frame[column] = pd.Categorical.from_codes(cols[column].astype(np.int64), categories=names)
        strings = np.array([*self.strings, None], dtype=object)
        frame["tag"] = strings[cols["tag"]]
        return frame

    # ---------------------------------------------------------------------- files
    def save(self, path: str | Path) -> None:
        """Write the whole log to ``path`` as a gpuviz Arrow IPC stream file."""
        from gpuviz.log.fileio import save

        save(self, path)

    def to_parquet(self, path: str | Path) -> None:
        """Write the events (with names decoded) as a Parquet file for big-data tools."""
        from gpuviz.log.fileio import to_parquet

        to_parquet(self, path)

    def __repr__(self) -> str:
        devices = ", ".join(self.device_names) or "no devices"
        return f"<EventLog {len(self)} events, {devices}>"

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


_recording: weakref.WeakSet[EventLog] = weakref.WeakSet()


@atexit.register
def _close_recording_logs() -> None:
    """Finish the files of logs still recording at exit, so they load complete."""
    for log in list(_recording):
        try:
            log.close()
        except Exception:
            logger.exception("finishing the event-log file at exit failed")


def _flush_periodically(ref: weakref.ref[EventLog], stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        log = ref()
        if log is None:
            return
        try:
            log.flush_staged()
        except Exception:  # the flusher must never kill the process; the next flush retries
            logger.exception("flushing the event log to its file failed")
        del log
