"""Summary and diagnosis: the peak and what held it, possible leaks, OOMs and hints.

Pure functions of an EventLog. Sizes in bytes, times in ns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpuviz.analysis.advice import fragmentation_hint
from gpuviz.analysis.callsites import NO_STACK, call_sites
from gpuviz.analysis.categories import (
    GRADIENT,
    OPTIMIZER_STATE,
    PARAMETER,
    PHASES,
    CategoryCodes,
    category_codes,
    preexisting,
)
from gpuviz.analysis.explain import Answer, explain
from gpuviz.analysis.livegroups import LIVE_GROUP_COLUMNS, live_groups
from gpuviz.analysis.moments import Pinning, oom_indices, pinning
from gpuviz.analysis.replay import HEAP_KINDS, Replay, replay
from gpuviz.analysis.tables import alive_at, allocation_table, mark_table, oom_table, transfer_table
from gpuviz.analysis.timeline import Peak, TimelineSeries, devices_by_peak, series_extremes, timeline_series
from gpuviz.base.units import format_size
from gpuviz.log.eventlog import EventLog

__all__ = [
    "Diagnosis",
    "DeviceSummary",
    "diagnose",
    "live_table",
    "GROUP_BY",
    "resolve_group_by",
    "LIVE_COLUMNS",
    "FLOAT64_HINT",
    "TRANSFER_HINT",
    "FRAGMENTATION_HINT",
]

OOM_HINTS = 10
"""The most out-of-memory events the hints name one by one; the rest are counted (the
out-of-memory table lists them all)."""

FLOAT64_HINT = 0.3
"""Hint when float64 arrays hold more than this share of a device's peak."""
TRANSFER_HINT = 0.2
"""Hint when transfers take more than this share of the recorded wall time."""
FRAGMENTATION_HINT = 0.3
"""Hint when fragmentation at the peak or at the end is above this."""


@dataclass(frozen=True)
class DeviceSummary:
    """One device: its peak, what was alive then, and what was still alive at the end."""

    device: str
    peak: Peak
    peak_pool_bytes: int
    bytes_in_use_at_end: int
    fragmentation_at_peak: float
    fragmentation_at_end: float
    waste_at_peak: int
    top_at_peak: pd.DataFrame  # group, bytes, count, share: by tag / dtype / call site
    dtype_at_peak: pd.DataFrame  # dtype, bytes, share
    leaks: pd.DataFrame  # allocations alive at the end of a span (or of the log)
    moment: str = "peak"  # "OOM" (the device's first) or "peak": what views open at
    moment_index: int = -1  # its log position
    live: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per allocation live then (LIVE_COLUMNS)
    pinning: Pinning | None = None  # at the first OOM: the holes and what pinned them apart
    answer: Answer | None = None  # what held the memory then, in words (``explain``)
    group_by: str = "tag"  # what ``top_at_peak`` is grouped by ("auto" resolved)
    # ``live`` grouped by what held it, call site and size (``livegroups.LIVE_GROUP_COLUMNS``)
    live_groups: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=LIVE_GROUP_COLUMNS))


@dataclass(frozen=True)
class Diagnosis:
    devices: list[DeviceSummary]
    ooms: pd.DataFrame
    transfer_bytes: int
    transfer_ns: int
    wall_ns: int
    hints: list[str] = field(default_factory=list)
    t0_ns: int = 0  # the log's first time: views show times from it


LIVE_COLUMNS = ["tag", "shape", "dtype", "requested", "size", "call_site", "age_ns", "address", "alloc_index"]


_NO_LIVE = pd.DataFrame(columns=LIVE_COLUMNS)


def live_table(log: EventLog, allocations: pd.DataFrame, index: int) -> pd.DataFrame:
    """The allocations live right after log position ``index``, largest chunk first: tag, shape,
    dtype, requested and chunk bytes, call site, age (ns, at ``index``), address, allocating event."""
    live = alive_at(allocations, index)
    now = int(log["time_ns"][index]) if len(log) else 0
    frame = pd.DataFrame(
        {
            "tag": live["tag"].to_numpy(),
            "shape": _shape_labels(live["shape"].tolist()),
            "dtype": live["dtype"].to_numpy(),
            "requested": live["requested"].to_numpy(),
            "size": live["size"].to_numpy(),
            "call_site": call_sites(log).labels_of(live["stack"].to_numpy()),
            "age_ns": now - live["alloc_ns"].to_numpy(),
            "address": live["address"].to_numpy(),
            "alloc_index": live["alloc_index"].to_numpy(),
        },
        columns=LIVE_COLUMNS,
    )
    return frame.sort_values(["size", "alloc_index"], ascending=[False, True], kind="stable").reset_index(drop=True)


def _shape_labels(shapes: list[object]) -> list[str | None]:
    """``2x3`` per shape (None for None), each distinct shape joined once."""
    joined: dict[object, str] = {}
    labels: list[str | None] = []
    for shape in shapes:
        if shape is None:
            labels.append(None)
            continue
        key = tuple(shape) if isinstance(shape, list) else shape
        label = joined.get(key)
        if label is None:
            label = joined[key] = "x".join(str(n) for n in shape)  # type: ignore[attr-defined]
        labels.append(label)
    return labels


GROUP_BY = ("auto", "tag", "dtype", "call site", "category")
"""What the top allocations at the peak are grouped by; ``"auto"``: by tag where the allocations
alive then carry tags, else by user call site where they have stacks, else by category."""


def resolve_group_by(log: EventLog, live: pd.DataFrame, group_by: str) -> str:
    """``group_by`` with ``"auto"`` resolved for the allocations ``live``."""
    if group_by != "auto":
        return group_by
    tags = live["tag"]
    if len(tags) and tags.notna().mean() >= 0.5 and (tags != "PREEXISTING").any():
        return "tag"
    stacks = live["stack"].to_numpy()
    if len(stacks) and (stacks >= 0).any():
        return "call site"
    return "category"


def _top(live: pd.DataFrame, log: EventLog, by: str, total: int, limit: int, *, user_code: str | None = None,
         cats: CategoryCodes | None = None) -> pd.DataFrame:  # fmt: skip
    if by == "call site":
        sites = call_sites(log, user_code=user_code)
        labels = sites.labels_of(live["stack"].to_numpy())
        keys = np.where((labels == None) | (labels == ""), NO_STACK, labels).tolist()  # noqa: E711 (elementwise)
    elif by == "category":
        keys = (cats if cats is not None else category_codes(log, live)).names().tolist()
    elif by == "dtype":
        keys = live["dtype"].fillna("(untagged)").tolist()
    else:
        keys = live["tag"].fillna("(untagged)").tolist()
    if len(keys):  # summed on the codes of the distinct groups, not on a string column
        codes, groups = pd.factorize(np.asarray(keys, dtype=object))
        sums = np.zeros(len(groups), dtype=np.int64)
        np.add.at(sums, codes, live["size"].to_numpy().astype(np.int64))
        count = np.bincount(codes, minlength=len(groups)).astype(np.int64)
        grouped = pd.DataFrame({"group": np.asarray(groups, dtype=object), "bytes": sums, "count": count})
    else:
        frame = pd.DataFrame({"group": keys, "bytes": live["size"].to_numpy()})
        grouped = frame.groupby("group", sort=False)["bytes"].agg(["sum", "count"]).reset_index()
        grouped.columns = ["group", "bytes", "count"]
    grouped["share"] = grouped["bytes"] / total if total else 0.0
    return grouped.sort_values(["bytes", "group"], ascending=[False, True]).head(limit).reset_index(drop=True)


def _leaks(log: EventLog, allocations: pd.DataFrame, cats: CategoryCodes | None = None) -> pd.DataFrame:
    """Allocations made inside a span and alive at its end; without spans, alive at the end.

    Never listed: what was alive from before the trace, parameters and optimizer state (they
    live as long as the model). Without spans, where the run has two optimizer steps or more,
    only what was made after the first step ended and is still alive (what grows step over
    step); with fewer, gradients are left out too."""
    cats = category_codes(log, allocations) if cats is None else cats
    category = cats.names()
    keep = ~preexisting(log, allocations) & ~np.isin(category, [PARAMETER, OPTIMIZER_STATE])
    made_all = allocations["alloc_index"].to_numpy()
    is_step = cats.phase == PHASES.index("step")
    starts = np.flatnonzero(is_step & ~np.concatenate([[False], is_step[:-1]]))  # first row of each step
    first_step_end = -1
    if len(starts) >= 2:
        after = np.flatnonzero(~is_step[starts[0] :])
        first_step_end = int(made_all[starts[0] + after[0]]) if len(after) else int(made_all[-1]) + 1
    else:
        keep &= category != GRADIENT
    marks = mark_table(log)
    spans: list[tuple[str, int, int]] = []
    open_spans: dict[str, list[int]] = {}
    for row in marks.to_dict("records"):
        label, seq_number = str(row["label"]), int(row["seq"])
        if row["phase"] == "begin":
            open_spans.setdefault(label, []).append(seq_number)
        elif row["phase"] == "end" and open_spans.get(label):
            spans.append((label, open_spans[label].pop(), seq_number))
    seq = log["seq"]
    if not spans:
        spans = [("end of recording", int(seq[0]) if len(seq) else 0, int(seq[-1]) if len(seq) else 0)]
    made_at = allocations["alloc_index"].to_numpy()  # ascending: the table is sorted by it
    freed_at = allocations["free_index"].to_numpy()
    result = []
    for label, begin, end in spans:
        begin_at = int(np.searchsorted(seq, begin))  # seq is ascending: position of that event
        end_at = int(np.searchsorted(seq, end))
        first = int(np.searchsorted(made_at, begin_at, side="left"))
        last = int(np.searchsorted(made_at, end_at, side="right"))
        window = np.arange(first, last)
        window = window[keep[window] & (made_at[window] >= first_step_end)]
        alive = window[(freed_at[window] < 0) | (freed_at[window] > end_at)]
        if len(alive):
            result.append(allocations.iloc[alive].assign(span=label))
    if not result:
        return pd.DataFrame(columns=[*allocations.columns, "span"])
    return pd.concat(result, ignore_index=True)


def diagnose(
    log: EventLog,
    *,
    top: int = 10,
    group_by: str = "auto",
    user_code: str | None = None,
    heap: Replay | None = None,
    series: Mapping[str, TimelineSeries] | None = None,
    allocations: Mapping[str, pd.DataFrame] | None = None,
    transfers: pd.DataFrame | None = None,
) -> Diagnosis:
    """The summary of a run: per device peak and composition, leaks, OOMs, and hints.

    ``group_by``: one of ``GROUP_BY`` for the top allocations at the peak (``"auto"``: tags where
    there are, else user call sites, else categories). ``user_code``: see ``callsites.call_sites``.
    ``heap``, ``series`` (per device name), ``allocations`` (per device name) and ``transfers``:
    results of ``log`` already computed, reused instead of computed again (a caller that has
    them, like ``profile``, passes them; missing ones are computed). Each device's summary
    holds the allocations live at its first OOM (else at its peak) and, at an OOM, the pinning
    analysis (``moments.pinning``).
    """
    if group_by not in GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(map(repr, GROUP_BY))}, not {group_by!r}")
    cols = log.columns
    # a few states per device: a few checkpoints (each copies the whole heap) serve them best
    heap = heap or replay(log, checkpoint_every=max(8192, len(log) // 8))
    present = np.unique(cols["device"][np.isin(cols["kind"], [int(k) for k in HEAP_KINDS])]).tolist()
    names = [log.devices[i].name for i in present]
    timelines = {n: series[n] if series is not None and n in series else timeline_series(log, n) for n in names}
    order = devices_by_peak({n: series_extremes(timelines[n]).peak.bytes for n in names})  # GPUs first, by peak
    heap_devices = [log.device_index(name) for name in order]
    devices: list[DeviceSummary] = []
    hints: list[str] = []
    for device_id in heap_devices:
        name = log.devices[device_id].name
        timeline = timelines[name]
        extremes = series_extremes(timeline)
        top_peak = extremes.peak
        table = allocations[name] if allocations is not None and name in allocations else allocation_table(log, name)
        cats = category_codes(log, table)
        live = alive_at(table, top_peak.index) if top_peak.index >= 0 else table.iloc[:0]
        live_rows = table.index.get_indexer(live.index)
        by = resolve_group_by(log, live, group_by)
        at = int(np.searchsorted(timeline.index, top_peak.index)) if top_peak.index >= 0 else 0
        dtype = _top(live, log, "dtype", top_peak.bytes, 50)
        ooms_here = oom_indices(log, name)
        moment_index = int(ooms_here[0]) if len(ooms_here) else top_peak.index
        pinned = None
        if len(ooms_here):
            pinned = pinning(
                heap.state_at(moment_index, device=name), int(cols["requested"][moment_index]),
                log=log, at_index=moment_index,
            )  # fmt: skip
        summary = DeviceSummary(
            device=name,
            peak=top_peak,
            peak_pool_bytes=extremes.pool_bytes,
            bytes_in_use_at_end=int(timeline.bytes_in_use[-1]) if len(timeline) else 0,
            fragmentation_at_peak=float(timeline.fragmentation[at]) if len(timeline) else 0.0,
            fragmentation_at_end=float(timeline.fragmentation[-1]) if len(timeline) else 0.0,
            waste_at_peak=extremes.waste.at_peak,
            top_at_peak=_top(live, log, by, top_peak.bytes, top, user_code=user_code, cats=cats.take(live_rows)),
            dtype_at_peak=dtype,
            leaks=_leaks(log, table, cats),
            moment="OOM" if len(ooms_here) else "peak",
            moment_index=moment_index,
            live=live_table(log, table, moment_index) if moment_index >= 0 else pd.DataFrame(columns=LIVE_COLUMNS),
            pinning=pinned,
            answer=next(iter(explain(log, name, user_code=user_code, heap=heap, series={name: timeline},
                                     allocations={name: table})), None),
            group_by=by,
            live_groups=live_groups(log, table, moment_index, user_code=user_code),
        )  # fmt: skip
        devices.append(summary)
        f64 = dtype.loc[dtype["group"] == "float64", "share"]
        if len(f64) and float(f64.iloc[0]) > FLOAT64_HINT:
            hints.append(f"{name}: float64 arrays hold {float(f64.iloc[0]):.0%} of the peak; float32 would halve them.")
        worst = max(summary.fragmentation_at_peak, summary.fragmentation_at_end)
        if worst > FRAGMENTATION_HINT:
            hints.append(fragmentation_hint(log, name, worst, summary.answer))
        if top_peak.bytes and summary.waste_at_peak > max(0.1 * top_peak.bytes, 1 << 20):
            hints.append(
                f"{name}: {summary.waste_at_peak / top_peak.bytes:.0%} of the peak is internal waste"
                " (chunks larger than requested); similar-sized requests reuse memory better."
            )
    transfers = transfer_table(log) if transfers is None else transfers
    time_ns = cols["time_ns"]
    wall = int(time_ns.max() - time_ns.min()) if len(time_ns) else 0
    transfer_ns = int(transfers["duration_ns"].sum())
    if wall and transfer_ns > TRANSFER_HINT * wall:
        hints.append(
            f"transfers take {transfer_ns / wall:.0%} of the recorded time ({len(transfers)} copies):"
            " keep data on the device, batch small copies, or prefetch the next batch while computing."
        )
    ooms = oom_table(log)
    for row in ooms.head(OOM_HINTS).to_dict("records"):
        cause = (
            "fragmentation: enough bytes were free, but no chunk was large enough"
            if row["fragmentation_cause"]
            else "not enough free memory under the limit"
        )
        hints.append(
            f"{row['device']}: out of memory at event {row['seq']} requesting {format_size(int(row['requested']))}"
            f" - {cause}."
        )
    if len(ooms) > OOM_HINTS:
        fragmented = int(ooms["fragmentation_cause"].sum())
        hints.append(
            f"... and {len(ooms) - OOM_HINTS:,} more out-of-memory events ({fragmented:,} of all {len(ooms):,} "
            "by fragmentation): every one is in the out-of-memory table."
        )
    t0 = int(time_ns.min()) if len(time_ns) else 0
    return Diagnosis(devices, ooms, int(transfers["bytes"].sum()), transfer_ns, wall, hints, t0)
