"""The gpuviz event-log file: an Apache Arrow IPC stream.

Layout (format version 1):
    schema metadata   ``gpuviz.magic`` = "gpuviz-eventlog", ``gpuviz.format_version`` = "1",
                      ``gpuviz.header`` = JSON {clock, units, created_unix_ns, gpuviz_version,
                      devices, meta}
    record batches    the columns of ``schema.COLUMNS``; each batch carries custom metadata
                      ``gpuviz.delta`` = JSON {strings: [new strings], stacks: [new stacks],
                      devices: [all devices, when changed], meta: {..., when changed}}

Every batch is self-contained together with the batches before it, so a file cut short
by a crash still yields every event up to its last complete batch.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from gpuviz.base.errors import LogFormatError
from gpuviz.log.eventlog import DeviceInfo, EventLog, Frame
from gpuviz.log.schema import COLUMNS, DTYPES, FORMAT_MAGIC, FORMAT_VERSION

__all__ = ["LogWriter", "save", "load", "to_parquet", "ARROW_SCHEMA"]

logger = logging.getLogger("gpuviz")

ARROW_SCHEMA = pa.schema([pa.field(name, pa.from_numpy_dtype(np.dtype(dt)), nullable=False) for name, dt in COLUMNS])
_SAVE_BATCH_ROWS = 1 << 16


def _gpuviz_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpuviz")
    except PackageNotFoundError:
        return "unknown"


def _devices_json(devices: list[DeviceInfo]) -> list[dict[str, Any]]:
    return [{"name": d.name, "options": d.options} for d in devices]


class LogWriter:
    """Writes an EventLog's batches to one file as they are flushed."""

    def __init__(self, path: str | Path, log: EventLog) -> None:
        self.path = Path(path)
        self._file: IO[bytes] = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self._strings = 0
        self._stacks = 0
        self._devices: list[dict[str, Any]] = []
        self._meta = "{}"
        self._stream = self._open_stream(log)
        # the header and the side tables reach the disk at once, before any event
        self.write(log, {name: np.empty(0, dtype=dt) for name, dt in DTYPES.items()})

    def _open_stream(self, log: EventLog) -> ipc.RecordBatchStreamWriter:
        header = {
            "clock": "time.perf_counter_ns (monotonic)",
            "units": {"time": "ns", "size": "bytes", "address": "bytes"},
            "created_unix_ns": time.time_ns(),
            "gpuviz_version": _gpuviz_version(),
            "devices": _devices_json(log.devices),
            "meta": log.meta,
        }
        metadata: dict[str | bytes, str | bytes] = {
            "gpuviz.magic": FORMAT_MAGIC,
            "gpuviz.format_version": str(FORMAT_VERSION),
            "gpuviz.header": json.dumps(header, default=str),
        }
        return ipc.new_stream(self._file, ARROW_SCHEMA.with_metadata(metadata))  # type: ignore[arg-type]

    def write(self, log: EventLog, batch: dict[str, np.ndarray]) -> None:
        """Append one batch of rows, with whatever side-table entries are new since the last one."""
        delta: dict[str, Any] = {"strings": log.strings[self._strings :]}
        delta["stacks"] = [[list(frame) for frame in stack] for stack in log.stacks[self._stacks :]]
        devices = _devices_json(log.devices)
        if devices != self._devices:
            delta["devices"] = devices
        meta = json.dumps(log.meta, default=str, sort_keys=True)
        if meta != self._meta:
            delta["meta"] = json.loads(meta)
        record = pa.RecordBatch.from_arrays([pa.array(batch[name]) for name, _ in COLUMNS], schema=ARROW_SCHEMA)
        self._stream.write_batch(record, custom_metadata={b"gpuviz.delta": json.dumps(delta, default=str).encode()})
        self._file.flush()
        self._strings += len(delta["strings"])
        self._stacks += len(delta["stacks"])
        self._devices = devices
        self._meta = meta

    def close(self) -> None:
        self._stream.close()
        self._file.close()


def save(log: EventLog, path: str | Path) -> None:
    """Write ``log`` to ``path`` (replacing it) in batches of at most 65536 rows."""
    columns = log.columns
    n = len(columns["seq"])
    writer = LogWriter(path, log)
    try:
        for start in range(0, n, _SAVE_BATCH_ROWS):
            writer.write(log, {name: col[start : start + _SAVE_BATCH_ROWS] for name, col in columns.items()})
    finally:
        writer.close()


def _apply_delta(log: EventLog, delta: dict[str, Any]) -> None:
    for text in delta.get("strings", ()):
        log._string_ids[text] = len(log.strings)
        log.strings.append(text)
    for stack in delta.get("stacks", ()):
        frames = tuple(Frame(str(f[0]), int(f[1]), str(f[2])) for f in stack)
        log._stack_ids[frames] = len(log.stacks)
        log.stacks.append(frames)
    if "devices" in delta:
        log.devices[:] = [DeviceInfo(d["name"], dict(d.get("options", {}))) for d in delta["devices"]]
    if "meta" in delta:
        log.meta.clear()
        log.meta.update(delta["meta"])


def load(path: str | Path) -> EventLog:
    """Read a gpuviz event-log file.

    Raises ``LogFormatError`` when the file is not a gpuviz log or has another format
    version. A file cut short (a crashed recorder) loads up to its last complete batch;
    the returned log then has ``truncated == True``.
    """
    path = Path(path)
    with open(path, "rb") as file:
        try:
            reader = ipc.open_stream(file)
        except (pa.ArrowInvalid, OSError) as exc:
            raise LogFormatError(
                f"{path} is not a gpuviz event log (it is empty, truncated before its header, "
                f"or not an Arrow IPC stream: {exc})"
            ) from None
        metadata = reader.schema.metadata or {}
        if metadata.get(b"gpuviz.magic") != FORMAT_MAGIC.encode():
            raise LogFormatError(f"{path} is an Arrow stream but not a gpuviz event log (no gpuviz magic)")
        version = metadata.get(b"gpuviz.format_version", b"?").decode()
        if version != str(FORMAT_VERSION):
            raise LogFormatError(
                f"{path} has event-log format version {version}; this gpuviz reads version "
                f"{FORMAT_VERSION}. Open it with the gpuviz release that wrote it."
            )
        if reader.schema.names != [name for name, _ in COLUMNS]:
            raise LogFormatError(f"{path}: columns {reader.schema.names} do not match format version {version}")
        header = json.loads(metadata[b"gpuviz.header"])
        log = EventLog(meta=header.get("meta") or {})
        _apply_delta(log, {"devices": header.get("devices", [])})
        log.header = {k: v for k, v in header.items() if k not in ("devices", "meta")}
        batches: list[dict[str, np.ndarray]] = []
        while True:
            try:
                record, custom = reader.read_next_batch_with_custom_metadata()
            except StopIteration:
                break
            except (pa.ArrowInvalid, OSError, EOFError, ValueError) as exc:
                log.truncated = True
                logger.warning(
                    "%s is truncated; loaded the %d complete batches before the cut (%s)", path, len(batches), exc
                )
                break
            delta = json.loads(custom[b"gpuviz.delta"]) if custom and b"gpuviz.delta" in custom else {}
            _apply_delta(log, delta)
            if record.num_rows:
                batches.append(
                    {
                        name: record.column(i).to_numpy().astype(DTYPES[name], copy=False)
                        for i, (name, _) in enumerate(COLUMNS)
                    }
                )
    if batches:
        log._set_columns({name: np.concatenate([b[name] for b in batches]) for name in DTYPES})
    log._readonly = True
    return log


def to_parquet(log: EventLog, path: str | Path) -> None:
    """Write ``log.to_pandas()`` as Parquet, with the devices and format version as metadata."""
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(log.to_pandas(), preserve_index=False)
    extra = {
        "gpuviz.magic": FORMAT_MAGIC,
        "gpuviz.format_version": str(FORMAT_VERSION),
        "gpuviz.devices": json.dumps(_devices_json(log.devices), default=str),
    }
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}), **{k.encode(): v.encode() for k, v in extra.items()}}
    )
    pq.write_table(table, path)
