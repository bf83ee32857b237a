"""Replay: rebuild HeapState at any event index by applying recorded events only.

Replay never re-runs the best-fit policy; it applies what the allocator decided. One
property ties the two: replaying an allocator's log reproduces its state exactly,
``replay(alloc.log).state_at(-1) == alloc.state()``.

Random access is served from checkpoints: one pass over a device's events keeps a snapshot
every ``checkpoint_every`` events; later queries start from the nearest snapshot at or before
the index. In C the pass is made when needed: a first single query walks from the empty heap
without snapshots, and the first query of several states (a scrubber's stops) makes the
snapshots in the same pass as those states, so a report replays its events once, not twice.

The pass runs in C (``gpuviz.analysis._replaykernel``, built at install time where a C
compiler exists; snapshots kept as packed records) or, without it, in Python (snapshots
kept as dicts). Both apply the same rules (``_apply``) and give the same states.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuviz.analysis.heapcolumns import HeapColumns
from gpuviz.analysis.native import kernel_function
from gpuviz.base.heapstate import HeapState
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind
from gpuviz.log.segments import map_range, unmap_range

__all__ = ["Replay", "replay", "HEAP_KINDS", "heap_mask", "HeapsAt"]

HEAP_KINDS = (Kind.SEGMENT_ALLOC, Kind.SEGMENT_FREE, Kind.ALLOC, Kind.FREE, Kind.SPLIT, Kind.MERGE,
              Kind.SEGMENT_MAP, Kind.SEGMENT_UNMAP)  # fmt: skip
_SEGMENT_ALLOC, _SEGMENT_FREE, _ALLOC, _FREE, _SPLIT, _MERGE, _SEGMENT_MAP, _SEGMENT_UNMAP = (
    int(k) for k in HEAP_KINDS
)

# chunk address -> (size, requested, tag index, stack index); requested == 0 means free
_Chunks = dict[int, tuple[int, int, int, int]]
_FREE_CHUNK = (0, -1, -1)  # requested, tag, stack of a free chunk
_Segments = dict[int, int]


def heap_mask(kinds: np.ndarray) -> np.ndarray:
    """Which events are heap events (``HEAP_KINDS``): the kinds 0..5 and from 10 on (two comparisons)."""
    mask: np.ndarray = (kinds <= _MERGE) | (kinds >= _SEGMENT_MAP)
    return mask


assert sorted(int(k) for k in HEAP_KINDS) == [*range(_MERGE + 1), _SEGMENT_MAP, _SEGMENT_UNMAP]
assert max(Kind) == _SEGMENT_UNMAP, "heap_mask takes every kind from segment_map on"


_WALKS = 2
"""``Replay.columns_at`` replays at most this many states without checkpoints (one pass each)."""


def _load_kernel() -> Callable[..., tuple[bytes, bytes, bytes, bytes]] | None:
    return kernel_function("checkpoints")


_CHUNK_RECORD = np.dtype([("address", "<i8"), ("size", "<i8"), ("requested", "<i8"), ("tag", "<i4"), ("stack", "<i4")])
_SEGMENT_RECORD = np.dtype([("base", "<i8"), ("size", "<i8")])
_RECORDS = (_CHUNK_RECORD, _SEGMENT_RECORD)


class _PackedCheckpoints:
    """The C pass's snapshots: snapshot k is records [offsets[k], offsets[k + 1]). Made from
    the states of a pass instead (``states``: snapshot k + 1 is ``states[k]``, records as bytes),
    they are packed when first asked for packed (``packed``)."""

    def __init__(
        self, packed: tuple[bytes, bytes, bytes, bytes] | None, states: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        self._states = states
        if packed is not None:
            self._unpack(packed)

    def _unpack(self, packed: tuple[bytes, bytes, bytes, bytes]) -> None:
        chunks, chunk_offsets, segments, segment_offsets = packed
        self.chunks = np.frombuffer(chunks, dtype=_CHUNK_RECORD)
        self.chunk_offsets = np.frombuffer(chunk_offsets, dtype=np.int64)
        self.segments = np.frombuffer(segments, dtype=_SEGMENT_RECORD)
        self.segment_offsets = np.frombuffer(segment_offsets, dtype=np.int64)

    def packed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Chunk records, their offsets, segment records, their offsets (``states``' arguments)."""
        if self._states is not None:
            kept, self._states = self._states, None
            offsets = [
                np.concatenate(([0, 0], np.cumsum([len(r[i]) // t.itemsize for r in kept], dtype=np.int64))).tobytes()
                for i, t in enumerate(_RECORDS)
            ]
            self._unpack((b"".join(r[0] for r in kept), offsets[0], b"".join(r[1] for r in kept), offsets[1]))
        return self.chunks, self.chunk_offsets, self.segments, self.segment_offsets

    def records(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Snapshot k's chunk and segment records (views)."""
        if self._states is not None:
            if k == 0:
                return np.empty(0, dtype=_CHUNK_RECORD), np.empty(0, dtype=_SEGMENT_RECORD)
            c, g = self._states[k - 1]
            return np.frombuffer(c, dtype=_CHUNK_RECORD), np.frombuffer(g, dtype=_SEGMENT_RECORD)
        return (
            self.chunks[self.chunk_offsets[k] : self.chunk_offsets[k + 1]],
            self.segments[self.segment_offsets[k] : self.segment_offsets[k + 1]],
        )

    def __getitem__(self, k: int) -> tuple[_Chunks, _Segments]:
        c, s = self.records(k)
        values = zip(c["size"].tolist(), c["requested"].tolist(), c["tag"].tolist(), c["stack"].tolist(), strict=True)
        return dict(zip(c["address"].tolist(), values, strict=True)), dict(
            zip(s["base"].tolist(), s["size"].tolist(), strict=True)
        )


@dataclass
class _DeviceReplay:
    """One device's heap events, read in place from the log's columns (no copies): event j is
    row ``positions[j]`` (``positions`` None: row j, when every event is this device's)."""

    positions: np.ndarray | None
    count: int  # the device's heap events
    columns: tuple[np.ndarray, ...]  # kind, address, size, requested, tag, stack: the whole log's
    checkpoints: Any  # k -> (chunks, segments) after k * checkpoint_every events (copies)
    walks: int = 0  # single states replayed without checkpoints (``_WALKS`` at most)
    last: tuple[int, Any] | None = None  # (events applied, records) of the last state of the C pass asked for

    def applied_through(self, index: int) -> int:
        """How many of the device's events are at log positions <= ``index``."""
        if self.positions is None:
            return min(index + 1, self.count)
        return int(np.searchsorted(self.positions, index, side="right"))


def _apply(chunks: _Chunks, segments: _Segments, events: Iterable[tuple[int, int, int, int, int, int]]) -> None:
    for kind, address, size, requested, tag, stack in events:
        if kind == _ALLOC:
            chunks[address] = (size, requested, tag, stack)
        elif kind == _FREE:
            chunks[address] = (size, *_FREE_CHUNK)
        elif kind == _SPLIT:
            old = chunks[address][0]
            chunks[address] = (size, *_FREE_CHUNK)
            chunks[address + size] = (old - size, *_FREE_CHUNK)
        elif kind == _MERGE:
            old = chunks[address][0]
            del chunks[address + old]
            chunks[address] = (size, *_FREE_CHUNK)
        elif kind == _SEGMENT_ALLOC:
            segments[address] = size
            chunks[address] = (size, *_FREE_CHUNK)
        elif kind == _SEGMENT_FREE:
            del segments[address]
            del chunks[address]
        elif kind == _SEGMENT_MAP:
            map_range(segments, address, size)
            chunks[address] = (size, *_FREE_CHUNK)
        else:  # segment_unmap
            unmap_range(segments, address, size)
            del chunks[address]


class _DictCheckpoints:
    """The Python pass's snapshots; indexing gives copies to apply further events to."""

    def __init__(self, snapshots: list[tuple[_Chunks, _Segments]]) -> None:
        self.snapshots = snapshots

    def __getitem__(self, k: int) -> tuple[_Chunks, _Segments]:
        chunks, segments = self.snapshots[k]
        return chunks.copy(), segments.copy()


class Replay:
    """HeapState of every device of ``log`` at any event index."""

    def __init__(self, log: EventLog, *, checkpoint_every: int = 8192) -> None:
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
        self.log = log
        self.checkpoint_every = checkpoint_every
        self._devices: dict[int, _DeviceReplay] = {}
        cols = log.columns
        self._n = len(cols["seq"])
        heap = heap_mask(cols["kind"])
        devices = cols["device"]
        first = devices[:1]
        if len(first) and bool(heap.all()) and bool((devices == first[0]).all()):  # one allocator's log: no copies
            self._heap_devices: list[int] = [int(first[0])]
        else:
            self._heap_devices = sorted(set(np.unique(devices[heap]).tolist()))

    @property
    def devices(self) -> list[str]:
        """Names of the devices that have allocator events in the log."""
        return [self.log.devices[i].name for i in self._heap_devices]

    def _device_id(self, device: str | None) -> int:
        if device is None:
            if len(self._heap_devices) == 1:
                return int(self._heap_devices[0])
            if not self._heap_devices:
                if len(self.log.devices) == 1:
                    return 0
                raise ValueError("the log has no allocator events; name a device")
            raise ValueError(f"the log has several devices ({', '.join(self.devices)}); pass device=")
        return self.log.device_index(device)

    def _events_of(self, device_id: int) -> _DeviceReplay:
        """The device's events (its checkpoints not made yet where none was asked for)."""
        prepared = self._devices.get(device_id)
        if prepared is not None:
            return prepared
        cols = self.log.columns
        mask = (cols["device"] == device_id) & heap_mask(cols["kind"])
        positions = None if bool(mask.all()) else np.flatnonzero(mask)
        del mask
        prepared = _DeviceReplay(
            positions=positions,
            count=self._n if positions is None else len(positions),
            columns=tuple(
                np.ascontiguousarray(cols[n]) for n in ("kind", "address", "size", "requested", "tag", "stack")
            ),
            checkpoints=None,
        )
        self._devices[device_id] = prepared
        return prepared

    def _prepare(self, device_id: int) -> _DeviceReplay:
        """The device's events and checkpoints (made here in one pass where not made yet)."""
        prepared = self._events_of(device_id)
        if prepared.checkpoints is not None:
            return prepared
        step = self.checkpoint_every
        kernel = _load_kernel()
        if kernel is not None:
            extra = () if prepared.positions is None else (prepared.positions,)
            prepared.checkpoints = _PackedCheckpoints(kernel(*prepared.columns, step, *extra))
        else:
            chunks: _Chunks = {}
            segments: _Segments = {}
            snapshots: list[tuple[_Chunks, _Segments]] = [({}, {})]
            for start in range(0, prepared.count - step + 1, step):
                _apply(chunks, segments, self._events(prepared, start, start + step))
                snapshots.append((chunks.copy(), segments.copy()))
            prepared.checkpoints = _DictCheckpoints(snapshots)
        return prepared

    def _walk(self, p: _DeviceReplay, counts: list[int]) -> list[tuple[Any, Any]] | None:
        """Before the device has checkpoints, in C: the heaps after the first ``counts`` events
        (ascending) in one pass from the empty heap, its checkpoints made in the same pass when
        ``counts`` are several (a scrubber's stops) and kept; None where the pass is not compiled
        or the checkpoints exist. ``columns_at`` of one position walks from the last state asked
        for where that one is not later, else from the empty heap, ``_WALKS`` times at most: the
        next asks for the checkpoints, so that later positions replay from the nearest."""
        compiled = kernel_function("states")
        if compiled is None or _load_kernel() is None or p.checkpoints is not None:
            return None
        extra = () if p.positions is None else (p.positions,)
        if len(counts) == 1 and p.walks < _WALKS:
            p.walks += 1
            one = kernel_function("state")
            if one is not None and p.last is not None and p.last[0] <= counts[0]:
                return [one(*p.columns, *p.last[1], p.last[0], counts[0], *extra)]
            marks = counts
        elif len(counts) > 1:
            marks = sorted(set(counts).union(range(self.checkpoint_every, p.count + 1, self.checkpoint_every)))
        else:
            return None
        none = np.zeros(2, dtype=np.int64)  # one checkpoint, the empty heap: records [0, 0)
        records = compiled(*p.columns, b"", none, b"", none, p.count + 1, np.array(marks, dtype=np.int64), *extra)
        at = dict(zip(marks, records, strict=True))
        if len(counts) > 1:
            kept = [at[k] for k in range(self.checkpoint_every, p.count + 1, self.checkpoint_every)]
            p.checkpoints = _PackedCheckpoints(None, kept)
        return [at[count] for count in counts]

    @staticmethod
    def _events(p: _DeviceReplay, start: int, stop: int) -> Iterable[tuple[int, int, int, int, int, int]]:
        rows: slice | np.ndarray = slice(start, stop) if p.positions is None else p.positions[start:stop]
        return zip(*(column[rows].tolist() for column in p.columns), strict=True)

    def state_at(self, index: int = -1, *, device: str | None = None) -> HeapState:
        """The device's HeapState right after the event at position ``index`` of the log.

        Negative indices count from the end (``-1``: after the last event). ``device`` may be
        omitted when the log has one device.
        """
        return self.columns_at(index, device=device).to_state()

    def columns_at(self, index: int = -1, *, device: str | None = None) -> HeapColumns:
        """``state_at`` as arrays (``HeapColumns``), without a Python object per chunk."""
        if not -self._n <= index < max(self._n, 1):
            raise IndexError(f"event index {index} out of range for a log of {self._n} events")
        if index < 0:
            index += self._n
        device_id = self._device_id(device)
        p = self._events_of(device_id)
        applied = p.applied_through(index)
        name = self.log.devices[device_id].name
        if p.last is not None and p.last[0] == applied:  # the state asked for last (explain's, then a view's)
            return _heap_columns(name, p.last[1], self.log.strings)
        walked = self._walk(p, [applied])
        if walked is not None:
            p.last = (applied, walked[0])
            return _heap_columns(name, walked[0], self.log.strings)
        p = self._prepare(device_id)
        checkpoint = applied // self.checkpoint_every
        compiled = kernel_function("state") if isinstance(p.checkpoints, _PackedCheckpoints) else None
        if compiled is not None:  # the same rules applied in C to the packed checkpoint
            extra = () if p.positions is None else (p.positions,)
            start = checkpoint * self.checkpoint_every
            p.last = (applied, compiled(*p.columns, *p.checkpoints.records(checkpoint), start, applied, *extra))
            return _heap_columns(name, p.last[1], self.log.strings)
        chunks, segments = p.checkpoints[checkpoint]
        _apply(chunks, segments, self._events(p, checkpoint * self.checkpoint_every, applied))
        return _heap_columns(name, _dict_records(chunks, segments), self.log.strings)

    def columns_at_each(self, indices: Sequence[int], *, device: str | None = None) -> HeapsAt:
        """``columns_at`` of every log position of ``indices`` (each in range; any order), in one
        pass over the events: the heaps are made here (as packed records), each ``HeapColumns``
        built when indexed (``HeapsAt``)."""
        for index in indices:
            if not -self._n <= index < max(self._n, 1):
                raise IndexError(f"event index {index} out of range for a log of {self._n} events")
        device_id = self._device_id(device)
        p = self._events_of(device_id)
        counts = [p.applied_through(i + self._n if i < 0 else i) for i in indices]
        wanted = sorted(set(counts))
        walked = self._walk(p, wanted) if len(wanted) > 1 else None
        if walked is not None:
            heap_of = dict(zip(wanted, walked, strict=True))
            return HeapsAt(self.log.devices[device_id].name, [heap_of[count] for count in counts], self.log.strings)
        p = self._prepare(device_id)
        step = self.checkpoint_every
        compiled = kernel_function("states") if isinstance(p.checkpoints, _PackedCheckpoints) else None
        records: list[tuple[Any, Any]]
        if compiled is not None:
            packed = p.checkpoints
            extra = () if p.positions is None else (p.positions,)
            records = compiled(
                *p.columns, *packed.packed(), step,
                np.array(wanted, dtype=np.int64), *extra,
            )  # fmt: skip
        else:
            records = []
            applied = -1
            chunks: _Chunks = {}
            segments: _Segments = {}
            for count in wanted:
                if applied < 0 or (count // step) * step > applied:  # a checkpoint nearer than the last stop
                    chunks, segments = p.checkpoints[count // step]
                    applied = (count // step) * step
                _apply(chunks, segments, self._events(p, applied, count))
                applied = count
                records.append(_dict_records(chunks, segments))
        at = {count: k for k, count in enumerate(wanted)}
        return HeapsAt(self.log.devices[device_id].name, [records[at[count]] for count in counts], self.log.strings)


class HeapsAt:
    """Heaps of ``Replay.columns_at_each`` as packed records, each ``HeapColumns`` built when
    indexed (not kept: index each once)."""

    def __init__(self, device: str, records: list[tuple[Any, Any]], strings: Sequence[str]) -> None:
        self._device, self._records, self._strings = device, records, strings

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, k: int) -> HeapColumns:
        return _heap_columns(self._device, self._records[k], self._strings)


def _dict_records(chunks: _Chunks, segments: _Segments) -> tuple[np.ndarray, np.ndarray]:
    """The Python pass's heap as chunk and segment records (``_CHUNK_RECORD``, ``_SEGMENT_RECORD``)."""
    return (
        np.array([(a, *v) for a, v in chunks.items()], dtype=_CHUNK_RECORD),
        np.array(list(segments.items()), dtype=_SEGMENT_RECORD),
    )


def _heap_columns(device: str, records: tuple[Any, Any], strings: Sequence[str]) -> HeapColumns:
    """``HeapColumns`` of chunk and segment records (bytes as the C pass gives them, or arrays)."""
    c, g = (
        r if isinstance(r, np.ndarray) else np.frombuffer(r, dtype=t) for r, t in zip(records, _RECORDS, strict=True)
    )
    return HeapColumns.build(
        device, g["base"], g["size"], c["address"], c["size"], c["requested"], c["requested"] > 0, c["tag"],
        c["stack"], strings,
    )  # fmt: skip


def replay(log: EventLog, *, checkpoint_every: int = 8192) -> Replay:
    """A ``Replay`` of ``log``: ``replay(log).state_at(i, device="GPU:0")``."""
    return Replay(log, checkpoint_every=checkpoint_every)
