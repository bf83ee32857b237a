"""The active-memory view: every allocation of a device alive over time, stacked and coloured
by group (call site, tag, dtype, or any key the caller gives), like PyTorch's memory viewer's
active-memory timeline.

To stay fast at any scale it draws ``top`` groups and one ``other`` band (the rest), each a
stacked area sampled at ``points`` log positions (the peak's among them, so it is never missed):
its cost follows the groups and points drawn, not the number of allocations (those are summed
with whole-array passes). Groups are ranked by their bytes alive at the device's peak, then by
the bytes they ever allocated. Every point carries its log position (``customdata``), so a click
can show the heap at that moment (the report moves its fragmentation map there).

``active_series`` is the data, ``active_memory`` the figure. x is seconds from the log's start,
or the event's log position where the times were inferred (``times_inferred``).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from gpuviz.analysis.moments import call_site
from gpuviz.analysis.profile import Profile
from gpuviz.analysis.timeline import times_inferred
from gpuviz.base.units import binary_unit, format_size
from gpuviz.log.eventlog import EventLog

__all__ = [
    "active_memory",
    "active_spec",
    "active_series",
    "ActiveSeries",
    "group_keys",
    "OTHER",
    "TOP_GROUPS",
    "ACTIVE_POINTS",
]

OTHER = "other"
"""The band of every group past the top ones."""
TOP_GROUPS = 10
"""Groups drawn by default (the rest: ``OTHER``)."""
COLORS = ["#3b6fb6", "#e8a33d", "#6a9e3f", "#9b59b6", "#c0392b", "#16a085", "#d35400", "#2c3e50", "#f1c40f",
          "#8e44ad", "#1abc9c", "#7f8c8d"]  # fmt: skip
"""The bands' colors, in rank order (``OTHER`` is grey)."""
ACTIVE_POINTS = 600
"""Log positions sampled by default."""
GroupBy = str | Callable[[pd.DataFrame], Sequence[str]]
"""``"call site"``, ``"category"``, ``"tag"``, ``"dtype"``, or a function of the allocation table
(``tables.allocation_table`` rows) giving each allocation's group."""


class ActiveSeries(NamedTuple):
    """Bytes alive per group (``bytes[g]`` at each of ``positions``, log positions), groups in
    rank order, ``OTHER`` last when there is a rest; ``at_peak[g]``: bytes alive at the peak."""

    groups: list[str]
    positions: np.ndarray
    bytes: np.ndarray  # (groups, positions) int64
    at_peak: list[int]


def active_grouping(group_by: str, *, has_stacks: bool) -> str:
    """The active view's grouping for a profile's ``ViewOptions.group_by``: that grouping where
    the view has it (call site, category, tag, dtype), else by call site where stacks were
    recorded and by tag where not."""
    if group_by in ("call site", "category", "tag", "dtype"):
        return group_by
    return "call site" if has_stacks else "tag"


def group_keys(log: EventLog, allocations: pd.DataFrame, group_by: GroupBy) -> list[str]:
    """Each allocation's group: its user call site (``file:line (function)``, the first frame
    outside the libraries: ``analysis.callsites``), its category (``analysis.categories``), tag
    or dtype, or what ``group_by`` (a function of the table) says."""
    if callable(group_by):
        return [str(k) for k in group_by(allocations)]
    if group_by == "call site":
        stacks = allocations["stack"].to_numpy()
        unique, inverse = np.unique(stacks, return_inverse=True)
        labels = [call_site(log, int(s)) or "(no stack recorded)" for s in unique.tolist()]
        named: list[str] = np.array([*labels, ""], dtype=object)[:-1][inverse.reshape(-1)].tolist()
        return named
    if group_by == "category":
        from gpuviz.analysis.categories import categories

        return categories(log, allocations)["category"].astype(str).tolist()
    if group_by in ("tag", "dtype"):
        return allocations[group_by].fillna("(untagged)").astype(str).tolist()
    raise ValueError(f"group_by must be 'call site', 'category', 'tag', 'dtype' or a function, not {group_by!r}")


def _alive(alloc: np.ndarray, free: np.ndarray, size: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Bytes of the allocations ``[alloc, free)`` (free -1: never) alive right after each position."""
    order = np.argsort(alloc, kind="stable")
    made = np.concatenate(([0], np.cumsum(size[order])))[np.searchsorted(alloc[order], positions, side="right")]
    freed = free >= 0
    f_order = np.argsort(free[freed], kind="stable")
    f_sorted = free[freed][f_order]
    gone = np.concatenate(([0], np.cumsum(size[freed][f_order])))[np.searchsorted(f_sorted, positions, side="right")]
    result: np.ndarray = (made - gone).astype(np.int64)
    return result


def active_series(
    p: Profile, device: str, *, group_by: GroupBy = "call site", top: int = TOP_GROUPS, points: int = ACTIVE_POINTS
) -> ActiveSeries:
    """The active-memory data of ``device``: ``top`` groups and ``OTHER``, at ``points`` log positions
    spread evenly from the device's first allocation to its last event, and its peak."""
    if top < 1 or points < 2:
        raise ValueError(f"top must be at least 1 and points at least 2, got top={top}, points={points}")
    dp = p.devices[device]
    allocations = dp.allocations
    if not len(allocations):
        return ActiveSeries([], np.zeros(0, np.int64), np.zeros((0, 0), np.int64), [])
    keys = np.asarray(group_keys(p.log, allocations, group_by), dtype=object)
    alloc = allocations["alloc_index"].to_numpy().astype(np.int64)
    free = allocations["free_index"].to_numpy().astype(np.int64)
    size = allocations["size"].to_numpy().astype(np.int64)
    last = int(dp.series.index[-1]) if len(dp.series) else int(alloc.max())
    positions = np.unique(np.concatenate((np.linspace(int(alloc.min()), last, points).astype(np.int64),
                                          [dp.peak.index] if dp.peak.index >= 0 else [])))  # fmt: skip
    peak = dp.peak.index if dp.peak.index >= 0 else last
    inverse, names = pd.factorize(keys)  # (by hashing: sorting a million strings costs more)
    live_at_peak = (alloc <= peak) & ((free < 0) | (free > peak))
    at_peak = np.bincount(inverse, weights=np.where(live_at_peak, size, 0), minlength=len(names))
    total = np.bincount(inverse, weights=size, minlength=len(names))
    ranked = sorted(range(len(names)), key=lambda g: (-at_peak[g], -total[g], str(names[g])))
    chosen = ranked[:top]
    rows, groups, peaks = [], [], []
    for g in chosen:
        mine = inverse == g
        rows.append(_alive(alloc[mine], free[mine], size[mine], positions))
        groups.append(str(names[g]))
        peaks.append(int(at_peak[g]))
    if len(ranked) > top:
        rest = ~np.isin(inverse, chosen)
        rows.append(_alive(alloc[rest], free[rest], size[rest], positions))
        groups.append(OTHER)
        peaks.append(int(at_peak[ranked[top:]].sum()))
    return ActiveSeries(groups, positions, np.vstack(rows), peaks)


def _short(name: str) -> str:
    """A legend name: a call site's file name and line (the rest on hover), other groups cut at 40."""
    head = name.split(" (")[0]
    if "/" in head and ":" in head:
        return head.rsplit("/", 1)[-1]
    return name if len(name) <= 40 else name[:39] + "…"


def active_memory(
    p: Profile,
    device: str,
    *,
    group_by: GroupBy = "call site",
    top: int = TOP_GROUPS,
    points: int = ACTIVE_POINTS,
) -> go.Figure:
    """The active-memory view of ``device``: bytes alive over time, one stacked band per group
    (``active_series``); each point's ``customdata`` is its log position."""
    spec = active_spec(p, device, group_by=group_by, top=top, points=points)
    return go.Figure(data=[go.Scatter(**trace) for trace in spec["data"]], layout=spec["layout"])


def active_spec(
    p: Profile,
    device: str,
    *,
    group_by: GroupBy = "call site",
    top: int = TOP_GROUPS,
    points: int = ACTIVE_POINTS,
) -> dict[str, Any]:
    """``active_memory`` as plain dicts ``{"data", "layout"}`` (what the report embeds, unvalidated)."""
    data = active_series(p, device, group_by=group_by, top=top, points=points)
    inferred = times_inferred(p.log)
    if inferred:
        x = data.positions.tolist()
        where = "event %{customdata}"
    else:
        x = ((p.log["time_ns"][data.positions].astype(np.int64) - p.t0_ns) / 1e9).tolist()
        where = "t = %{x:.6f} s · event %{customdata}"
    factor, unit = binary_unit(max(int(data.bytes.sum(axis=0).max(initial=0)), 1))
    traces = []
    for i, (name, row, peak) in enumerate(zip(data.groups, data.bytes, data.at_peak, strict=True)):
        color = "#b0b6bf" if name == OTHER else COLORS[i % len(COLORS)]
        traces.append({
            "type": "scatter", "x": x, "y": (row / factor).tolist(), "customdata": data.positions.tolist(),
            "text": [format_size(int(v)) for v in row], "name": html.escape(_short(name)), "mode": "lines",
            "stackgroup": "alive", "line": {"width": 0.5, "color": color, "shape": "hv"}, "fillcolor": color,
            "hovertemplate": f"<b>{html.escape(name)}</b><br>%{{text}} alive (at the peak {format_size(peak)})"
                             f"<br>{where}<extra></extra>",
        })  # fmt: skip
    what = group_by if isinstance(group_by, str) else "group"
    title = f"{html.escape(device)} active memory by {html.escape(what)}"
    title += f"<br><sub>the top {top} by bytes alive at the peak, the rest as “{OTHER}”"
    title += "; click a moment to see its heap in the map</sub>"
    if inferred:
        title += "<br><sub>the source recorded no times (gpuviz inferred them): x is each event's log position</sub>"
    axis = "event (log position)" if inferred else "time (s)"
    layout = {
        "title": {"text": title}, "height": 460, "hovermode": "closest",
        "margin": {"l": 70, "r": 20, "t": 110 if inferred else 90, "b": 60}, "legend": {"orientation": "h", "y": -0.2},
        "xaxis": {"title": {"text": axis}}, "yaxis": {"title": {"text": f"alive ({unit})"}, "rangemode": "tozero"},
    }  # fmt: skip
    return {"data": traces, "layout": layout}
