"""The log itself: all events of a run as NumPy columns, plus its side tables.

``LogData`` holds what a log *is*, whether it is being recorded (``eventlog.EventLog``, which
adds a recorder), was loaded from a file (``files.load``) or is a view of another log (a slice,
``filter``, ``with_columns``, ``extended``): the columns of ``schema.DTYPES``, the side tables
(strings, stacks, devices) and meta, and every query users make of them.

Rows reach a log as immutable blocks of packed rows (``schema.ROW_STRUCT``; the recorder's
flushes, ``_add_block``), which are split into the columns when the log is read
(``rows.split_rows``). Columns grow by doubling their capacity, so a reader that comes back (a
live view) pays only for the rows added since, and the arrays it got earlier never change.
Every read first asks ``_settle_locked`` for rows still staged (the recorder's flush), so
readers see flushed and staged rows alike. The lock serialises flushes, splits and additions
to the side tables; appends take none (see ``recorder.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from gpuviz.log.rows import ROW_BYTES, split_rows
from gpuviz.log.schema import COLUMNS, DTYPES, KIND_NAMES, ROW_COLUMNS, ROW_DTYPE, kind_code
from gpuviz.log.strings import StringTable
from gpuviz.log.tables import MAX_DEVICES, NO_INDEX, DeviceInfo, Event, Frame

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["LogData"]

_L = TypeVar("_L", bound="LogData")


class LogData:
    """All events of a run, columnar, with their side tables: what a log is and what can be
    asked of it.

    ``len(log)``; ``log[i]`` -> ``Event``; ``log[a:b]`` and ``log.filter(...)`` -> a read-only
    view of the same class that keeps the original ``seq`` numbers; ``log["size"]`` -> a column.
    """

    def __init__(self, *, meta: dict[str, Any] | None = None) -> None:
        self._lock = threading.Lock()
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
        self.file_error: str | None = None  # why recording to the file stopped (a write failed), else None

    # ------------------------------------------------------------- side tables
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
        index = self._stack_ids.get(frames)
        if index is None:
            with self._lock:
                index = self._stack_ids.get(frames)
                if index is None:
                    index = len(self.stacks)
                    self.stacks.append(frames)
                    self._stack_ids[frames] = index
        return index

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

    # ------------------------------------------------------------ row storage
    def _settle_locked(self) -> None:
        """Before a read, with the lock held: rows still staged become blocks (a recording
        log's flush; nothing here)."""

    def _add_block(self, block: bytes | memoryview) -> int:
        """Keep a flushed block of whole packed rows (never changed after); with the lock held.
        The ``seq`` of its first row."""
        n = len(block) // ROW_BYTES
        self._blocks.append(block)
        self._block_rows += n
        self._n_flushed += n
        return self._n_flushed - n

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
            end = start + len(block) // ROW_BYTES
            split_rows(block, [cols[name][start:end] for name in DTYPES], start)
            start = end
        self._n_columns = start
        self._blocks = []
        self._block_rows = 0

    def _columns_locked(self) -> dict[str, np.ndarray]:
        """Every row as columns, staged rows flushed and blocks split; with the lock held."""
        self._settle_locked()
        if self._blocks:
            self._split_blocks_locked()
        n = self._n_columns
        return {name: column[:n] for name, column in self._columns.items()}

    def _set_columns(self, columns: dict[str, np.ndarray]) -> None:
        """Make ``columns`` (all of ``DTYPES``, equal lengths) this log's rows (views and loaded files)."""
        self._columns = columns
        self._n_columns = self._n_flushed = len(columns["seq"])

    # ------------------------------------------------------------------- reading
    @property
    def columns(self) -> dict[str, np.ndarray]:
        """All columns as NumPy arrays (a shared, read-only snapshot; do not modify)."""
        with self._lock:
            return self._columns_locked()

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
            self._settle_locked()
            pieces: list[bytes | memoryview] = []
            end = self._n_columns + self._block_rows
            for block in reversed(self._blocks):  # the newest first: only the blocks holding new rows
                if end <= start:
                    break
                first = end - len(block) // ROW_BYTES
                pieces.append(memoryview(block)[max(0, start - first) * ROW_BYTES :])
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
        return self._n_flushed

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

    # --------------------------------------------------------------------- views
    def filter(
        self: _L,
        *,
        kind: str | Iterable[str] | None = None,
        device: str | None = None,
        start_ns: int | None = None,
        end_ns: int | None = None,
        tag: str | None = None,
    ) -> _L:
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

    def with_columns(self: _L, **replacements: np.ndarray) -> _L:
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

    def extended(self: _L, rows: dict[str, np.ndarray]) -> _L:
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

    @classmethod
    def _empty(cls: type[_L], *, meta: dict[str, Any] | None = None) -> _L:
        """A log of this class without rows and without a recorder (what views and loaded
        files fill)."""
        log = cls.__new__(cls)
        LogData.__init__(log, meta=meta)
        return log

    def _view(self: _L, columns: dict[str, np.ndarray]) -> _L:
        """A read-only log of this class over ``columns``, sharing this log's side tables."""
        view = self._empty()
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
        return view

    # -------------------------------------------------------------------- export
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

    def __repr__(self) -> str:
        devices = ", ".join(self.device_names) or "no devices"
        return f"<{type(self).__name__} {len(self)} events, {devices}>"
