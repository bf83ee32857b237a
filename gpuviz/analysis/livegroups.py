"""Who held the memory at a moment: the allocations live then, grouped.

A real run holds hundreds of allocations of the same kind at its peak (one per layer's weight,
gradient or optimizer slot; hundreds of blocks alive before the trace began). Listed one by one
they hide the answer. ``live_groups`` groups the allocations live at a log position by

- *what*: ``PREEXISTING_LABEL`` for memory alive before the trace began, else its category
  (``categories``; ``" (inferred)"`` appended where it is inferred), else (an unknown category)
  its tag, else ``"unknown"``;
- *call site*: the user call site of its stack, else its op (``callsites``), None without a stack;
- *size*: its chunk's bytes,

one row per group, most bytes first: ``what``, ``inferred`` (bool), ``call_site``, ``size``
(bytes of each), ``count``, ``bytes`` (count x size), ``share`` (of all bytes live then) and
``first_alloc_index`` (the log position of its earliest allocation: ties in bytes go to the
earlier group). The allocations themselves stay in ``diagnosis.live_table``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuviz.analysis.callsites import call_sites
from gpuviz.analysis.categories import UNKNOWN, categories, preexisting
from gpuviz.analysis.tables import alive_at
from gpuviz.log.eventlog import EventLog

__all__ = ["LIVE_GROUP_COLUMNS", "PREEXISTING_LABEL", "live_groups", "group_label"]

PREEXISTING_LABEL = "preexisting (alive before the trace)"

LIVE_GROUP_COLUMNS = ["what", "inferred", "call_site", "size", "count", "bytes", "share", "first_alloc_index"]


def group_label(tag: object, category: str, inferred: bool, before: bool, site: str | None = None) -> str:
    """The *what* of one allocation (see the module docstring); a tag that only repeats its call
    site ``site`` (a profiler's op) is not said twice."""
    if before:
        return PREEXISTING_LABEL
    if category != UNKNOWN:
        return f"{category} (inferred)" if inferred else category
    named = isinstance(tag, str) and tag and tag != "PREEXISTING" and tag != site
    return str(tag) if named else UNKNOWN


def live_groups(log: EventLog, allocations: pd.DataFrame, index: int, *, user_code: str | None = None) -> pd.DataFrame:
    """The allocations of ``allocations`` (an ``allocation_table`` of ``log``) live right after log
    position ``index``, grouped by what, call site and size (``LIVE_GROUP_COLUMNS``, most bytes first).
    ``user_code``: see ``callsites.call_sites``."""
    empty: pd.DataFrame = pd.DataFrame(columns=LIVE_GROUP_COLUMNS)
    if index < 0 or not len(allocations):
        return empty
    cats = categories(log, allocations)
    before_all = preexisting(log, allocations)
    live = alive_at(allocations, index)
    if not len(live):
        return empty
    rows = allocations.index.get_indexer(live.index)
    category = cats["category"].to_numpy()[rows]
    inferred = cats["inferred"].to_numpy()[rows]
    before = before_all[rows]
    tags = live["tag"].to_numpy()
    sites = call_sites(log, user_code=user_code)
    stacks = live["stack"].to_numpy()
    site = [sites.label(int(s)) for s in stacks.tolist()]
    labels: dict[tuple[object, str, bool, bool, str | None], str] = {}
    what = []
    for key in zip(tags.tolist(), category.tolist(), inferred.tolist(), before.tolist(), site, strict=True):
        label = labels.get(key)
        if label is None:
            label = labels[key] = group_label(*key)
        what.append(label)
    sizes = live["size"].to_numpy().astype(np.int64)
    frame = pd.DataFrame(
        {
            "what": what,
            "inferred": [
                bool(i) and not b and c != UNKNOWN
                for i, b, c in zip(inferred.tolist(), before.tolist(), category.tolist(), strict=True)
            ],
            "call_site": [s if s is not None else "" for s in site],
            "size": sizes,
            "alloc_index": live["alloc_index"].to_numpy(),
        }
    )
    grouped = frame.groupby(["what", "call_site", "size"], sort=False).agg(
        inferred=("inferred", "any"), count=("alloc_index", "size"), first_alloc_index=("alloc_index", "min")
    )
    grouped = grouped.reset_index()
    grouped["bytes"] = grouped["size"].astype(np.int64) * grouped["count"].astype(np.int64)
    total = int(sizes.sum())
    grouped["share"] = grouped["bytes"] / total if total else 0.0
    grouped["call_site"] = pd.Series(
        [s or None for s in grouped["call_site"].tolist()], dtype=object, index=grouped.index
    )
    grouped = grouped.sort_values(["bytes", "first_alloc_index"], ascending=[False, True], kind="stable")
    result: pd.DataFrame = grouped[LIVE_GROUP_COLUMNS].reset_index(drop=True)
    return result
