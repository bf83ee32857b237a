"""Reading an event-log file's bytes (format versions 1 and 2) into a verified EventLog.

``read_log`` walks the file's batches in order, as a stream, whichever form it is in (the
random-access form is the stream behind an 8-byte magic, followed by a footer that only
other Arrow tools need). Every batch of a version-2 file is checked against its checksum
before its rows or side-table entries are used; the first batch that cannot be read or
verified ends the readable prefix. Every index of the result is then checked against the
side tables (``validate.py``). The columns of a log whose events are one batch are views
of the buffer (zero-copy); events spread over many batches (a recording cut short) are
copied once into contiguous columns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from gpuviz.base.errors import LogFormatError
from gpuviz.log.arrowfile import ARROW_SCHEMA, NAMES
from gpuviz.log.checksums import digest, verified_rows
from gpuviz.log.eventlog import EventLog
from gpuviz.log.logdata import LogData
from gpuviz.log.schema import DTYPES, FORMAT_MAGIC, FORMAT_VERSION
from gpuviz.log.tables import DeviceInfo, Frame
from gpuviz.log.validate import index_problem

__all__ = ["ARROW_SCHEMA", "READABLE_VERSIONS", "read_log"]

READABLE_VERSIONS = (1, FORMAT_VERSION)
_NAMES = NAMES
_FILE_MAGIC = b"ARROW1"


class _BadBatch(Exception):
    """A batch whose content cannot be used (it ends the readable prefix)."""


@dataclass
class _Delta:
    """The side-table entries of one batch, parsed and type-checked before any is applied."""

    strings: list[str] = field(default_factory=list)
    stacks: list[tuple[Frame, ...]] = field(default_factory=list)
    devices: list[DeviceInfo] | None = None
    meta: dict[str, Any] | None = None


def _parse_delta(text: bytes | None) -> _Delta:
    if text is None:
        return _Delta()
    value = json.loads(text)
    if not isinstance(value, dict):
        raise TypeError(f"side-table entries are a {type(value).__name__}, not an object")
    strings = value.get("strings", [])
    if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
        raise TypeError("strings are not a list of strings")
    stacks = [tuple(Frame(str(f[0]), int(f[1]), str(f[2])) for f in stack) for stack in value.get("stacks", [])]
    devices = None
    if "devices" in value:
        devices = [DeviceInfo(str(d["name"]), dict(d.get("options", {}))) for d in value["devices"]]
    meta = value.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise TypeError(f"meta is a {type(meta).__name__}, not an object")
    return _Delta(strings, stacks, devices, meta)


def _apply(log: LogData, delta: _Delta) -> None:
    for text in delta.strings:
        log.strings.append(text)
    for frames in delta.stacks:
        log._stack_ids.setdefault(frames, len(log.stacks))
        log.stacks.append(frames)
    if delta.devices is not None:
        log.devices = list(delta.devices)  # a new list: add_device indexes it afresh
    if delta.meta is not None:
        log.meta.clear()
        log.meta.update(delta.meta)


def _open(buffer: pa.Buffer, name: str) -> tuple[ipc.RecordBatchStreamReader, bool]:
    """A stream reader over the file's batches, and whether the file is the random-access form."""
    random_access = buffer.size >= 8 and buffer.slice(0, 6).to_pybytes() == _FILE_MAGIC
    try:
        return ipc.open_stream(buffer.slice(8) if random_access else buffer), random_access
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise LogFormatError(
            f"{name} is not a gpuviz event log (it is empty, truncated before its header, "
            f"or not an Arrow IPC stream: {exc})"
        ) from None


def _header(schema: pa.Schema, name: str) -> tuple[int, dict[str, Any]]:
    """The format version and the header of a file's schema, or ``LogFormatError``."""
    metadata = schema.metadata or {}
    if metadata.get(b"gpuviz.magic") != FORMAT_MAGIC.encode():
        raise LogFormatError(f"{name} is an Arrow stream but not a gpuviz event log (no gpuviz magic)")
    text = metadata.get(b"gpuviz.format_version", b"?").decode(errors="replace")
    version = int(text) if text.isdigit() and len(text) < 6 else -1
    if version not in READABLE_VERSIONS:
        raise LogFormatError(
            f"{name} has event-log format version {text}; this gpuviz reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}. Open it with the gpuviz release that wrote it."
        )
    if not schema.equals(ARROW_SCHEMA, check_metadata=False):
        raise LogFormatError(f"{name}: columns {schema.names} do not match format version {version}")
    header_text = metadata.get(b"gpuviz.header")
    if header_text is None:
        raise LogFormatError(f"{name}: the header is missing")
    if version >= 2 and metadata.get(b"gpuviz.header_checksum") != digest(header_text).encode():
        raise LogFormatError(f"{name}: the header is damaged (it does not match its checksum)")
    try:
        header = json.loads(header_text)
        if not isinstance(header, dict):
            raise TypeError(f"the header is a {type(header).__name__}, not an object")
    except (ValueError, TypeError) as exc:
        raise LogFormatError(f"{name}: the header cannot be read ({type(exc).__name__}: {exc})") from None
    return version, header


@dataclass
class _Walk:
    """What walking the batches found."""

    pieces: list[list[np.ndarray]] = field(default_factory=list)
    rows: int = 0
    batches: int = 0
    ended: bool = False
    problem: str | None = None
    corrupt: bool = False


def _columns_of(record: pa.RecordBatch) -> list[np.ndarray]:
    record.validate(full=True)
    columns = []
    for index, name in enumerate(_NAMES):
        array = record.column(index)
        if array.null_count:
            raise _BadBatch(f"column {name} holds nulls")
        columns.append(array.to_numpy(zero_copy_only=True).astype(DTYPES[name], copy=False))
    return columns


def _end(custom: dict[bytes, bytes], walk: _Walk) -> None:
    text = custom[b"gpuviz.end"]
    if custom.get(b"gpuviz.checksum") != digest(text).encode():
        raise _BadBatch("its end-of-log marker does not match its checksum")
    end = json.loads(text)
    if end != {"events": walk.rows, "batches": walk.batches}:
        raise _BadBatch(f"its end-of-log marker counts {end}, the file held {walk.rows} events in {walk.batches}")
    walk.ended = True


def _walk(reader: ipc.RecordBatchStreamReader, log: LogData, version: int) -> _Walk:
    walk = _Walk()
    while True:
        try:
            record, metadata = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            return walk
        except Exception as exc:
            walk.problem = f"batch {walk.batches} is cut short or unreadable ({type(exc).__name__}: {exc})"
            return walk
        custom = dict(metadata) if metadata is not None else {}
        first = walk.rows
        try:
            if b"gpuviz.end" in custom:
                _end(custom, walk)
                return walk
            columns = _columns_of(record)
            delta = custom.get(b"gpuviz.delta")
            good, why = len(columns[0]), None
            if version >= 2:
                good, why = verified_rows(columns, delta or b"", custom.get(b"gpuviz.checksum", b""))
            if good or why is None:
                _apply(log, _parse_delta(delta))
        except Exception as exc:
            good, why = 0, f"it cannot be read ({type(exc).__name__}: {exc})"
        if good:
            walk.pieces.append([column[:good] for column in columns])
            walk.rows += good
        if why is not None:
            walk.problem = f"batch {walk.batches} (events from {first}) is damaged: {why}"
            walk.corrupt = True
            return walk
        walk.batches += 1


def read_log(buffer: pa.Buffer, name: str) -> EventLog:
    """The EventLog in ``buffer`` (a whole event-log file; ``name`` names it in messages)."""
    reader, random_access = _open(buffer, name)
    version, header = _header(reader.schema, name)
    meta = header.get("meta") or {}
    if not isinstance(meta, dict):
        raise LogFormatError(f"{name}: the header's meta is a {type(meta).__name__}, not an object")
    log = EventLog._empty(meta=meta)
    _apply(log, _parse_delta(json.dumps({"devices": header.get("devices", [])}).encode()))
    log.header = {k: v for k, v in header.items() if k not in ("devices", "meta")}
    log.header.update(format_version=version, checksums=version >= 2)
    walk = _walk(reader, log, version)
    problems = [walk.problem] if walk.problem else []
    truncated = walk.problem is not None or (version >= 2 and not walk.ended)
    if version >= 2 and not walk.ended and walk.problem is None:
        problems.append(f"the file ends after batch {walk.batches - 1} without its end-of-log marker (cut short)")
    if walk.ended and random_access and buffer.slice(buffer.size - 6).to_pybytes() != _FILE_MAGIC:
        problems.append("all events are there, but the random-access footer after them is cut or damaged")
        walk.corrupt = True
    if len(walk.pieces) == 1:
        columns = dict(zip(_NAMES, walk.pieces[0], strict=True))  # views of the file: no copy
    elif walk.pieces:
        columns = {name: np.concatenate([p[i] for p in walk.pieces]) for i, name in enumerate(_NAMES)}
    else:
        columns = {name: np.empty(0, dtype=dt) for name, dt in DTYPES.items()}
    problem = index_problem(columns, devices=len(log.devices), strings=len(log.strings), stacks=len(log.stacks))
    if problem is not None:
        raise LogFormatError(f"{name}: {problem}")
    if truncated:
        problems.append(f"loaded the first {walk.rows} events")
    log._set_columns(columns)
    log.truncated = truncated
    log.corrupt = walk.corrupt
    log.problems = problems
    log._readonly = True
    return log
