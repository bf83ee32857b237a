"""Timeline series: bytes in use, requested, pool, largest free chunk and fragmentation.

All series are computed with NumPy from the log's columns (cumulative sums over the
allocator events of one device), never with a Python loop per event (10M events in a
fraction of a second: a compiled pass measured no gain users would notice). Running sums start
at zero at the first event of the log given: a view that starts mid-run counts from there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind

__all__ = [
    "TimelineSeries",
    "ResampledSeries",
    "Peak",
    "Waste",
    "timeline_series",
    "resample",
    "peak",
    "internal_waste",
    "Extremes",
    "extremes",
    "series_extremes",
    "operation_ends",
    "settled",
    "times_inferred",
    "devices_by_peak",
]

_ALLOCATOR_KINDS = [
    int(k) for k in (Kind.SEGMENT_ALLOC, Kind.SEGMENT_FREE, Kind.ALLOC, Kind.FREE, Kind.SPLIT, Kind.MERGE, Kind.OOM,
                     Kind.SEGMENT_MAP, Kind.SEGMENT_UNMAP)
]  # fmt: skip
assert (
    sorted(_ALLOCATOR_KINDS)
    == [*range(Kind.OOM + 1), Kind.SEGMENT_MAP, Kind.SEGMENT_UNMAP]
    == [*range(Kind.OOM + 1), *range(Kind.SEGMENT_MAP, max(Kind) + 1)]
)  # so that two comparisons find them
_IN_USE_SIGN = np.zeros(256, dtype=np.int8)
_IN_USE_SIGN[[Kind.ALLOC, Kind.FREE]] = (1, -1)
_POOL_SIGN = np.zeros(256, dtype=np.int8)
_POOL_SIGN[[Kind.SEGMENT_ALLOC, Kind.SEGMENT_FREE, Kind.SEGMENT_MAP, Kind.SEGMENT_UNMAP]] = (1, -1, 1, -1)
METRICS = ("bytes_in_use", "bytes_requested", "pool_bytes", "largest_free", "fragmentation")


@dataclass(frozen=True)
class TimelineSeries:
    """One value per allocator event of ``device`` (sizes in bytes, times in ns).

    ``index`` holds each event's position in the log, ``seq`` its sequence number.
    """

    device: str
    index: np.ndarray
    seq: np.ndarray
    time_ns: np.ndarray
    bytes_in_use: np.ndarray
    bytes_requested: np.ndarray
    pool_bytes: np.ndarray
    largest_free: np.ndarray
    fragmentation: np.ndarray
    settled: np.ndarray  # bool per event: it ends a public operation (see ``operation_ends``)

    def __len__(self) -> int:
        return len(self.time_ns)

    @property
    def internal_waste(self) -> np.ndarray:
        """Bytes handed out beyond what was asked for (size - requested), per event."""
        waste: np.ndarray = self.bytes_in_use - self.bytes_requested
        return waste


@dataclass(frozen=True)
class ResampledSeries:
    """A series reduced to at most N time buckets, keeping each bucket's min and max.

    ``time_ns[i]`` is the start of bucket i; ``minimum[m][i]`` / ``maximum[m][i]`` the
    extremes of metric m over the events in it, so short spikes survive downsampling.
    """

    device: str
    time_ns: np.ndarray
    minimum: dict[str, np.ndarray]
    maximum: dict[str, np.ndarray]


@dataclass(frozen=True)
class Peak:
    """The highest bytes in use of a device: ``bytes`` at log position ``index``."""

    device: str
    bytes: int
    index: int
    seq: int
    time_ns: int


@dataclass(frozen=True)
class Waste:
    """Internal waste (chunk size - requested bytes of live allocations), in bytes."""

    device: str
    at_end: int
    at_peak: int
    maximum: int


def operation_ends(kind: np.ndarray) -> np.ndarray:
    """Which events of one device's allocator event kinds (in log order) end a public operation.

    One public operation (an allocation, a free, a failed allocation, a release of segments)
    records several events; the states between them are transient (a ``split``'s remainder is
    free until its ``alloc``, a freshly reserved segment is wholly free until it is carved).
    An event is *within* an operation when the next event of the same device continues it:

    - a ``split`` continues a ``segment_alloc`` just before it (the new segment is carved);
    - a ``merge`` continues a ``free`` or ``merge`` just before it (coalescing after a free);
    - an ``alloc`` continues a ``split`` or a ``segment_alloc`` just before it;
    - a ``segment_alloc`` or ``segment_free`` continues a ``segment_free`` just before it
      (garbage collection releasing segments, then reserving);
    - a ``merge``, ``split``, ``alloc`` or ``segment_map`` continues a ``segment_map`` just
      before it (a growing segment mapped, joined, carved); a ``segment_unmap`` continues a
      ``split``; a ``segment_map`` or ``segment_unmap`` continues a ``segment_unmap`` (free
      ranges unmapped on release, then mapping).

    Every other event ends its operation, and so does the last event. Sampling the timeline at
    these events shows the state users' code saw between its calls, without transient spikes.
    """
    kind = np.asarray(kind)
    ends = np.ones(len(kind), dtype=bool)
    if len(kind) < 2:
        return ends
    this, nxt = kind[:-1], kind[1:]
    continues = (
        ((nxt == Kind.SPLIT) & (this == Kind.SEGMENT_ALLOC))
        | ((nxt == Kind.MERGE) & ((this == Kind.FREE) | (this == Kind.MERGE)))
        | ((nxt == Kind.ALLOC) & ((this == Kind.SPLIT) | (this == Kind.SEGMENT_ALLOC)))
        | (((nxt == Kind.SEGMENT_ALLOC) | (nxt == Kind.SEGMENT_FREE)) & (this == Kind.SEGMENT_FREE))
        | (
            ((nxt == Kind.MERGE) | (nxt == Kind.SPLIT) | (nxt == Kind.ALLOC) | (nxt == Kind.SEGMENT_MAP))
            & (this == Kind.SEGMENT_MAP)
        )
        | ((nxt == Kind.SEGMENT_UNMAP) & (this == Kind.SPLIT))
        | (((nxt == Kind.SEGMENT_MAP) | (nxt == Kind.SEGMENT_UNMAP)) & (this == Kind.SEGMENT_UNMAP))
    )
    ends[:-1] = ~continues
    return ends


def _single_device(log: EventLog, device: str | None) -> tuple[str, int]:
    if device is not None:
        return device, log.device_index(device)
    cols = log.columns
    present = np.unique(cols["device"][np.isin(cols["kind"], _ALLOCATOR_KINDS)])
    if len(present) == 1:
        index = int(present[0])
        return log.devices[index].name, index
    if len(present) == 0 and len(log.devices) == 1:
        return log.devices[0].name, 0
    raise ValueError(f"the log has allocator events of several devices ({', '.join(log.device_names)}); pass device=")


def _running_values(
    kind: np.ndarray, size: np.ndarray, requested: np.ndarray, largest_free: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Bytes in use, bytes requested, pool bytes, largest free chunk and fragmentation after
    each of one device's allocator events (columns picked in log order), summed from zero."""
    use_sign = _IN_USE_SIGN[kind]  # +1 alloc, -1 free, 0 otherwise
    in_use = np.multiply(size, use_sign, dtype=np.int64)
    np.cumsum(in_use, out=in_use)
    in_req = np.multiply(requested, use_sign, dtype=np.int64)
    np.cumsum(in_req, out=in_req)
    pool = np.multiply(size, _POOL_SIGN[kind], dtype=np.int64)  # +1 segment_alloc, -1 segment_free
    np.cumsum(pool, out=pool)
    largest = np.maximum(largest_free, 0)
    free = pool - in_use
    # (free - largest) / free where free > 0, else 0.0; the difference is exact in float64
    # (byte counts < 2**53), as the division converts it anyway
    fragmentation = np.subtract(free, largest, dtype=np.float64)
    nothing_free = free <= 0
    np.divide(fragmentation, free, out=fragmentation, where=~nothing_free)
    fragmentation[nothing_free] = 0.0
    return in_use, in_req, pool, largest, fragmentation


def _allocator_positions(log: EventLog, device_id: int, start: int = 0, stop: int | None = None) -> np.ndarray | None:
    """Log positions in [start, stop) of the device's allocator events; None when that is all of them."""
    cols = log.columns
    window = slice(start, stop)
    kinds = cols["kind"][window]
    mask = (cols["device"][window] == device_id) & ((kinds <= Kind.OOM) | (kinds >= Kind.SEGMENT_MAP))
    if bool(mask.all()):
        return None
    positions: np.ndarray = np.flatnonzero(mask)
    positions += start
    return positions


def timeline_series(log: EventLog, device: str | None = None) -> TimelineSeries:
    """The per-event timeline of one device's allocator."""
    name, device_id = _single_device(log, device)
    cols = log.columns
    # (vectorised without temporaries per kind: 10M events in well under a second)
    picked = _allocator_positions(log, device_id)
    if picked is None:  # an allocator-only log of this device: the columns themselves
        positions = np.arange(len(log))
        pick: Callable[[np.ndarray], np.ndarray] = lambda column: column  # noqa: E731
    else:
        positions = picked
        pick = lambda column: column[picked]  # noqa: E731
    kind = pick(cols["kind"])
    in_use, in_req, pool, largest, fragmentation = _running_values(
        kind, pick(cols["size"]), pick(cols["requested"]), pick(cols["largest_free"])
    )
    return TimelineSeries(
        device=name,
        index=positions,
        seq=pick(cols["seq"]),
        time_ns=pick(cols["time_ns"]),
        bytes_in_use=in_use,
        bytes_requested=in_req,
        pool_bytes=pool,
        largest_free=largest,
        fragmentation=fragmentation,
        settled=operation_ends(kind),
    )


def settled(series: TimelineSeries) -> TimelineSeries:
    """``series`` at the events that end a public operation only (``operation_ends``): what a
    timeline draws, so that no transient state between a ``split`` and its ``alloc`` shows."""
    keep = series.settled
    return TimelineSeries(
        device=series.device,
        **{name: getattr(series, name)[keep] for name in ("index", "seq", "time_ns", *METRICS, "settled")},
    )


def resample(series: TimelineSeries, points: int = 1000, *, settled_only: bool = False) -> ResampledSeries:
    """Reduce ``series`` to at most ``points`` equal time buckets, keeping min and max of each.

    Buckets without events are left out (the series is constant between events).
    ``settled_only``: resample ``settled(series)`` (what a timeline draws) without building the
    whole settled series.
    """
    if points < 1:
        raise ValueError(f"points must be >= 1, got {points}")
    keep = np.flatnonzero(series.settled) if settled_only else None
    t = series.time_ns if keep is None else series.time_ns[keep]
    values = {m: getattr(series, m) if keep is None else getattr(series, m)[keep] for m in METRICS}
    if len(t) <= points:
        return ResampledSeries(
            series.device, t.copy(), {m: v.copy() for m, v in values.items()}, {m: v.copy() for m, v in values.items()}
        )
    t0, t1 = int(t[0]), int(t[-1])
    width = max(1.0, (t1 - t0) / points)
    bucket = np.minimum(((t - t0) / width).astype(np.int64), points - 1)
    starts = np.flatnonzero(np.concatenate(([True], bucket[1:] != bucket[:-1])))
    return ResampledSeries(
        device=series.device,
        time_ns=(t0 + bucket[starts] * width).astype(np.int64),
        minimum={m: np.minimum.reduceat(v, starts) for m, v in values.items()},
        maximum={m: np.maximum.reduceat(v, starts) for m, v in values.items()},
    )


@dataclass(frozen=True)
class Extremes:
    """What a summary needs of a device's timeline, without keeping the timeline: its peak,
    the most pool bytes (reserved) at any event, and the internal waste."""

    peak: Peak
    pool_bytes: int
    waste: Waste


EXTREMES_CHUNK = 1 << 18
"""Events per pass of ``extremes``: bounds its working memory (~60 B per event) whatever the log's length."""


def extremes(log: EventLog, device: str | None = None) -> Extremes:
    """Peak, largest pool and internal waste of one device, computed ``EXTREMES_CHUNK`` events at
    a time (running sums carried from chunk to chunk), so a 10M-event log costs no more memory
    than a 1M-event one. The same values as from ``timeline_series``."""
    name, device_id = _single_device(log, device)
    cols = log.columns
    carry = np.zeros(3, dtype=np.int64)  # bytes in use, requested, pool after the events so far
    top = Peak(name, 0, -1, -1, 0)
    top_waste = pool_most = waste_most = waste_end = 0
    seen = False
    for start in range(0, len(log), EXTREMES_CHUNK):
        stop = min(len(log), start + EXTREMES_CHUNK)
        picked = _allocator_positions(log, device_id, start, stop)
        if picked is not None and not len(picked):
            continue
        window = slice(start, stop) if picked is None else picked
        in_use, in_req, pool, _, _ = _running_values(
            cols["kind"][window], cols["size"][window], cols["requested"][window], cols["largest_free"][window]
        )
        in_use += carry[0]
        in_req += carry[1]
        pool += carry[2]
        i = int(np.argmax(in_use))
        if not seen or int(in_use[i]) > top.bytes:  # the first time, on ties
            index = start + i if picked is None else int(picked[i])
            top = Peak(name, int(in_use[i]), index, int(cols["seq"][index]), int(cols["time_ns"][index]))
            top_waste = int(in_use[i] - in_req[i])
        waste = in_use - in_req
        pool_most = max(pool_most, int(pool.max())) if seen else int(pool.max())
        waste_most = max(waste_most, int(waste.max())) if seen else int(waste.max())
        waste_end = int(waste[-1])
        carry[:] = (in_use[-1], in_req[-1], pool[-1])
        seen = True
    return Extremes(top, pool_most, Waste(name, waste_end, top_waste, waste_most))


def series_extremes(series: TimelineSeries) -> Extremes:
    """``extremes`` of a timeline already computed (the same values, without another pass)."""
    if not len(series):
        return Extremes(Peak(series.device, 0, -1, -1, 0), 0, Waste(series.device, 0, 0, 0))
    i = int(np.argmax(series.bytes_in_use))
    top = Peak(
        series.device, int(series.bytes_in_use[i]), int(series.index[i]), int(series.seq[i]), int(series.time_ns[i])
    )
    waste = series.internal_waste
    return Extremes(
        top, int(series.pool_bytes.max()), Waste(series.device, int(waste[-1]), int(waste[i]), int(waste.max()))
    )


def peak(log: EventLog, device: str | None = None) -> Peak:
    """Where the device's bytes in use were highest (the first time, on ties)."""
    return extremes(log, device).peak


def internal_waste(log: EventLog, device: str | None = None) -> Waste:
    """Internal waste of live allocations at the end, at the peak, and at its maximum."""
    return extremes(log, device).waste


def times_inferred(log: EventLog) -> bool:
    """Whether ``log``'s times were inferred by its importer (``meta["columns"]["time_ns"]``): the
    source recorded none, so views show event positions, never seconds."""
    columns = log.meta.get("columns")
    return isinstance(columns, dict) and columns.get("time_ns") == "inferred"


def devices_by_peak(peaks: Mapping[str, int]) -> list[str]:
    """Device names (``name -> peak bytes in use``) in the order views show them: GPUs first, then
    each kind by its peak, highest first (ties by name)."""
    return sorted(peaks, key=lambda name: (not name.upper().startswith("GPU"), -peaks[name], name))
