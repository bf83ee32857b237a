"""The answer in words: what held the memory at a device's peak (or at its out-of-memory error).

``explain(log)`` gives, per device, the bytes in use and reserved at the moment that matters
(the first OOM, else the peak of bytes in use), what held them by category (``categories``)
with the user call sites behind each (``callsites``), and what was reserved but unused, as
structured data and as one sentence::

    GPU:0 at the peak (51.3 GiB in use, 56.9 GiB reserved): 25.4 GiB optimizer state from
    `optimizers.py:82` and `:84`, 25.7 GiB from before the trace began (no stack), ...;
    5.6 GiB reserved but unused in 1,010 segments

Views render ``Answer.text`` (and ``Answer.holders``); nothing here draws. Sizes in bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuviz.analysis.callsites import NO_STACK, call_sites
from gpuviz.analysis.categories import CATEGORIES, UNKNOWN, CategoryCodes, category_codes, preexisting
from gpuviz.analysis.moments import oom_indices
from gpuviz.analysis.replay import HEAP_KINDS, Replay, replay
from gpuviz.analysis.tables import allocation_table, gpus_first
from gpuviz.analysis.timeline import TimelineSeries, devices_by_peak, series_extremes, timeline_series
from gpuviz.base.units import format_size
from gpuviz.log.eventlog import EventLog

__all__ = ["Holder", "Answer", "explain", "preexisting", "gib", "BEFORE_TRACE", "join_sites"]

BEFORE_TRACE = "from before the trace began"
"""What an allocation alive before a trace began (imported without a stack) is said to come from."""

_SITES = 3  # call sites named per category at most
_HOLDERS = 4  # categories named in the sentence at most (the rest as "...")


def gib(n: int) -> str:
    """Bytes for a sentence: one decimal from 1 GiB up (``51.3 GiB``), else ``format_size``."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else format_size(n)


@dataclass(frozen=True)
class Holder:
    """One category of what was alive: its bytes (chunk sizes), allocations, the top user call
    sites behind it (``file.py:line``, bytes), and whether the category was inferred."""

    category: str  # one of ``categories.CATEGORIES``, or ``BEFORE_TRACE`` (alive before the trace, no category)
    bytes: int
    count: int
    sites: tuple[tuple[str, int], ...]
    inferred: bool
    before_trace: int = 0  # bytes of it allocated before the trace began (no stack)


@dataclass(frozen=True)
class Answer:
    """What held ``device``'s memory at ``moment`` (``"peak"`` or ``"OOM"``), log position ``index``."""

    device: str
    moment: str
    index: int
    in_use: int  # bytes in chunks handed out
    reserved: int  # bytes of the segments held from the device
    segments: int
    inactive_split: int  # free bytes inside segments that also hold allocations (PyTorch's "inactive split")
    requested: int  # at an OOM: the failed request's bytes, else 0
    holders: tuple[Holder, ...]
    by_site: pd.DataFrame  # site, bytes, count, share: alive then by user call site (largest first)
    text: str

    @property
    def unused(self) -> int:
        """Reserved but not in use (PyTorch: reserved but unallocated)."""
        return max(self.reserved - self.in_use, 0)


def join_sites(sites: list[str]) -> str:
    """```a.py:82` and `:84``: call sites in one file after the first are named by line only."""
    parts: list[str] = []
    last_file = None
    for site in sites:
        file, _, line = site.rpartition(":")
        if not line.isdigit():  # an op's name (aten::mm), not a file's line
            file = ""
        parts.append(f"`:{line}`" if file and file == last_file else f"`{site}`")
        last_file = file or None
    if len(parts) <= 2:
        return " and ".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _holders(log: EventLog, live: pd.DataFrame, cats: CategoryCodes, before: np.ndarray,
             user_code: str | None) -> tuple[list[Holder], pd.DataFrame]:  # fmt: skip
    # grouped on integer codes: labels are made per distinct stack, category and site, not per row
    sites = call_sites(log, user_code=user_code)
    stacks, inverse = np.unique(live["stack"].to_numpy(), return_inverse=True)
    inverse = inverse.reshape(-1)
    short_codes, shorts = pd.factorize(sites.named_of(stacks))
    short = short_codes[inverse]  # -1: none
    sizes = live["size"].to_numpy().astype(np.int64)
    # what was alive before the trace began and has no category of its own is one holder
    names = [*CATEGORIES, BEFORE_TRACE]
    category = np.where(before & (cats.category == CATEGORIES.index(UNKNOWN)), len(CATEGORIES), cats.category)
    inferred = cats.inferred
    holders = []
    for code in np.unique(category).tolist():
        rows = np.flatnonzero(category == code)
        named = rows[short[rows] >= 0]
        # bytes per call site, largest first; ties in the order each site first appears
        pairs, first, pair_of = np.unique(short[named], return_index=True, return_inverse=True)
        sums = np.zeros(len(pairs), dtype=np.int64)
        np.add.at(sums, pair_of.reshape(-1), sizes[named])
        order = np.lexsort((first, -sums))
        total = int(sizes[rows].sum())
        top = [(str(shorts[pairs[i]]), int(sums[i])) for i in order.tolist() if sums[i] >= 0.05 * total][:_SITES]
        holders.append(Holder(
            names[code], total, len(rows), tuple(top), bool(inferred[rows].any()), int(sizes[rows][before[rows]].sum()),
        ))  # fmt: skip
    holders.sort(key=lambda h: (-h.bytes, h.category))
    # by user call site (else before the trace, else no stack), largest first
    site_codes, site_names = pd.factorize(sites.labels_of(stacks))
    site = site_codes[inverse]
    keys = np.where(site >= 0, site, np.where(before, len(site_names), len(site_names) + 1))
    labels = np.array([*np.asarray(site_names, dtype=object).tolist(), BEFORE_TRACE, NO_STACK], dtype=object)
    used, key_of = np.unique(keys, return_inverse=True)
    bytes_by = np.zeros(len(used), dtype=np.int64)
    np.add.at(bytes_by, key_of.reshape(-1), sizes)
    count = np.bincount(key_of.reshape(-1), minlength=len(used)).astype(np.int64)
    column = labels[used] if len(used) else np.zeros(0, dtype=object)
    by_site = pd.DataFrame({"site": column, "bytes": bytes_by, "count": count})
    total = int(sizes.sum())
    by_site["share"] = by_site["bytes"] / total if total else 0.0
    by_site = by_site.sort_values(["bytes", "site"], ascending=[False, True], kind="stable").reset_index(drop=True)
    return holders, by_site


def _holder_words(h: Holder) -> str:
    if h.category == BEFORE_TRACE:
        return f"{gib(h.bytes)} {BEFORE_TRACE}" + ("" if h.sites else " (no stack)")
    name = {UNKNOWN: "of unknown use", "parameter": "parameters", "gradient": "gradients"}.get(h.category, h.category)
    words = f"{gib(h.bytes)} {name}"
    if h.sites:
        words += " from " + join_sites([s for s, _ in h.sites])
    return words


def _sentence(a: Answer) -> str:
    if a.moment == "OOM":
        head = (f"{a.device} at the out-of-memory error ({gib(a.requested)} requested; {gib(a.in_use)} in use, "
                f"{gib(a.reserved)} reserved)")  # fmt: skip
    else:
        head = f"{a.device} at the peak ({gib(a.in_use)} in use, {gib(a.reserved)} reserved)"
    shown = [_holder_words(h) for h in a.holders[:_HOLDERS]]
    if len(a.holders) > _HOLDERS:
        shown.append("…")
    held = ", ".join(shown) if shown else "nothing alive"
    plural = "s" if a.segments != 1 else ""
    text = f"{head}: {held}; {gib(a.unused)} reserved but unused in {a.segments:,} segment{plural}"
    if any(h.inferred and h.category != UNKNOWN for h in a.holders[:_HOLDERS]):
        text += " (categories inferred from stacks and op names)"
    return text


def explain(
    log: EventLog,
    device: str | None = None,
    *,
    user_code: str | None = None,
    heap: Replay | None = None,
    series: Mapping[str, TimelineSeries] | None = None,
    allocations: Mapping[str, pd.DataFrame] | None = None,
) -> list[Answer]:
    """What held each device's memory (GPUs first, by peak; only ``device`` when given) at its first OOM,
    else at its peak of bytes in use. ``user_code``: see ``callsites.call_sites``. ``heap``,
    ``series`` and ``allocations`` (per device name): results already computed, reused."""
    cols = log.columns
    present = np.unique(cols["device"][np.isin(cols["kind"], [int(k) for k in HEAP_KINDS])]).tolist()
    names = gpus_first([log.devices[i].name for i in present])
    if device is not None:
        if device not in names:
            raise ValueError(f"device {device!r} has no allocator events (devices: {', '.join(names) or 'none'})")
        names = [device]
    timelines = {n: series[n] if series is not None and n in series else timeline_series(log, n) for n in names}
    names = devices_by_peak({n: series_extremes(timelines[n]).peak.bytes for n in names})
    answers = []
    for name in names:
        timeline = timelines[name]
        peak = series_extremes(timeline).peak
        ooms = oom_indices(log, name)
        index = int(ooms[0]) if len(ooms) else peak.index
        if index < 0:
            continue
        table = allocations[name] if allocations is not None and name in allocations else allocation_table(log, name)
        cats = category_codes(log, table)
        made, freed = table["alloc_index"].to_numpy(), table["free_index"].to_numpy()
        alive = (made <= index) & ((freed < 0) | (freed > index))
        live = table[alive]
        heap = heap or replay(log, checkpoint_every=max(8192, len(log) // 8))  # a few states: a few checkpoints
        state = heap.columns_at(index, device=name)
        in_use = int(state.size[state.in_use].sum())
        reserved = int(state.sizes.sum())
        used_segments = np.unique(state.owner[state.in_use])
        free_in_used = ~state.in_use & np.isin(state.owner, used_segments)
        holders, by_site = _holders(log, live, cats.take(alive), preexisting(log, live), user_code)
        answer = Answer(
            device=name, moment="OOM" if len(ooms) else "peak", index=index, in_use=in_use, reserved=reserved,
            segments=len(state.bases), inactive_split=int(state.size[free_in_used].sum()),
            requested=int(cols["requested"][index]) if len(ooms) else 0, holders=tuple(holders), by_site=by_site,
            text="",
        )  # fmt: skip
        answers.append(_with_text(answer))
    return answers


def _with_text(answer: Answer) -> Answer:
    from dataclasses import replace

    return replace(answer, text=_sentence(answer))
