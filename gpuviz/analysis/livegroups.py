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
from gpuviz.analysis.categories import UNKNOWN, category_codes, preexisting
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
    cats = category_codes(log, allocations)
    before_all = preexisting(log, allocations)
    live = alive_at(allocations, index)
    if not len(live):
        return empty
    rows = allocations.index.get_indexer(live.index)
    category = cats.names()[rows]
    inferred = cats.inferred[rows]
    before = before_all[rows]
    tags = live["tag"].to_numpy()
    site = call_sites(log, user_code=user_code).labels_of(live["stack"].to_numpy())
    # one label per distinct (tag, category, inferred, before, site), broadcast to the rows: the
    # five as one integer key (each code + 1: -1 is a missing tag or site)
    parts = [pd.factorize(tags), pd.factorize(category), pd.factorize(site)]
    spans = [len(parts[0][1]) + 1, len(parts[1][1]) + 1, 2, 2, len(parts[2][1]) + 1]
    key = np.zeros(len(live), dtype=np.int64)
    for column, span in zip(
        [parts[0][0] + 1, parts[1][0] + 1, inferred.astype(np.int64), before.astype(np.int64), parts[2][0] + 1],
        spans,
        strict=True,
    ):
        key = key * span + column
    distinct, inverse = np.unique(key, return_inverse=True)
    values = [[None, *np.asarray(uniques, dtype=object).tolist()] for _, uniques in parts]  # code 0: None
    labels = []
    for packed in distinct.tolist():
        codes = []
        for span in reversed(spans):
            packed, code = divmod(packed, span)
            codes.append(code)
        site_code, b, i, c, t = codes
        labels.append(group_label(values[0][t], str(values[1][c]), bool(i), bool(b), values[2][site_code]))
    what = np.array(labels, dtype=object)[inverse.reshape(-1)]
    sizes = live["size"].to_numpy().astype(np.int64)
    frame = pd.DataFrame(
        {
            "what": what,
            "inferred": inferred.astype(bool) & ~before & (category != UNKNOWN),
            "call_site": np.where(site == None, "", site).astype(object),  # noqa: E711 (elementwise)
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
