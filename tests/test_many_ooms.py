"""A run with thousands of out-of-memory events: the report's work per OOM is bounded (the first,
the last and a sample become scrubber stops), the summaries name a few and count the rest, and
every one is still listed in the out-of-memory table."""

from __future__ import annotations

import contextlib

import numpy as np

import gpuviz
from gpuviz.analysis.diagnosis import OOM_HINTS
from gpuviz.analysis.moments import OOM_STOPS, oom_indices, scrub_stops
from gpuviz.analysis.profile import profile
from gpuviz.views.result import OOM_LINES, result


def _run_of_ooms(count: int) -> gpuviz.EventLog:
    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), memory_limit="8MiB", log=log)
    assert alloc.allocate(3 << 20)
    for _ in range(count):
        with contextlib.suppress(gpuviz.OutOfMemoryError):
            alloc.allocate(6 << 20)
        alloc.free(alloc.allocate(1 << 10))
    return log


def test_scrubber_stops_at_the_first_the_last_and_a_sample_of_many_ooms() -> None:
    log = _run_of_ooms(2000)
    ooms = oom_indices(log, "GPU:0")
    assert len(ooms) == 2000
    stops = scrub_stops(log, "GPU:0", count=40)
    assert OOM_STOPS == 20 and len(stops) <= 40 + OOM_STOPS + 1  # even stops, the OOMs' sample, the peak
    assert ooms[0] in stops and ooms[-1] in stops
    sample = ooms[np.linspace(0, len(ooms) - 1, OOM_STOPS).round().astype(np.int64)]
    assert np.isin(sample, stops).all()
    assert len(scrub_stops(log, "GPU:0", count=40, max_ooms=len(ooms))) >= len(ooms)  # unbounded: one per OOM
    few = _run_of_ooms(5)
    assert np.isin(oom_indices(few, "GPU:0"), scrub_stops(few, "GPU:0")).all()  # a few: every one


def test_summaries_name_a_few_ooms_and_the_table_lists_them_all() -> None:
    p = profile(_run_of_ooms(2000))
    hints = p.diagnosis.hints
    assert sum("out of memory at event" in h for h in hints) == OOM_HINTS
    assert hints[-1] == (
        "... and 1,990 more out-of-memory events (0 of all 2,000 by fragmentation): "
        "every one is in the out-of-memory table."
    )
    data = result(p)
    named = [line for line in data["summary"] if line.startswith("out of memory on GPU:0")]
    assert len(named) == OOM_LINES and data["summary"][-1] == (
        "... and 1,980 more out-of-memory events (all in their table)"
    )
    table = next(t for t in data["tables"] if t["name"] == "ooms")
    assert table["title"] == "Out-of-memory events (2,000)" and len(table["rows"]) == 2000
    assert table["rows"][0][2] == 6 << 20  # requested, raw bytes
