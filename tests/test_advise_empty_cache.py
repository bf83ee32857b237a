"""``torch.cuda.empty_cache()`` replayed by ``gpuviz advise``: after each marked step and where the
run held the most reserved but unused memory, with the numbers of a run whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from gpuviz.analysis.requests import request_stream
from gpuviz.base.units import GiB, MiB
from gpuviz.capture.upstream import SimUpstream
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind
from gpuviz.scenarios.advise import advise
from gpuviz.scenarios.empty_cache import replay_empty_cache, step_points, unused_peak_points
from gpuviz.scenarios.policies import Policy
from gpuviz.scenarios.torch_caching import TorchCachingAllocator


def _cached_run() -> EventLog:
    """Ten 100 MiB blocks, each its own segment; every other one is freed (500 MiB cached, in
    segments no larger request can use), a step ends, then 1 GiB is asked for. PyTorch's
    defaults peak at 1000 + 1024 MiB reserved; with the cache emptied before the 1 GiB, at
    500 + 1024 MiB. Expandable segments keep the 100 MiB holes mapped: 2040 MiB."""
    alloc = TorchCachingAllocator(SimUpstream(4 * GiB), device="GPU:0")
    blocks = [alloc.allocate(100 * MiB) for _ in range(10)]
    for address in blocks[::2]:
        alloc.free(address)
    alloc.log.mark("train step")
    alloc.allocate(GiB)
    return alloc.log


def test_points_after_the_step_mark_and_at_the_unused_peaks() -> None:
    log = _cached_run()
    stream = request_stream(log, "GPU:0")
    assert len(stream) == 16
    assert step_points(log, stream).tolist() == [15]  # before the 1 GiB request
    # unused bytes after each free: 100 ... 500 MiB; those >= a quarter of 500 MiB, one per window
    assert unused_peak_points(log, stream).tolist() == [12, 13, 14, 15]
    replayed, served, alloc = replay_empty_cache(stream, log, Policy("torch"), SimUpstream(4 * GiB), np.array([15]))
    assert (served, alloc.emptied, alloc.released) == (16, 1, 500 * MiB)
    assert int((replayed.columns["kind"] == Kind.SEGMENT_FREE).sum()) == 5  # the five cached segments
    with pytest.raises(ValueError, match="empty_cache\\(\\) is PyTorch's"):
        replay_empty_cache(stream, log, Policy("tf-bfc"), SimUpstream(4 * GiB), np.array([15]))


def test_advise_answers_with_empty_cache_and_its_replayed_numbers() -> None:
    advice = advise(_cached_run(), capacity=4 * GiB)
    by_policy = {t.policy: t for t in advice.trials}
    assert by_policy["torch"].peak_reserved == 2024 * MiB
    assert by_policy["torch:expandable_segments=true"].peak_reserved == 2040 * MiB
    steps = by_policy["torch+empty_cache@steps"]
    unused = by_policy["torch+empty_cache@unused"]
    assert (steps.finished, steps.own, steps.peak_reserved, steps.peak_in_use) == (True, True, 1524 * MiB, 1524 * MiB)
    assert (unused.finished, unused.peak_reserved) == (True, 1524 * MiB)
    assert steps.setting == "torch.cuda.empty_cache() after each step (1 marked step end: after event 24)"
    assert unused.setting.startswith(
        "torch.cuda.empty_cache() at the 4 moments the run held the most reserved but unused memory (after events "
    )
    # fragmentation as PyTorch measures it, beside the BFC formula (five free 100 MiB segments)
    assert advice.fragmentation == (
        "PyTorch's measures at the peak: reserved but unallocated 500 MiB, inactive split 0 B; "
        "BFC fragmentation (free - largest free chunk) / free: 80%"
    )
    assert advice.lines[-1] == f"fragmentation: {advice.fragmentation}"
    assert advice.headline == (
        "GPU:0: with `torch.cuda.empty_cache() after each step (1 marked step end: after event 24)` this run peaks "
        "at 1.5 GiB reserved instead of 2.0 GiB and fits an 8 GiB GPU."
    )
