"""Reading a PyTorch memory snapshot file: the pickle (untrusted) or its JSON form, with each
device's trace as columns (``TraceColumns``) rather than one dict per entry.

A pickle is read, where the optional C extension ``gpuviz.importers._snapshotpickle`` is built,
by a streaming reader of its opcode stream that turns every trace entry into a row of columns
as soon as it is complete, so a snapshot with millions of entries is never whole in memory
(``GPUVIZ_NATIVE=0`` switches it off). Whatever that reader does not cover (any opcode outside
plain data, a truncated file, an entry of unusual types) is read again by the restricted
unpickler of ``plainpickle``, which refuses every global: the two give the same snapshot or the
same error. JSON files, and pickles without the extension, are loaded whole and converted by
``columns_of``, entry by entry the same way.

Both bound their work by the input, not by what it declares (``plainpickle``): a length past the
end of the input or a memo index past the memo stores before it is refused before anything is
allocated for it, and an object the pickle shares is converted once: a frames list that many
entries share becomes one stack once, however many refer to it.
"""

from __future__ import annotations

import json
import pickle
import re
import reprlib
import struct
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuviz.base import native as registry
from gpuviz.base.errors import LogFormatError
from gpuviz.importers import plainpickle
from gpuviz.importers.source import Source
from gpuviz.log.eventlog import NO_INDEX, EventLog, Frame

__all__ = ["ACTIONS", "OTHER", "HAS_ADDR", "HAS_SIZE", "HAS_TIME", "HAS_BLOCK_SIZE", "TraceColumns", "Stacks",
           "columns_of", "load_snapshot", "read_snapshot", "native_reader_available", "as_snapshot",
           "is_segments_list", "segments_list_head", "text_of"]  # fmt: skip

# action codes of TraceColumns.action (the C reader's ACTION_NAMES, in this order)
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "oom", "snapshot")  # fmt: skip
OTHER = 255  # an action gpuviz does not know (its name is in TraceColumns.other_actions)
HAS_ADDR, HAS_SIZE, HAS_TIME, HAS_BLOCK_SIZE = 1, 2, 4, 8
_CODES = {name: code for code, name in enumerate(ACTIONS)}

_MODULE = "gpuviz.importers._snapshotpickle"
_native: Any = registry.load(_MODULE)  # None where it was not built
assert _native is None or tuple(_native.ACTION_NAMES) == ACTIONS


def native_reader_available() -> bool:
    """Whether pickles are read by the streaming C reader (built, loaded, not switched off: ``gpuviz.base.native``)."""
    return _native is not None and registry.available(_MODULE)


@dataclass
class TraceColumns:
    """One device's trace, one row per entry: ``action`` codes (``ACTIONS``, ``OTHER``), ``flags``
    (``HAS_*``: which keys the entry had), ``addr`` and ``size`` (bytes), ``time_us`` (µs, where
    ``HAS_TIME``: the entry's ``time_us`` was an int), ``block_size`` (bytes, where
    ``HAS_BLOCK_SIZE``) and ``stack`` (a ``Stacks`` provisional id, -1 without frames)."""

    action: np.ndarray
    flags: np.ndarray
    addr: np.ndarray
    size: np.ndarray
    time_us: np.ndarray
    block_size: np.ndarray
    stack: np.ndarray
    other_actions: dict[int, str]  # position -> the action of an OTHER entry

    def __len__(self) -> int:
        return len(self.action)

    @classmethod
    def from_bytes(cls, parts: Sequence[bytes]) -> TraceColumns:
        """The columns from the C reader's bytes (in field order)."""
        dtypes = (np.uint8, np.uint8, np.int64, np.int64, np.int64, np.int64, np.int32)
        action, flags, addr, size, time_us, block_size, stack = (
            np.frombuffer(p, dtype=d) for p, d in zip(parts, dtypes, strict=True)
        )
        return cls(action, flags, addr, size, time_us, block_size, stack, {})


class Stacks:
    """Frames lists -> stacks of the Python frames (innermost first).

    ``provisional(frames)`` numbers distinct frame sequences as they are read (by the identity
    of their frame dicts: a snapshot shares its frame dicts, and the reader keeps them alive
    while it runs); ``final(id)`` interns one into the log's stack table when the importer first
    uses it, so the table's order is the order of use.
    """

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self._ids: dict[bytes, int] = {}
        self._tables: list[tuple[Frame, ...]] = []
        self._final: list[int | None] = []
        self._frames: dict[int, Frame | None] = {}
        self._lists: dict[int, tuple[Any, int]] = {}  # id(frames list) -> (the list, kept alive; its id)

    def provisional(self, frames: Any) -> int:
        if not frames:
            return NO_INDEX
        key = array("Q", map(id, frames)).tobytes()  # 8 bytes a frame (a tuple of ints: 40)
        found = self._ids.get(key)
        if found is None:
            cache = self._frames
            converted = []
            for frame in frames:
                python = cache.get(id(frame), ...)
                if python is ...:
                    python = cache[id(frame)] = _python_frame(frame)
                if python is not None:
                    converted.append(python)
            found = self._ids[key] = len(self._tables)
            self._tables.append(tuple(converted))
            self._final.append(None)
        return found

    def of_list(self, frames: Any) -> int:
        """``provisional(frames)``, converted once per list object however many entries share it
        (the list is kept alive until ``forget_identities``, so its identity stays its own)."""
        if not frames:
            return NO_INDEX
        found = self._lists.get(id(frames))
        if found is None:
            found = self._lists[id(frames)] = (frames, self.provisional(frames))
        return found[1]

    def forget_identities(self) -> None:
        """Drop the identity caches (call once the objects read may be gone)."""
        self._ids.clear()
        self._frames.clear()
        self._lists.clear()

    def final(self, provisional: int) -> int:
        if provisional < 0:
            return NO_INDEX
        found = self._final[provisional]
        if found is None:
            frames = self._tables[provisional]
            found = self._final[provisional] = self.log.intern_stack(frames) if frames else NO_INDEX
        return found

    def index(self, frames: Any) -> int:
        """The log's stack of ``frames`` (a frames list of the snapshot; converted once per list)."""
        return self.final(self.of_list(frames))


def text_of(value: Any) -> str:
    """``value`` when it is a str, else a bounded repr of it (a value a pickle shares many times
    over can be huge when written out whole)."""
    return value if isinstance(value, str) else reprlib.repr(value)


def _python_frame(frame: Any) -> Frame | None:
    """The frame as a gpuviz Frame when it is a Python frame, else None (C/C++ frames)."""
    if not isinstance(frame, Mapping):
        return None
    filename = text_of(frame.get("filename", ""))
    if filename.endswith(".py") or (filename.startswith("<") and filename.endswith(">")):
        return Frame(filename, int(frame.get("line", 0)), text_of(frame.get("name", "")))
    return None


def columns_of(trace: Sequence[Any], stacks: Stacks) -> TraceColumns:
    """The columns of a trace given as a list of entry dicts (what the C reader makes while reading)."""
    n = len(trace)
    action = np.empty(n, np.uint8)
    flags = np.zeros(n, np.uint8)
    ints = [[0] * n for _ in range(4)]  # addr, size, time_us, block_size
    stack = np.empty(n, np.int32)
    others: dict[int, str] = {}
    keys = (("addr", HAS_ADDR), ("size", HAS_SIZE))
    for i, entry in enumerate(trace):
        if type(entry) is not dict:
            raise LogFormatError(f"a trace entry is a {type(entry).__name__}, not a dict: {reprlib.repr(entry)}")
        name = entry.get("action")
        code = _CODES.get(name, OTHER) if type(name) is str else OTHER
        action[i] = code
        if code == OTHER:
            others[i] = text_of(name)
        bits = 0
        for column, (key, bit) in enumerate(keys):
            if key in entry:
                try:
                    ints[column][i] = int(entry[key])
                except (TypeError, ValueError):
                    raise LogFormatError(
                        f"trace entry {i} has {key} {reprlib.repr(entry[key])}, not an integer"
                    ) from None
                bits |= bit
        time_us = entry.get("time_us")
        if type(time_us) is int:
            ints[2][i] = time_us
            bits |= HAS_TIME
        block = entry.get("block_size")
        if isinstance(block, int):
            ints[3][i] = int(block)
            bits |= HAS_BLOCK_SIZE
        flags[i] = bits
        stack[i] = stacks.of_list(entry.get("frames"))
    try:
        addr, size, time, block_size = (np.array(values, dtype=np.int64) for values in ints)
    except OverflowError:
        raise LogFormatError("a trace entry holds an integer beyond 64 bits") from None
    return TraceColumns(action, flags, addr, size, time, block_size, stack, others)


def load_snapshot(source: Source) -> dict[str, Any]:
    """The snapshot dict of ``source`` (pickle or JSON) loaded whole, checked for the keys the importer needs.

    Raises ``LogFormatError`` for a pickle naming any global (nothing of it is executed), a
    declared length past the end of the input, a memo index past the memo stores before it, a
    truncated or corrupt pickle (a pickle is one object: no prefix of it can be read), invalid
    JSON, or data that is not a snapshot.
    """
    with source.open() as stream:
        if source.head[:1] == b"\x80":
            try:
                data = plainpickle.load(stream, source.content_limit())
            except plainpickle.Refused as exc:
                raise LogFormatError(
                    f"{source.path}: the pickle names the global {exc}, so it is refused and nothing of it was run "
                    "(gpuviz unpickles snapshots with every class and function refused; a PyTorch snapshot holds "
                    "only dicts, lists, numbers and strings)"
                ) from None
            except (EOFError, pickle.UnpicklingError, ValueError, OSError, IndexError, KeyError, TypeError,
                    AttributeError, struct.error) as exc:  # fmt: skip
                raise LogFormatError(
                    f"{source.path}: the pickle is truncated or corrupt ({type(exc).__name__}: {exc}); a pickle is "
                    "one object, so no readable prefix of it can be imported"
                ) from None
        else:
            try:
                data = json.load(stream)
            except (ValueError, EOFError, OSError) as exc:
                raise LogFormatError(
                    f"{source.path}: the snapshot's JSON is truncated or invalid ({type(exc).__name__}: {exc})"
                ) from None
    data = as_snapshot(data)
    check_snapshot(data, str(source.path))
    return data  # type: ignore[no-any-return]


def is_segments_list(data: Any) -> bool:
    """Whether ``data`` is what ``torch.cuda.memory_snapshot()`` returns: a list of segment dicts."""
    return (
        isinstance(data, list)
        and bool(data)
        and all(isinstance(s, dict) and "address" in s and "total_size" in s for s in data)
    )


_LIST_PICKLE = re.compile(rb"\x80[\x02-\x05](?:\x95.{8})?\]", re.S)  # PROTO, FRAME, EMPTY_LIST
_SEGMENT_KEYS = (b"address", b"total_size", b"blocks")


def segments_list_head(head: bytes) -> bool:
    """Whether ``head`` starts a pickle of a list (``]`` after the protocol and frame) whose first
    dict has a segment's keys: what ``torch.cuda.memory_snapshot()`` returns, pickled."""
    if _LIST_PICKLE.match(head) is None:
        return False
    start = head[:512]
    return all(key in start for key in _SEGMENT_KEYS)


def as_snapshot(data: Any) -> Any:
    """A snapshot dict of ``data``: a list of segments (``torch.cuda.memory_snapshot()``, i.e.
    ``_snapshot()["segments"]``) becomes ``{"segments": data}`` (a snapshot without a trace);
    anything else is returned as it is."""
    return {"segments": data} if is_segments_list(data) else data


def check_snapshot(data: Any, file: str) -> None:
    """``LogFormatError`` unless ``data`` has the shape of a snapshot dict."""
    if not isinstance(data, dict):
        raise LogFormatError(f"{file}: a PyTorch snapshot is a dict, this holds a {type(data).__name__}")
    for key in ("segments", "device_traces"):
        if not isinstance(data.get(key, []), list):
            raise LogFormatError(f"{file}: the snapshot's {key!r} is not a list")
    if "segments" not in data and "device_traces" not in data:
        raise LogFormatError(f"{file}: the dict has neither 'segments' nor 'device_traces'")


def read_snapshot(source: Source, stacks: Stacks) -> tuple[dict[str, Any], list[TraceColumns]]:
    """The snapshot of ``source`` without its traces, and each device's trace as columns."""
    if source.head[:1] == b"\x80" and native_reader_available():
        streamed = _read_streaming(source, stacks)
        if streamed is not None:
            return streamed
    snapshot = load_snapshot(source)
    return snapshot, traces_of(snapshot, stacks)


def traces_of(snapshot: Mapping[str, Any], stacks: Stacks) -> list[TraceColumns]:
    """Each device's trace of a snapshot dict as columns."""
    return [columns_of(trace or [], stacks) for trace in snapshot.get("device_traces") or []]


def _read_streaming(source: Source, stacks: Stacks) -> tuple[dict[str, Any], list[TraceColumns]] | None:
    """The C reader's result, or None where it cannot tell (the caller reads the file again)."""
    read: Callable[[int], bytes]
    with source.open(buffered=False) as stream:  # the C reader reads 64 KiB blocks into its own buffer
        read = stream.read
        try:
            root, traces = _native.read(read, stacks.provisional, source.content_limit())
        except (_native.Unsupported, EOFError, OSError, ValueError, TypeError):  # the Python reader says why
            stacks.forget_identities()
            return None
    stacks.forget_identities()
    if is_segments_list(root) and not traces:
        return as_snapshot(root), []
    if not isinstance(root, dict) or not isinstance(root.get("device_traces"), list):
        return None
    check_snapshot(root, str(source.path))
    by_list = {id(trace): TraceColumns.from_bytes(parts) for trace, parts in traces}
    columns = []
    for trace in root["device_traces"]:
        found = by_list.pop(id(trace), None)
        columns.append(found if found is not None else columns_of(trace or [], stacks))
    if any(len(c) for c in by_list.values()):  # entries read into a list that is not a device's trace
        return None
    return root, columns
