"""The options/query layer every front-end shares: ``profile(log, options)`` computes, once,
everything the views draw (per-device timelines, scrub points, tables, diagnosis).

Front-ends (widgets, magics, report, CLI) parse their options into ``ViewOptions`` and
call ``profile``; views render a ``Profile``. Nothing here draws or writes files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpuviz.analysis.diagnosis import Diagnosis, diagnose
from gpuviz.analysis.heapcolumns import HeapColumns
from gpuviz.analysis.moments import Pinning, opening_index, pinning, scrub_stops
from gpuviz.analysis.replay import HeapsAt, Replay, replay
from gpuviz.analysis.tables import (
    alive_at,
    allocation_table,
    call_site_table,
    gpus_first,
    mark_table,
    oom_table,
    placement_table,
    segment_table,
    transfer_table,
)
from gpuviz.analysis.timeline import Peak, TimelineSeries, series_extremes, timeline_series
from gpuviz.analysis.viewoptions import COLOR_BY, GROUP_BY, ViewOptions
from gpuviz.base.heapstate import HeapState
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind

__all__ = ["ViewOptions", "Profile", "DeviceProfile", "profile", "COLOR_BY", "GROUP_BY"]

_CHECKPOINTS = 32
"""A profile's replay keeps about this many heap checkpoints (one every 8192 events at least)."""
_PREFIX_ROWS = 4096
"""``DeviceProfile.allocated`` looks among at most this many allocations without building its index."""


def _by_address(address: np.ndarray, made: np.ndarray, times: np.ndarray, t0_ns: int) -> dict[int, tuple[int, int]]:
    """address -> (log position, time in ns from ``t0_ns``), from the arrays as Python ints."""
    shifted = [int(t) - t0_ns for t in times.tolist()]
    return dict(zip(address.tolist(), zip(made.tolist(), shifted, strict=True), strict=True))


@dataclass
class DeviceProfile:
    """Everything about one device's allocator."""

    device: str
    series: TimelineSeries
    peak: Peak
    scrub_index: np.ndarray  # log positions the scrubber offers, ascending (moments.scrub_stops)
    _replay: Replay = field(repr=False)
    opening: int = -1  # log position views open at: the first OOM, else the peak (moments.opening_index)

    _allocations: pd.DataFrame | None = field(default=None, repr=False)
    _by_address: tuple[np.ndarray, np.ndarray, np.ndarray, int] | None = field(default=None, repr=False)

    def state_at(self, index: int) -> HeapState:
        return self._replay.state_at(index, device=self.device)

    def columns_at(self, index: int) -> HeapColumns:
        """``state_at`` as arrays (``Replay.columns_at``)."""
        return self._replay.columns_at(index, device=self.device)

    def columns_at_each(self, indices: Sequence[int]) -> HeapsAt:
        """``columns_at`` of each log position of ``indices``, in one pass (``Replay.columns_at_each``)."""
        return self._replay.columns_at_each(indices, device=self.device)

    @property
    def allocations(self) -> pd.DataFrame:
        """``tables.allocation_table`` of this device (computed on first use)."""
        if self._allocations is None:
            self._allocations = allocation_table(self._replay.log, self.device)
        return self._allocations

    def allocated(
        self, index: int, t0_ns: int = 0, *, addresses: Iterable[int] | None = None
    ) -> dict[int, tuple[int, int]]:
        """address -> (log position of its alloc event, its time in ns from ``t0_ns``) for every
        allocation live right after log position ``index`` (-1: the end).

        ``addresses``: the live chunks' addresses when the caller has the state (e.g. from
        ``state_at``): each is then looked up in an index of the allocations by address
        (O(live · log allocations) instead of a scan of every allocation).
        """
        if index < 0:
            index += len(self._replay.log)
        if addresses is None:
            live = alive_at(self.allocations, index)
            return _by_address(
                live["address"].to_numpy(), live["alloc_index"].to_numpy(), live["alloc_ns"].to_numpy(), t0_ns
            )
        wanted = np.fromiter(addresses, dtype=np.int64)
        table = self.allocations
        made_by = int(np.searchsorted(table["alloc_index"].to_numpy(), index, side="right"))  # rows in alloc order
        if self._by_address is None and made_by <= _PREFIX_ROWS:  # early in the log: no index of every allocation
            latest = {a: r for r, a in enumerate(table["address"].to_numpy()[:made_by].tolist())}
            found = np.fromiter((a in latest for a in wanted.tolist()), dtype=np.bool_, count=len(wanted))
            rows = np.fromiter((latest[a] for a in wanted[found].tolist()), dtype=np.int64, count=int(found.sum()))
        else:
            order, keys, ranks, span = self._address_index()
            rank = np.searchsorted(ranks, wanted)
            known = (rank < len(ranks)) & (ranks[np.minimum(rank, len(ranks) - 1)] == wanted)
            # the latest allocation at each address made at or before ``index``
            at = np.searchsorted(keys, rank * span + index, side="right") - 1
            found = known & (at >= 0) & (keys[np.maximum(at, 0)] // span == rank)
            rows = order[at[found]]
        made = table["alloc_index"].to_numpy()[rows]
        freed = table["free_index"].to_numpy()[rows]
        alive = (freed < 0) | (freed > index)
        times = table["alloc_ns"].to_numpy()[rows]
        return _by_address(wanted[found][alive], made[alive], times[alive], t0_ns)

    def _address_index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """The allocation table's rows sorted by (address, alloc_index): ``order`` (row numbers),
        ``keys`` = address rank · span + alloc_index (ascending), the distinct addresses (``ranks``,
        ascending), and ``span`` (> every log position)."""
        if self._by_address is None:
            table = self.allocations
            address = np.ascontiguousarray(table["address"].to_numpy(), dtype=np.int64)
            order = np.argsort(address, kind="stable")  # rows are in alloc_index order: kept so per address
            by_address = address[order]
            starts = np.ones(len(order), dtype=bool)
            starts[1:] = by_address[1:] != by_address[:-1]
            rank = np.cumsum(starts) - 1  # per sorted row: its address's rank
            span = len(self._replay.log) + 1
            keys = rank * span + table["alloc_index"].to_numpy()[order]
            self._by_address = (order, keys, by_address[starts], span)
        return self._by_address

    def pinning_at(self, index: int) -> Pinning | None:
        """The pinning analysis when log position ``index`` is an OOM of this device, else None."""
        log = self._replay.log
        if index < 0 or index >= len(log) or int(log["kind"][index]) != Kind.OOM:
            return None
        if log.devices[int(log["device"][index])].name != self.device:
            return None
        return pinning(self.state_at(index), int(log["requested"][index]), log=log, at_index=index)


@dataclass
class Profile:
    log: EventLog
    options: ViewOptions
    devices: dict[str, DeviceProfile]
    transfers: pd.DataFrame
    marks: pd.DataFrame
    ooms: pd.DataFrame
    segments: pd.DataFrame
    placements: pd.DataFrame
    call_sites: pd.DataFrame
    diagnosis: Diagnosis
    t0_ns: int
    strict: bool = True

    @property
    def device(self) -> str | None:
        """The device the single-device views show."""
        wanted = self.options.device
        if wanted is not None:
            if wanted not in self.devices and not self.strict:
                return None  # a live view of a device that has no events yet
            if wanted not in self.devices:
                known = ", ".join(self.devices) or "none"
                raise ValueError(f"device {wanted!r} has no allocator events (devices: {known})")
            return wanted
        gpus = [d for d in self.devices if d.startswith("GPU")]
        candidates = gpus or list(self.devices)
        return candidates[0] if candidates else None


def profile(log: EventLog, options: ViewOptions | None = None, *, strict: bool = True) -> Profile:
    """Compute every derived result of ``log`` that the views need.

    ``strict``: a ``ViewOptions.device`` without allocator events raises ``ValueError``
    (False, for live views of a log that is still growing, shows nothing for it yet).
    """
    options = options or ViewOptions()
    # the views ask for a few dozen states (scrub stops, the opening moment): a few dozen
    # checkpoints serve them, each a copy of the whole heap made in one pass over the log
    heap = replay(log, checkpoint_every=max(8192, len(log) // _CHECKPOINTS))
    devices = {}
    for name in gpus_first(heap.devices):
        series = timeline_series(log, name)
        top = series_extremes(series).peak
        devices[name] = DeviceProfile(
            name,
            series,
            top,
            scrub_stops(log, name, count=options.scrub_points, series=series),
            heap,
            opening_index(log, name, series=series),
        )
    time_ns = log["time_ns"]
    transfers = transfer_table(log)
    result = Profile(
        log=log,
        options=options,
        devices=devices,
        transfers=transfers,
        marks=mark_table(log),
        ooms=oom_table(log),
        segments=segment_table(log),
        placements=placement_table(log),
        call_sites=call_site_table(log),
        diagnosis=diagnose(
            log,
            top=options.top,
            group_by=options.group_by,
            user_code=options.user_code,
            heap=heap,
            transfers=transfers,
            series={name: d.series for name, d in devices.items()},
            allocations={name: d.allocations for name, d in devices.items()},  # kept for the views too
        ),
        t0_ns=int(time_ns.min()) if len(time_ns) else 0,
        strict=strict,
    )
    _ = result.device  # validates options.device
    return result
