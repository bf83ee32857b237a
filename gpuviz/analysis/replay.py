"""Replay: rebuild HeapState at any event index by applying recorded events only.

Replay never re-runs the best-fit policy; it applies what the allocator decided. One
property ties the two: replaying an allocator's log reproduces its state exactly,
``replay(alloc.log).state_at(-1) == alloc.state()``.

Random access is served from checkpoints: the first query on a device makes one pass
over its events and keeps a snapshot every ``checkpoint_every`` events; later queries
start from the nearest snapshot at or before the index.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from gpuviz.base.heapstate import ChunkState, HeapState, SegmentState
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind

__all__ = ["Replay", "replay", "HEAP_KINDS"]

HEAP_KINDS = (Kind.SEGMENT_ALLOC, Kind.SEGMENT_FREE, Kind.ALLOC, Kind.FREE, Kind.SPLIT, Kind.MERGE)
_SEGMENT_ALLOC, _SEGMENT_FREE, _ALLOC, _FREE, _SPLIT, _MERGE = (int(k) for k in HEAP_KINDS)

# chunk address -> (size, requested, tag index, stack index); requested == 0 means free
_Chunks = dict[int, tuple[int, int, int, int]]
_FREE_CHUNK = (0, -1, -1)  # requested, tag, stack of a free chunk
_Segments = dict[int, int]


@dataclass
class _DeviceReplay:
    positions: np.ndarray  # log positions of this device's heap events
    kinds: list[int]
    addresses: list[int]
    sizes: list[int]
    requested: list[int]
    tags: list[int]
    stacks: list[int]
    checkpoints: list[tuple[_Chunks, _Segments]]


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
        else:  # segment_free
            del segments[address]
            del chunks[address]


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
        heap = np.isin(cols["kind"], [int(k) for k in HEAP_KINDS])
        self._heap_devices: list[int] = sorted(set(np.unique(cols["device"][heap]).tolist()))

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

    def _prepare(self, device_id: int) -> _DeviceReplay:
        prepared = self._devices.get(device_id)
        if prepared is not None:
            return prepared
        cols = self.log.columns
        mask = (cols["device"] == device_id) & np.isin(cols["kind"], [int(k) for k in HEAP_KINDS])
        positions = np.flatnonzero(mask)
        prepared = _DeviceReplay(
            positions=positions,
            kinds=cols["kind"][positions].tolist(),
            addresses=cols["address"][positions].tolist(),
            sizes=cols["size"][positions].tolist(),
            requested=cols["requested"][positions].tolist(),
            tags=cols["tag"][positions].tolist(),
            stacks=cols["stack"][positions].tolist(),
            checkpoints=[({}, {})],
        )
        chunks: _Chunks = {}
        segments: _Segments = {}
        step = self.checkpoint_every
        for start in range(0, len(positions) - step + 1, step):
            _apply(chunks, segments, self._events(prepared, start, start + step))
            prepared.checkpoints.append((chunks.copy(), segments.copy()))
        self._devices[device_id] = prepared
        return prepared

    @staticmethod
    def _events(p: _DeviceReplay, start: int, stop: int) -> Iterable[tuple[int, int, int, int, int, int]]:
        return zip(
            p.kinds[start:stop],
            p.addresses[start:stop],
            p.sizes[start:stop],
            p.requested[start:stop],
            p.tags[start:stop],
            p.stacks[start:stop],
            strict=True,
        )

    def state_at(self, index: int = -1, *, device: str | None = None) -> HeapState:
        """The device's HeapState right after the event at position ``index`` of the log.

        Negative indices count from the end (``-1``: after the last event). ``device`` may be
        omitted when the log has one device.
        """
        if not -self._n <= index < max(self._n, 1):
            raise IndexError(f"event index {index} out of range for a log of {self._n} events")
        if index < 0:
            index += self._n
        device_id = self._device_id(device)
        p = self._prepare(device_id)
        applied = int(np.searchsorted(p.positions, index, side="right"))
        checkpoint = applied // self.checkpoint_every
        base_chunks, base_segments = p.checkpoints[checkpoint]
        chunks = base_chunks.copy()
        segments = base_segments.copy()
        _apply(chunks, segments, self._events(p, checkpoint * self.checkpoint_every, applied))
        return self._to_state(self.log.devices[device_id].name, chunks, segments)

    def _to_state(self, device: str, chunks: _Chunks, segments: _Segments) -> HeapState:
        strings = self.log.strings
        bases = sorted(segments)
        grouped: dict[int, list[ChunkState]] = {base: [] for base in bases}
        for address in sorted(chunks):
            size, requested, tag, stack = chunks[address]
            base = bases[bisect_right(bases, address) - 1]
            grouped[base].append(
                ChunkState(address, size, requested, requested > 0, strings[tag] if tag >= 0 else None, stack)
            )
        return HeapState(device, tuple(SegmentState(b, segments[b], tuple(grouped[b])) for b in bases))


def replay(log: EventLog, *, checkpoint_every: int = 8192) -> Replay:
    """A ``Replay`` of ``log``: ``replay(log).state_at(i, device="GPU:0")``."""
    return Replay(log, checkpoint_every=checkpoint_every)
