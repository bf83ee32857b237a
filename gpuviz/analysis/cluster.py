"""Cluster summary of a run: one row per device of every rank, outliers flagged, and each
device's bytes in use resampled for the ranks x time heatmap.

The run's logs are opened one at a time; only the compact rows and resampled series are
kept. Times are ns since the first event of each rank's log. A log recorded as part of a
run also has a wall-clock anchor (``meta["run"]["clock_offset_ns"]``, see
``gpuviz.base.ranks.CLOCK_OFFSET``): ``start_epoch_ns`` is then the wall-clock time of its
first event, and ``alignment`` lines ranks up by it (``"clock"``) or by their first events
(``"start"``).

Outliers: with ``m`` the median peak over the rows that allocated anything (peak > 0; an
idle GPU is a row of zeros and never flagged), such a row is flagged ``"peak"`` when
``|peak - m| > threshold * m`` and ``"growth"`` when ``|growth - median growth| > threshold * m``
(medians over the same rows). ``growth`` (``growth()``) is the mean bytes in use over the
second half of the log's time span minus the mean over its first half: about 0 for a loop
that frees what each step allocates, positive for one that keeps memory step over step.
(Bytes in use at two instants — the end and the middle — flagged ranks running identical
steps whose instants fell at different points of a step.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpuviz.analysis.run import RankLog, Run
from gpuviz.analysis.tables import devices_present
from gpuviz.analysis.timeline import ResampledSeries, resample, timeline_series
from gpuviz.base.ranks import CLOCK_OFFSET, RankInfo
from gpuviz.log.schema import Kind

__all__ = [
    "ALIGNS", "ClusterSummary", "DEFAULT_THRESHOLD", "RankSummary", "alignment", "assemble_summary", "cluster_summary",
    "featured_rows", "flag_outliers",
    "growth", "rank_rows", "start_epoch_ns", "summarize_rank",
]  # fmt: skip

DEFAULT_THRESHOLD = 0.1
"""Outlier threshold, as a fraction of the median peak (10 %)."""

COLUMNS = ["rank", "host", "local_rank", "device", "peak_bytes", "peak_time_ns", "pool_at_peak",
           "fragmentation_at_peak", "end_bytes", "growth_bytes", "ooms", "transfers", "transfer_bytes",
           "file"]  # fmt: skip


@dataclass(frozen=True)
class ClusterSummary:
    """``table``: one row per device of every rank (``COLUMNS`` plus ``outlier``: ``""``,
    ``"peak"``, ``"growth"`` or ``"peak,growth"``), ordered by rank then device;
    ``series[i]``: row i's bytes in use resampled (times relative to its log's start)."""

    table: pd.DataFrame
    series: list[ResampledSeries]
    threshold: float
    start_epoch_ns: list[int | None] = field(default_factory=list)
    """Per table row, the wall-clock time (ns since the Unix epoch) of its log's first event, or
    None for a log without a wall-clock anchor (empty: none known)."""

    @property
    def outliers(self) -> pd.DataFrame:
        flagged: pd.DataFrame = self.table[self.table["outlier"] != ""]
        return flagged


def _is_gpu(name: str) -> bool:
    return name.rsplit("/", 1)[-1].upper().startswith("GPU")


def rank_rows(
    rank_log: RankLog, *, points: int = 500, gpus_only: bool = True
) -> list[tuple[dict[str, Any], ResampledSeries]]:
    """The summary rows and resampled series of one rank's devices: every GPU the log names
    (one without events is a row of zeros), and with ``gpus_only=False`` also the other
    devices something happened on. A rank whose log names no GPU (a CPU-only run) is summarised
    by the devices something happened on, so that it still counts as a rank."""
    log = rank_log.log
    cols = log.columns
    start = int(cols["time_ns"].min()) if len(log) else 0
    transfers = cols["kind"] == Kind.TRANSFER
    rows = []
    gpus = [name for name in log.device_names if _is_gpu(name)]  # every GPU named, idle ones too
    others = [n for n in devices_present(log) if n not in gpus]
    names = gpus + others if not gpus_only or not gpus else gpus
    for name in names:
        index = log.device_index(name)
        series = timeline_series(log, name)
        moved = transfers & ((cols["device"] == index) | (cols["peer"] == index))
        row = {
            "rank": rank_log.info.rank, "host": rank_log.info.host, "local_rank": rank_log.info.local_rank,
            "device": name, "peak_bytes": 0, "peak_time_ns": 0, "pool_at_peak": 0, "fragmentation_at_peak": 0.0,
            "end_bytes": 0, "growth_bytes": 0, "ooms": int(np.count_nonzero((cols["kind"] == Kind.OOM)
                                                                             & (cols["device"] == index))),
            "transfers": int(np.count_nonzero(moved)), "transfer_bytes": int(cols["size"][moved].sum()),
            "file": rank_log.path.name,
        }  # fmt: skip
        if len(series):
            i = int(np.argmax(series.bytes_in_use))
            times = series.time_ns - start
            end = int(series.bytes_in_use[-1])
            row.update(
                peak_bytes=int(series.bytes_in_use[i]), peak_time_ns=int(times[i]),
                pool_at_peak=int(series.pool_bytes[i]), fragmentation_at_peak=float(series.fragmentation[i]),
                end_bytes=end, growth_bytes=growth(series.bytes_in_use[series.settled], times[series.settled]),
            )  # fmt: skip
        sampled = resample(series, points)
        shifted = ResampledSeries(name, sampled.time_ns - start, sampled.minimum, sampled.maximum)
        rows.append((row, shifted))
    return rows


def growth(bytes_in_use: np.ndarray, times: np.ndarray) -> int:
    """Mean bytes in use over the second half of the time span minus the mean over the first
    half (events weighted alike; 0 for fewer than two events): about 0 for a loop that frees
    what each step allocates, however much each step allocates and frees, and half of what a
    leak kept over the whole run. Means, not two instants, so where each step stands at the
    middle and at the end does not count."""
    if len(times) < 2:
        return 0
    middle = int(np.searchsorted(times, (int(times[0]) + int(times[-1])) / 2, side="right"))
    if middle in (0, len(times)):
        return 0
    return round(float(bytes_in_use[middle:].mean()) - float(bytes_in_use[:middle].mean()))


def flag_outliers(table: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD) -> pd.Series:
    """Per row ``""``, ``"peak"``, ``"growth"`` or ``"peak,growth"`` (see the module docstring)."""
    if not threshold >= 0:
        raise ValueError(f"threshold must be a fraction >= 0, got {threshold!r}")
    active = table["peak_bytes"] > 0
    if not active.any():
        return pd.Series([""] * len(table), index=table.index, dtype=object)
    peaks, growths = table.loc[active, "peak_bytes"], table.loc[active, "growth_bytes"]
    scale = threshold * float(np.median(peaks))
    peak = active & ((table["peak_bytes"] - np.median(peaks)).abs() > scale)
    growth = active & ((table["growth_bytes"] - np.median(growths)).abs() > scale)
    return pd.Series(
        [",".join(n for n, hit in (("peak", p), ("growth", g)) if hit) for p, g in zip(peak, growth, strict=True)],
        index=table.index,
        dtype=object,
    )


@dataclass(frozen=True)
class RankSummary:
    """What one rank's log contributes to a cluster summary: its identity and file, and per
    device one table row (``COLUMNS`` without ``outlier``) and one resampled series. Small
    (``points`` buckets per device) and picklable: what a worker sends back, never events."""

    info: RankInfo
    file: str
    rows: list[dict[str, Any]]
    series: list[ResampledSeries]
    start_epoch_ns: int | None = None
    """The wall-clock time (ns since the Unix epoch) of the log's first event; None without an anchor."""


def summarize_rank(run: Run, position: int, *, points: int = 500, gpus_only: bool = True) -> RankSummary:
    """Open file ``position`` of ``run`` (only that one) and summarise its devices."""
    rank_log = run.open(position)
    pairs = rank_rows(rank_log, points=points, gpus_only=gpus_only)
    return RankSummary(
        rank_log.info, rank_log.path.name, [r for r, _ in pairs], [s for _, s in pairs], start_epoch_ns(rank_log)
    )


def start_epoch_ns(rank_log: RankLog) -> int | None:
    """The wall-clock time (ns since the Unix epoch) of the log's first event, from its
    ``meta["run"]["clock_offset_ns"]``; None for a log without one (or without events)."""
    log = rank_log.log
    meta = log.meta.get("run")
    offset = meta.get(CLOCK_OFFSET) if isinstance(meta, dict) else None
    if not isinstance(offset, int) or isinstance(offset, bool) or not len(log):
        return None
    return int(log.columns["time_ns"].min()) + offset


def assemble_summary(ranks: Iterable[RankSummary], *, threshold: float = DEFAULT_THRESHOLD) -> ClusterSummary:
    """The cluster summary of per-rank summaries (in any order): rows ordered by rank then
    device, outliers flagged at ``threshold``.

    Raises ``ValueError`` when two files claim the same rank on the same host.
    """
    if not threshold >= 0:
        raise ValueError(f"threshold must be a fraction >= 0, got {threshold!r}")
    collected: list[tuple[dict[str, Any], ResampledSeries, int | None]] = []
    seen: dict[tuple[str, int], str] = {}
    for rank in ranks:
        key = (rank.info.host, rank.info.rank)
        if key in seen:
            first, second = sorted((seen[key], rank.file))
            raise ValueError(f"{second} and {first} are both rank {key[1]} on host {key[0]}")
        seen[key] = rank.file
        collected.extend((row, series, rank.start_epoch_ns) for row, series in zip(rank.rows, rank.series, strict=True))
    order = sorted(range(len(collected)), key=lambda i: (collected[i][0]["rank"], collected[i][0]["device"]))
    table = pd.DataFrame([collected[i][0] for i in order], columns=COLUMNS)
    table["outlier"] = flag_outliers(table, threshold)
    return ClusterSummary(table, [collected[i][1] for i in order], threshold, [collected[i][2] for i in order])


def cluster_summary(
    run: Run, *, threshold: float = DEFAULT_THRESHOLD, points: int = 500, gpus_only: bool = True
) -> ClusterSummary:
    """Summarise ``run`` in this process, one log at a time (``gpuviz.dask.profile_run`` does
    the same on workers). ``points``: buckets per resampled series.

    Raises ``ValueError`` when two files claim the same rank on the same host.
    """
    if not threshold >= 0:
        raise ValueError(f"threshold must be a fraction >= 0, got {threshold!r}")
    ranks = (summarize_rank(run, i, points=points, gpus_only=gpus_only) for i in range(len(run)))
    return assemble_summary(ranks, threshold=threshold)


ALIGNS = ("auto", "clock", "start")
"""How ranks line up in time: by wall clock, by their first events, or ``auto`` (by wall clock
when every row has an anchor, else by first events)."""


def alignment(summary: ClusterSummary, align: str = "auto") -> tuple[str, np.ndarray]:
    """``(mode, offsets)``: the alignment used (``"clock"`` or ``"start"``) and per table row the
    ns to add to its series' times (ns since its log's first event) to put it on a common axis:
    with ``"clock"`` that axis is ns since the earliest first event of the run by wall clock,
    with ``"start"`` every offset is 0. ``align="clock"`` raises ``ValueError`` naming the files
    without a wall-clock anchor."""
    if align not in ALIGNS:
        raise ValueError(f"align must be one of {', '.join(ALIGNS)}, not {align!r}")
    starts = summary.start_epoch_ns
    anchored = len(starts) == len(summary.table) and all(start is not None for start in starts)
    if align == "clock" and not anchored:
        missing = sorted({str(f) for f, start in zip(summary.table["file"], starts or [None] * len(summary.table),
                                                    strict=True) if start is None})  # fmt: skip
        raise ValueError(
            f"align='clock' needs every rank's wall-clock anchor (meta['run']['{CLOCK_OFFSET}']); "
            f"without one: {', '.join(missing)}"
        )
    if align == "start" or not anchored or not len(starts):
        return "start", np.zeros(len(summary.table), dtype=np.int64)
    epochs = np.array(starts, dtype=np.int64)
    return "clock", epochs - epochs.min()


def featured_rows(summary: ClusterSummary) -> list[int]:
    """The table rows worth a rank's own report: every outlier and the row with the highest peak
    (the first such row on ties), in table order; none when nothing allocated."""
    table = summary.table
    rows = {i for i, flag in enumerate(table["outlier"]) if flag}
    if len(table) and int(table["peak_bytes"].max()) > 0:
        rows.add(int(np.argmax(table["peak_bytes"].to_numpy())))
    return sorted(rows)
