"""The moments that matter in a run, and what pinned memory at an out-of-memory error.

Pure functions of an EventLog / HeapState. Sizes in bytes, times in ns, event indices are
positions in the log (what ``Replay.state_at`` takes).

Signatures::

    oom_indices(log: EventLog, device: str | None = None) -> np.ndarray
        log positions of the device's ``oom`` events, ascending
    opening_index(log: EventLog, device: str | None = None, *, series: TimelineSeries | None = None) -> int
        where a view opens: the device's first OOM, else its peak (bytes in use), else -1 (the end)
    scrub_stops(log: EventLog, device: str | None = None, *, count: int = 40,
                series: TimelineSeries | None = None) -> np.ndarray
        the scrubber's stops: ``count`` evenly spaced settled events | every OOM | the peak
        | every mark, sorted, unique (int64 log positions)
    pinning(state: HeapState, request_bytes: int, *, log: EventLog | None = None,
            at_index: int = -1, windows: int = 5) -> Pinning
        the free holes at a failed request and the cheapest sets of live chunks whose release
        would have made a hole large enough (see ``pinning``)
    Pinning.sentence() -> str
        "free 3.2 GiB in 41 holes, largest 702 MiB; freeing these 3 allocations would have
        made a hole of 1.1 GiB"

``series`` lets a caller that already has the device's ``timeline_series`` skip computing it
again. Passing ``log`` to ``pinning`` fills in when each pinning chunk was allocated, its age
at ``at_index`` and its call site (when stacks were recorded).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuviz.analysis.tables import alive_at, allocation_table
from gpuviz.analysis.timeline import TimelineSeries, _single_device, timeline_series
from gpuviz.base.heapstate import ChunkState, HeapState
from gpuviz.base.units import format_size, round_up
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind

__all__ = [
    "MARK_STOPS",
    "ROUNDING",
    "PinningChunk",
    "PinningWindow",
    "Pinning",
    "oom_indices",
    "opening_index",
    "scrub_stops",
    "pinning",
    "call_site",
]

ROUNDING = 256
"""Requests are rounded up to a multiple of this many bytes (the BFC allocator's rule)."""


def call_site(log: EventLog, stack: int) -> str | None:
    """``file:line (function)`` of stack ``stack``'s user call site (its innermost frame outside
    the libraries, ``callsites``), else of its innermost library frame; None without frames."""
    from gpuviz.analysis.callsites import call_sites

    return call_sites(log).label(stack)


def oom_indices(log: EventLog, device: str | None = None) -> np.ndarray:
    """Log positions of the ``oom`` events of ``device`` (the only device when omitted), ascending."""
    _, device_id = _single_device(log, device)
    cols = log.columns
    return np.flatnonzero((cols["kind"] == Kind.OOM) & (cols["device"] == device_id)).astype(np.int64)


def _peak_index(series: TimelineSeries) -> int:
    if not len(series):
        return -1
    return int(series.index[int(np.argmax(series.bytes_in_use))])


def opening_index(log: EventLog, device: str | None = None, *, series: TimelineSeries | None = None) -> int:
    """The log position a view of ``device`` opens at: its first OOM when there is one, else its
    peak (the first event with the highest bytes in use), else -1 (no allocator events: the end)."""
    if not len(log):
        return -1
    ooms = oom_indices(log, device if device is not None else (series.device if series is not None else None))
    if len(ooms):
        return int(ooms[0])
    return _peak_index(series if series is not None else timeline_series(log, device))


MARK_STOPS = 100
"""The most marks a scrubber stops at (each stop is a drawn frame in a report): a run that marks
every step has thousands. Beyond it, that many marks evenly spaced over the run, first and last
included."""
OOM_STOPS = 20
"""The most out-of-memory events of one device a scrubber stops at (each is a map and a pinning
analysis in a report); beyond it the first, the last and an even sample between. Every OOM is
still listed in the report's out-of-memory table."""


def scrub_stops(
    log: EventLog,
    device: str | None = None,
    *,
    count: int = 40,
    series: TimelineSeries | None = None,
    max_marks: int = MARK_STOPS,
    max_ooms: int = OOM_STOPS,
) -> np.ndarray:
    """The log positions a time scrubber of ``device`` offers, ascending and unique.

    ``count`` evenly spaced stops over the device's settled allocator events (those that end a
    public operation, ``TimelineSeries.settled``), plus the OOMs of the device — every one, or
    when there are more than ``max_ooms`` the first, the last and an even sample between (each
    stop is a map and a pinning analysis: a run of 2,000 OOMs must not make 2,000) — its peak
    and every mark of the log (marks are annotations of the whole run: cell, step, span) — at
    most ``max_marks`` of them, evenly spaced, when the run has more.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if max_marks < 0:
        raise ValueError(f"max_marks must be >= 0, got {max_marks}")
    if max_ooms < 2:
        raise ValueError(f"max_ooms must be >= 2 (the first and the last), got {max_ooms}")
    if series is None:
        series = timeline_series(log, device)
    settled = series.index[series.settled]
    picks = np.linspace(0, len(settled) - 1, min(count, len(settled))).round().astype(np.int64)
    ooms = oom_indices(log, series.device)
    if len(ooms) > max_ooms:
        ooms = ooms[np.linspace(0, len(ooms) - 1, max_ooms).round().astype(np.int64)]
    parts = [settled[picks].astype(np.int64), ooms]
    peak = _peak_index(series)
    if peak >= 0:
        parts.append(np.array([peak], dtype=np.int64))
    marks = np.flatnonzero(log.columns["kind"] == Kind.MARK).astype(np.int64)
    if len(marks) > max_marks:
        marks = marks[np.linspace(0, len(marks) - 1, max_marks).round().astype(np.int64)] if max_marks else marks[:0]
    parts.append(marks)
    return np.unique(np.concatenate(parts))


@dataclass(frozen=True)
class PinningChunk:
    """A live chunk whose release would have helped make room for a failed request.

    ``alloc_index``/``alloc_ns``: the event that allocated it (-1 / 0 when unknown);
    ``age_ns``: how long it had been alive at the failure (-1 when unknown).
    """

    address: int
    size: int
    requested: int
    tag: str | None
    stack: int
    call_site: str | None
    alloc_index: int
    alloc_ns: int
    age_ns: int


@dataclass(frozen=True)
class PinningWindow:
    """One candidate: release ``chunks`` and the hole from ``start`` of ``hole_bytes`` bytes forms
    (the released chunks merged with the free chunks on either side of and between them)."""

    segment: int  # base address of the segment
    start: int
    hole_bytes: int
    chunks: tuple[PinningChunk, ...]

    @property
    def freed_bytes(self) -> int:
        return sum(c.size for c in self.chunks)

    @property
    def end(self) -> int:
        return self.start + self.hole_bytes


@dataclass(frozen=True)
class Pinning:
    """The free holes of a heap at a failed request and what pinned them apart.

    ``rounded``: the request rounded up to 256 B; ``free_bytes``/``holes``/``largest_hole``:
    total, count and largest of the free chunks (``largest_hole_address`` its address, -1 when
    none); ``windows``: the cheapest candidates, best first (empty when a hole already fits or
    no segment could ever hold the request).
    """

    device: str
    request_bytes: int
    rounded: int
    free_bytes: int
    holes: int
    largest_hole: int
    largest_hole_address: int
    windows: tuple[PinningWindow, ...]

    @property
    def best(self) -> PinningWindow | None:
        return self.windows[0] if self.windows else None

    @property
    def fits(self) -> bool:
        """True when a free hole was already large enough (nothing pins the request)."""
        return self.largest_hole >= self.rounded

    def sentence(self) -> str:
        """The plain-words answer, e.g. ``"free 3.2 GiB in 41 holes, largest 702 MiB; freeing these 3
        allocations would have made a hole of 1.1 GiB"``."""
        holes = "1 hole" if self.holes == 1 else f"{self.holes} holes"
        head = f"free {format_size(self.free_bytes)} in {holes}, largest {format_size(self.largest_hole)}"
        if self.fits:
            return f"{head}; a hole was large enough for {format_size(self.rounded)}"
        best = self.best
        if best is None:
            return f"{head}; no segment can hold {format_size(self.rounded)}, whatever is released"
        n = len(best.chunks)
        these = "this allocation" if n == 1 else f"these {n} allocations"
        return f"{head}; freeing {these} would have made a hole of {format_size(best.hole_bytes)}"


def _windows(state: HeapState, rounded: int) -> list[tuple[int, int, int, int, tuple[ChunkState, ...]]]:
    """(count, freed bytes, start, hole bytes, chunks) of the minimal window starting at each live chunk."""
    found = []
    for seg in state.segments:
        if seg.size < rounded:
            continue
        live = [k for k, c in enumerate(seg.chunks) if c.in_use]
        bounds = [c.address for c in seg.chunks] + [seg.end]
        last = 0
        for first in range(len(live)):
            # the hole spans from the end of the live chunk before `first` to the start of the one after `last`
            start = bounds[live[first - 1] + 1] if first else seg.base
            last = max(last, first)
            while last < len(live):
                stop = bounds[live[last + 1]] if last + 1 < len(live) else seg.end
                if stop - start >= rounded:
                    chunks = tuple(seg.chunks[k] for k in live[first : last + 1])
                    found.append((len(chunks), sum(c.size for c in chunks), start, stop - start, chunks))
                    break
                last += 1
            if last == len(live):
                break  # even releasing every later live chunk is not enough; later starts do worse
    return found


def pinning(
    state: HeapState, request_bytes: int, *, log: EventLog | None = None, at_index: int = -1, windows: int = 5
) -> Pinning:
    """What kept ``request_bytes`` from fitting in ``state`` (usually the heap at an ``oom`` event).

    Definition. Round the request up to 256 B (``rounded``). In each segment, let L1..Lm be its
    live chunks in address order. Releasing a run Li..Lj of consecutive live chunks merges them
    with every free chunk between them and next to them into one hole, reaching from the end of
    L(i-1) (or the segment's base) to the start of L(j+1) (or the segment's end); chunks never
    merge across segments. A *window* is such a run whose hole is at least ``rounded``; for each
    start Li only the shortest sufficient run counts. Windows are ranked by the number of chunks to
    release, then the bytes released, then address: the first is the cheapest way the request
    would have fit, its chunks are the *pinning* allocations. At most ``windows`` are returned.
    When a free hole is already at least ``rounded`` (or no segment is that large) there is no
    window.

    With ``log`` (the log ``state`` was replayed from) and ``at_index`` (the event ``state`` is
    at, -1 for the end), each pinning chunk carries its allocating event, time, age and call site.
    """
    if isinstance(request_bytes, bool) or not isinstance(request_bytes, (int, np.integer)) or request_bytes < 0:
        raise ValueError(f"request_bytes must be a non-negative int, got {request_bytes!r}")
    if windows < 1:
        raise ValueError(f"windows must be >= 1, got {windows}")
    rounded = round_up(int(request_bytes), ROUNDING)
    free = [c for s in state.segments for c in s.chunks if not c.in_use]
    largest = max(free, key=lambda c: (c.size, -c.address), default=None)
    candidates = [] if largest is not None and largest.size >= rounded else _windows(state, rounded)
    candidates.sort(key=lambda w: (w[0], w[1], w[2]))
    chosen = candidates[:windows]
    details = _details(log, state.device, at_index, {c.address for w in chosen for c in w[4]})
    result = tuple(
        PinningWindow(
            segment=_segment_of(state, start),
            start=start,
            hole_bytes=hole,
            chunks=tuple(_pinning_chunk(c, details.get(c.address), log) for c in chunks),
        )
        for _, _, start, hole, chunks in chosen
    )
    return Pinning(
        device=state.device,
        request_bytes=int(request_bytes),
        rounded=rounded,
        free_bytes=sum(c.size for c in free),
        holes=len(free),
        largest_hole=largest.size if largest is not None else 0,
        largest_hole_address=largest.address if largest is not None else -1,
        windows=result,
    )


def _segment_of(state: HeapState, address: int) -> int:
    return next(s.base for s in state.segments if s.base <= address < s.end)


def _details(log: EventLog | None, device: str, at_index: int, addresses: set[int]) -> dict[int, tuple[int, int, int]]:
    """address -> (alloc_index, alloc_ns, age_ns) of the live allocations at ``at_index``."""
    if log is None or not addresses or not len(log):
        return {}
    n = len(log)
    at = at_index + n if at_index < 0 else at_index
    live = alive_at(allocation_table(log, device), at)
    live = live[live["address"].isin(list(addresses))]
    now = int(log["time_ns"][at])
    return {
        int(a): (int(i), int(t), now - int(t))
        for a, i, t in zip(live["address"], live["alloc_index"], live["alloc_ns"], strict=True)
    }


def _pinning_chunk(chunk: ChunkState, detail: tuple[int, int, int] | None, log: EventLog | None) -> PinningChunk:
    alloc_index, alloc_ns, age_ns = detail if detail is not None else (-1, 0, -1)
    return PinningChunk(
        address=chunk.address,
        size=chunk.size,
        requested=chunk.requested,
        tag=chunk.tag,
        stack=chunk.stack,
        call_site=call_site(log, chunk.stack) if log is not None else None,
        alloc_index=alloc_index,
        alloc_ns=alloc_ns,
        age_ns=age_ns,
    )
