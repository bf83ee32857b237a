"""Following a log while it grows: what a live view needs, at a cost proportional to the
events that are new since the last look (never to the whole log).

``LiveFollower(log).update()`` reads the rows appended since its previous call and returns,
per device with allocator events among them, the timeline points to append and whether its
heap changed. It reads the packed rows in one compiled pass (``gpuviz.analysis._livekernel``,
where a C compiler built it); its NumPy twin (no Python loop per event, ``GPUVIZ_NATIVE=0``)
gives the same points and heaps.
``heap(device)`` gives the newest in-use chunks and segments of a device.

The newest heap follows from the net effect of the new events: an address's last
``alloc``/``free`` decides whether a chunk starts there, its last ``segment_alloc`` /
``segment_free`` whether a segment does (where segments grow and shrink, with
``segment_map`` / ``segment_unmap``, the segment events are applied one by one, in order).
Free chunks are the gaps between the chunks in use (the allocator coalesces free neighbours
at once). Sizes in bytes, times in ns.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from gpuviz.analysis.native import kernel_function
from gpuviz.base.heapstate import ChunkState, HeapState, SegmentState
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import ROW_DTYPE, Kind
from gpuviz.log.segments import map_range, unmap_range

__all__ = ["HeapArrays", "LiveFollower", "LiveHeap", "LivePoints", "thin_points"]

_ALLOCATOR_KINDS = np.array([int(k) for k in (Kind.SEGMENT_ALLOC, Kind.SEGMENT_FREE, Kind.ALLOC, Kind.FREE,
                                              Kind.SPLIT, Kind.MERGE, Kind.OOM, Kind.SEGMENT_MAP,
                                              Kind.SEGMENT_UNMAP)])  # fmt: skip
_ALLOC, _FREE, _SEGMENT_ALLOC, _SEGMENT_FREE = (
    int(Kind.ALLOC),
    int(Kind.FREE),
    int(Kind.SEGMENT_ALLOC),
    int(Kind.SEGMENT_FREE),
)
_SEGMENT_MAP, _SEGMENT_UNMAP = int(Kind.SEGMENT_MAP), int(Kind.SEGMENT_UNMAP)
_GROWING = np.array([_SEGMENT_MAP, _SEGMENT_UNMAP])


@dataclass
class LivePoints:
    """New timeline points of one device: log positions, times (ns), bytes in use, bytes
    requested and pool bytes after each of its new allocator events."""

    index: np.ndarray
    time_ns: np.ndarray
    bytes_in_use: np.ndarray
    bytes_requested: np.ndarray
    pool_bytes: np.ndarray

    def __len__(self) -> int:
        return len(self.index)


_POINT_FIELDS = ("index", "time_ns", "bytes_in_use", "bytes_requested", "pool_bytes")


def thin_points(points: LivePoints, most: int | None) -> LivePoints:
    """At most ``most`` of ``points`` (all with None; else evenly spaced, always keeping the one
    of most bytes in use and the last), in arrays of their own."""
    if most is None or len(points) <= most:
        return LivePoints(*(np.array(getattr(points, name)) for name in _POINT_FIELDS))
    keep = np.unique(np.concatenate([np.linspace(0, len(points) - 1, most - 1).astype(np.int64),
                                     [int(np.argmax(points.bytes_in_use))]]))  # fmt: skip
    return LivePoints(*(getattr(points, name)[keep] for name in _POINT_FIELDS))


@dataclass
class LiveHeap:
    """The newest heap of one device: chunks in use ``address -> (size, requested, tag
    index)`` and segments ``base -> size``; the running totals in bytes."""

    chunks: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    segments: dict[int, int] = field(default_factory=dict)
    bytes_in_use: int = 0
    bytes_requested: int = 0
    pool_bytes: int = 0
    events: int = 0  # allocator events of the device seen so far


@dataclass(frozen=True)
class HeapArrays:
    """The newest heap of one device as arrays sorted by address (int64, bytes): its segments'
    bases and sizes, and its chunks in use (addresses, sizes, requested bytes), each inside a
    segment. Free chunks are the gaps; what a cheap live map is drawn from."""

    device: str
    segment_base: np.ndarray
    segment_size: np.ndarray
    address: np.ndarray
    size: np.ndarray
    requested: np.ndarray


KEEP_ROWS = 1 << 18
"""The follower keeps room for the points of this many rows between updates (40 bytes a row);
a bigger backlog (a first look at a long log) gets room of its own, given back after."""

_IS_ALLOCATOR = np.zeros(256, dtype=bool)  # indexed by kind code: cheaper than ``np.isin``
_IS_ALLOCATOR[_ALLOCATOR_KINDS] = True

# The role of each kind code in the compiled pass (``_livekernel.c`` names them alike).
_OTHER, _ROLE_ALLOC, _ROLE_FREE, _ROLE_SEGMENT_ALLOC, _ROLE_SEGMENT_FREE, _ROLE_MAP, _ROLE_UNMAP = range(1, 8)
_ROLE_OF = {Kind.SPLIT: _OTHER, Kind.MERGE: _OTHER, Kind.OOM: _OTHER, Kind.ALLOC: _ROLE_ALLOC, Kind.FREE: _ROLE_FREE,
            Kind.SEGMENT_ALLOC: _ROLE_SEGMENT_ALLOC, Kind.SEGMENT_FREE: _ROLE_SEGMENT_FREE,
            Kind.SEGMENT_MAP: _ROLE_MAP, Kind.SEGMENT_UNMAP: _ROLE_UNMAP}  # fmt: skip
_ROLES = bytes(_ROLE_OF.get(code, 0) for code in range(256))  # type: ignore[call-overload]
assert sorted(int(k) for k in _ROLE_OF) == sorted(_ALLOCATOR_KINDS.tolist())
_LAYOUT_FIELDS = {"time_ns": "<i8", "kind": "|u1", "device": "<i2", "address": "<i8", "size": "<i8",
                  "requested": "<i8", "tag": "<i4"}  # fmt: skip
_ROW_FIELDS: Mapping[str, tuple[Any, ...]] = ROW_DTYPE.fields or {}
assert all(_ROW_FIELDS[name][0].str == dt for name, dt in _LAYOUT_FIELDS.items())
_LAYOUT = (ROW_DTYPE.itemsize, *(int(_ROW_FIELDS[name][1]) for name in _LAYOUT_FIELDS))


def _apply_segment(segments: dict[int, int], role: int, address: int, size: int) -> None:
    """One segment event (by its role) on ``segments`` (base -> size, bytes)."""
    if role == _ROLE_SEGMENT_ALLOC:
        segments[address] = size
    elif role == _ROLE_SEGMENT_FREE:
        segments.pop(address, None)
    elif role == _ROLE_MAP:
        map_range(segments, address, size)
    else:
        unmap_range(segments, address, size)


def _last_per_address(addresses: np.ndarray) -> np.ndarray:
    """Positions (into ``addresses``) of the last occurrence of each distinct address."""
    _, first_in_reversed = np.unique(addresses[::-1], return_index=True)
    return np.asarray(len(addresses) - 1 - first_in_reversed)


class LiveFollower:
    """Follows ``log`` as it grows; ``update()`` reads only the rows new since the last call."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.position = 0  # rows read so far
        self.first_time_ns: int | None = None  # time of the log's first row (ns), once read
        self.last_time_ns: int | None = None  # time of the last row read (ns)
        self.heaps: dict[str, LiveHeap] = {}
        self._points = np.empty(0, dtype=np.int64)  # the compiled pass writes points here, reused

    def heap(self, device: str) -> LiveHeap:
        return self.heaps.setdefault(device, LiveHeap())

    def state(self, device: str) -> HeapState:
        """The newest HeapState of ``device``: its chunks in use, and the gaps between them
        as free chunks."""
        heap = self.heap(device)
        strings = self.log.strings
        bases = sorted(heap.segments)
        grouped: dict[int, list[ChunkState]] = {base: [] for base in bases}
        for address in sorted(heap.chunks):
            found = bisect_right(bases, address) - 1
            if found < 0 or address >= bases[found] + heap.segments[bases[found]]:
                continue  # not inside a live segment (cannot happen in a consistent log)
            size, requested, tag = heap.chunks[address]
            grouped[bases[found]].append(ChunkState(address, size, requested, True, strings[tag] if tag >= 0 else None))
        segments = []
        for base in bases:
            chunks: list[ChunkState] = []
            cursor, end = base, base + heap.segments[base]
            for chunk in grouped[base]:
                if chunk.address > cursor:
                    chunks.append(ChunkState(cursor, chunk.address - cursor, 0, False))
                chunks.append(chunk)
                cursor = chunk.address + chunk.size
            if cursor < end:
                chunks.append(ChunkState(cursor, end - cursor, 0, False))
            segments.append(SegmentState(base, heap.segments[base], tuple(chunks)))
        return HeapState(device, tuple(segments))

    def arrays(self, device: str) -> HeapArrays:
        """The newest heap of ``device`` as ``HeapArrays`` (no object per chunk)."""
        heap = self.heap(device)
        n = len(heap.segments)
        bases = np.fromiter(heap.segments.keys(), dtype=np.int64, count=n)
        sizes = np.fromiter(heap.segments.values(), dtype=np.int64, count=n)
        order = np.argsort(bases)
        bases, sizes = bases[order], sizes[order]
        m = len(heap.chunks)
        address = np.fromiter(heap.chunks.keys(), dtype=np.int64, count=m)
        values = np.fromiter(chain.from_iterable(heap.chunks.values()), dtype=np.int64, count=3 * m).reshape(m, 3)
        order = np.argsort(address)
        address, size, requested = address[order], values[order, 0], values[order, 1]
        found = np.searchsorted(bases, address, side="right") - 1
        inside = np.zeros(m, dtype=bool)
        if n:
            inside = (found >= 0) & (address < (bases + sizes)[np.maximum(found, 0)])
        return HeapArrays(device, bases, sizes, address[inside], size[inside], requested[inside])

    def update(self, *, most: int | None = None) -> dict[str, tuple[LivePoints, bool]]:
        """Read the new rows: per device with new allocator events, (its new timeline points,
        whether its heap changed). With ``most``, at most that many points a device
        (``thin_points``): what a view draws, without making room for every point."""
        if most is not None and most < 2:
            raise ValueError(f"most must be None or >= 2, got {most!r}")
        start = self.position
        scan = kernel_function("scan", "_livekernel")
        if scan is None:
            return {name: (thin_points(points, most), changed)
                    for name, (points, changed) in self._update_numpy(start).items()}  # fmt: skip
        names = self.log.device_names
        totals = np.zeros((len(names), 4), dtype=np.int64)  # per device id: in use, requested, pool, events
        for device_id, name in enumerate(names):
            if (heap := self.heaps.get(name)) is not None:
                totals[device_id] = (heap.bytes_in_use, heap.bytes_requested, heap.pool_bytes, heap.events)
        pieces = self.log.row_pieces_since(start)  # the flushed blocks themselves: no copy, no gathers
        rows = sum(len(piece) for piece in pieces) // _LAYOUT[0]
        buffer = self._points  # room for a point a row, kept for the next updates (up to KEEP_ROWS)
        if len(buffer) < 5 * rows:
            buffer = np.empty(5 * rows + rows // 2, dtype=np.int64)
            self._points = buffer if rows <= KEEP_ROWS else self._points
        n, first_ns, last_ns, *parts = scan(pieces, start, _LAYOUT, _ROLES, totals, buffer)
        if not n:
            return {}
        self.position = start + n
        self.first_time_ns = first_ns if self.first_time_ns is None else self.first_time_ns
        self.last_time_ns = last_ns
        offsets_b, chunk_offsets_b, chunks, segments_b = parts
        offsets, chunk_offsets = np.frombuffer(offsets_b, np.int64), np.frombuffer(chunk_offsets_b, np.int64)
        points = buffer[: 5 * int(offsets[-1])].reshape(-1, 5)
        segments = np.frombuffer(segments_b, np.int64).reshape(-1, 4)
        apply_chunks = kernel_function("apply_chunks", "_livekernel")
        assert apply_chunks is not None
        result: dict[str, tuple[LivePoints, bool]] = {}
        for device_id in np.flatnonzero(np.diff(offsets)).tolist():
            name = names[device_id]
            heap = self.heap(name)
            heap.bytes_in_use, heap.bytes_requested, heap.pool_bytes, heap.events = totals[device_id].tolist()
            first, last = int(chunk_offsets[device_id]), int(chunk_offsets[device_id + 1])
            apply_chunks(chunks, first, last, heap.chunks)
            mine = segments[segments[:, 0] == device_id].tolist() if len(segments) else []
            for _, role, address, size in mine:  # in order (few): an address's last event decides
                _apply_segment(heap.segments, role, address, size)
            lo, hi = int(offsets[device_id]), int(offsets[device_id + 1])
            result[name] = (thin_points(LivePoints(*points[lo:hi].T), most), last > first or bool(mine))
        return result

    def _update_numpy(self, start: int) -> dict[str, tuple[LivePoints, bool]]:
        """``update`` in NumPy (the compiled pass's twin): each field of the allocator rows one
        strided gather."""
        new = self.log.rows_since(start)  # packed rows (ROW_DTYPE)
        if not len(new):
            return {}
        self.position = start + len(new)
        if self.first_time_ns is None:
            self.first_time_ns = int(new["time_ns"][0])
        self.last_time_ns = int(new["time_ns"][-1])
        rows = np.flatnonzero(_IS_ALLOCATOR[new["kind"]])
        if not len(rows):
            return {}
        kind, device, address, size = (new[name][rows] for name in ("kind", "device", "address", "size"))
        requested, tag, time_ns = (new[name][rows] for name in ("requested", "tag", "time_ns"))
        names = self.log.device_names
        result: dict[str, tuple[LivePoints, bool]] = {}
        for device_id in np.unique(device).tolist():
            mine = device == device_id
            name = names[device_id]
            heap = self.heap(name)
            k, a, s, r = kind[mine], address[mine], size[mine], requested[mine]
            zero = np.zeros_like(s)
            in_use = heap.bytes_in_use + np.cumsum(np.where(k == _ALLOC, s, np.where(k == _FREE, -s, zero)))
            in_req = heap.bytes_requested + np.cumsum(np.where(k == _ALLOC, r, np.where(k == _FREE, -r, zero)))
            grows = (k == _SEGMENT_ALLOC) | (k == _SEGMENT_MAP)
            shrinks = (k == _SEGMENT_FREE) | (k == _SEGMENT_UNMAP)
            pool = heap.pool_bytes + np.cumsum(np.where(grows, s, np.where(shrinks, -s, zero)))
            changed = self._apply_net(heap, k, a, s, r, tag[mine])
            heap.bytes_in_use, heap.bytes_requested, heap.pool_bytes = int(in_use[-1]), int(in_req[-1]), int(pool[-1])
            heap.events += len(k)
            points = LivePoints(start + rows[mine], time_ns[mine], in_use, in_req, pool)
            result[name] = (points, changed)
        return result

    @staticmethod
    def _apply_net(heap: LiveHeap, k: np.ndarray, a: np.ndarray, s: np.ndarray, r: np.ndarray, t: np.ndarray) -> bool:
        changed = False
        chunk_events = np.flatnonzero((k == _ALLOC) | (k == _FREE))
        if len(chunk_events):
            last = chunk_events[_last_per_address(a[chunk_events])]
            for kind, address, size, requested, tag in zip(
                k[last].tolist(), a[last].tolist(), s[last].tolist(), r[last].tolist(), t[last].tolist(), strict=True
            ):
                if kind == _ALLOC:
                    heap.chunks[address] = (size, requested, tag)
                else:
                    heap.chunks.pop(address, None)
            changed = True
        if np.isin(k, _GROWING).any():  # segments that grow and shrink: every segment event, in order
            segment_events = np.flatnonzero((k == _SEGMENT_ALLOC) | (k == _SEGMENT_FREE) | np.isin(k, _GROWING))
            for kind, address, size in zip(k[segment_events].tolist(), a[segment_events].tolist(),
                                           s[segment_events].tolist(), strict=True):  # fmt: skip
                _apply_segment(heap.segments, _ROLES[kind], address, size)
            return True
        segment_events = np.flatnonzero((k == _SEGMENT_ALLOC) | (k == _SEGMENT_FREE))
        if len(segment_events):
            last = segment_events[_last_per_address(a[segment_events])]
            for kind, address, size in zip(k[last].tolist(), a[last].tolist(), s[last].tolist(), strict=True):
                if kind == _SEGMENT_ALLOC:
                    heap.segments[address] = size
                else:
                    heap.segments.pop(address, None)
            changed = True
        return changed
