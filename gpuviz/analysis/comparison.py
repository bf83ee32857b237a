"""Comparing allocator policies that served the same request stream (a what-if).

Each policy's replay is an ordinary EventLog; this module measures each one the same way
(bytes in bytes, times in ns):

    peak_reserved    the most bytes the policy held from the device (segments)
    peak_in_use      the most bytes in chunks handed out (requested plus rounding and unsplit rest)
    peak_requested   the most bytes the program asked for and held (the same for every policy
                     that served every request)
    waste_at_peak    reserved minus in-use bytes when the reserved bytes peaked, measured where an
                     operation has completed (after an alloc, free or oom event, never between a
                     segment's reservation and the allocation that needed it)
    oom              the first out-of-memory event, with the pool's state; its cause is fragmentation
                     when the pool held enough free bytes for the request but no chunk was large enough
    worst_index      where its fragmentation map is shown: the OOM, else the moment with the most
                     reserved bytes not in use (the first such, on ties)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuviz.analysis.tables import oom_table
from gpuviz.analysis.timeline import TimelineSeries, timeline_series
from gpuviz.base import display
from gpuviz.base.units import format_bytes
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind

__all__ = ["PolicyOutcome", "Comparison", "OomAt", "outcome", "set_renderer", "RECORDED"]

RECORDED = "recorded"  # the name of the run as it happened, listed beside the replays


@dataclass(frozen=True)
class OomAt:
    """A policy's first out-of-memory: request, pool state and cause (bytes, ns)."""

    index: int
    time_ns: int
    requested: int
    rounded: int
    free: int
    largest_free: int
    reservable: int
    fragmentation_cause: bool

    def cause(self) -> str:
        """Why, in words: fragmentation when enough bytes were free in the pool but no chunk fitted."""
        if self.fragmentation_cause:
            return (
                f"fragmentation: {format_bytes(self.free)} free in the pool, but the largest free chunk is "
                f"{format_bytes(self.largest_free)}"
            )
        return (
            f"not enough memory: {format_bytes(self.free)} free in the pool (largest chunk "
            f"{format_bytes(self.largest_free)}), {format_bytes(self.reservable)} still reservable from the device"
        )


@dataclass(frozen=True)
class PolicyOutcome:
    """How one policy served the stream."""

    name: str
    log: EventLog = field(repr=False)
    device: str
    requests: int
    served: int
    peak_reserved: int
    peak_in_use: int
    peak_requested: int
    waste_at_peak: int
    final_reserved: int
    oom: OomAt | None
    worst_index: int
    series: TimelineSeries = field(repr=False)
    source_ooms: tuple[bool, ...] = ()  # per request the source failed (its OOMs), whether this policy served it

    @property
    def fits(self) -> bool:
        return self.oom is None


def outcome(
    name: str, log: EventLog, device: str, *, requests: int, served: int, source_ooms: tuple[bool, ...] = ()
) -> PolicyOutcome:
    """Measure one policy's replay ``log`` (its device ``device``); ``source_ooms``: for each request
    the source failed, whether this replay served it."""
    series = timeline_series(log, device)
    kinds = log.columns["kind"][series.index]
    settled = np.flatnonzero((kinds == Kind.ALLOC) | (kinds == Kind.FREE) | (kinds == Kind.OOM))
    if len(settled):
        pool = series.pool_bytes[settled]
        unused = pool - series.bytes_in_use[settled]
        top = int(np.argmax(pool))
        peak_reserved = int(series.pool_bytes.max())
        waste = int(unused[top])
        worst = int(series.index[settled[int(np.argmax(unused))]])
        values = (peak_reserved, int(series.bytes_in_use.max()), int(series.bytes_requested.max()), waste)
        final = int(series.pool_bytes[-1])
    else:
        values, worst, final = (0, 0, 0, 0), -1, 0
    oom = None
    ooms = oom_table(log, device)
    if len(ooms):
        first = ooms.iloc[0]
        index = int(np.searchsorted(log.columns["seq"], int(first["seq"])))
        oom = OomAt(
            index=index,
            time_ns=int(first["time_ns"]),
            requested=int(first["requested"]),
            rounded=int(first["rounded"]),
            free=int(first["free"]),
            largest_free=int(first["largest_free"]),
            reservable=int(first["reservable"]),
            fragmentation_cause=int(first["free"]) >= int(first["rounded"]),
        )
        worst = index
    return PolicyOutcome(
        name, log, device, requests, served, *values, final_reserved=final, oom=oom, worst_index=worst, series=series,
        source_ooms=source_ooms,
    )  # fmt: skip


@dataclass(frozen=True)
class Comparison:
    """Every policy's outcome on one device's request stream, with the capacity tried (bytes, or None)."""

    source: str
    device: str
    capacity: int | None
    outcomes: tuple[PolicyOutcome, ...]
    notes: tuple[str, ...] = ()
    # a policy as written (any spelling that selects it) -> its outcome's name; None: names only
    resolve: Callable[[str], str] | None = field(default=None, repr=False, compare=False)

    def __getitem__(self, name: str) -> PolicyOutcome:
        """The outcome of the policy ``name``: its label, or any string that selects the same policy
        (``"torch:expandable_segments=1"`` for ``"torch:expandable_segments=true"``)."""
        names = [name]
        if self.resolve is not None:
            with contextlib.suppress(ValueError):
                names.append(self.resolve(name))
        for wanted in names:
            for item in self.outcomes:
                if item.name == wanted:
                    return item
        raise KeyError(f"no policy {name!r}; policies are {', '.join(o.name for o in self.outcomes)}")

    def headline(self) -> str:
        """The answer in plain words, one sentence per policy."""
        parts = []
        where = f" on {format_bytes(self.capacity)}" if self.capacity is not None else ""
        for o in self.outcomes:
            if o.name == RECORDED:
                over = (
                    " (more than the capacity)" if self.capacity is not None and o.peak_reserved > self.capacity else ""
                )
                count = len(o.source_ooms)
                failed = f"{count} request{'' if count == 1 else 's'} failed (out of memory), " if count else ""
                parts.append(f"as recorded: {failed}reserved at most {format_bytes(o.peak_reserved)}{over}")
            elif o.oom is not None:
                parts.append(
                    f"{o.name}: out of memory{where} after {o.served} of {o.requests} requests ({o.oom.cause()})"
                )
                if o.source_ooms and any(o.source_ooms):
                    parts[-1] += f", though it serves {sum(o.source_ooms)} of the run's own failed requests"
            else:
                served = " (the run's own failed requests included)" if o.source_ooms else ""
                parts.append(
                    f"{o.name}: fits{where}{served}, reserving at most {format_bytes(o.peak_reserved)} "
                    f"({format_bytes(o.waste_at_peak)} of it unused at that moment)"
                )
        return "; ".join(parts) + "."

    def table(self) -> list[dict[str, Any]]:
        """One row per policy (for tables and JSON)."""
        return [
            {
                "policy": o.name,
                "fits": o.fits,
                "peak_reserved": o.peak_reserved,
                "peak_in_use": o.peak_in_use,
                "peak_requested": o.peak_requested,
                "waste_at_peak": o.waste_at_peak,
                "served": o.served,
                "requests": o.requests,
                "oom": None if o.oom is None else o.oom.cause(),
                "source_ooms_served": list(o.source_ooms),
            }
            for o in self.outcomes
        ]

    def __repr__(self) -> str:
        names = ", ".join(o.name for o in self.outcomes)
        return f"<Comparison of {names} on {self.device}: {self.headline()}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        if not _renderers:
            display.load("Comparison")  # the views that render it, imported at the first display
        if _renderers:
            return _renderers[0](self)
        return {"text/plain": repr(self)}


_renderers: list[Callable[[Comparison], dict[str, Any]]] = []


def set_renderer(render: Callable[[Comparison], dict[str, Any]]) -> None:
    """Register how a Comparison displays in notebooks (the views layer does, at import)."""
    _renderers[:] = [render]
