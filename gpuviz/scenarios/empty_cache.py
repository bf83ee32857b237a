"""``torch.cuda.empty_cache()`` replayed: a run's requests served again by PyTorch's caching
allocator, which releases its cached free segments at chosen points.

A trace does not say where a program would call ``empty_cache()``, so two places are modelled,
both ones a user can find in their code:

- **step boundaries** (``step_points``): right after the end of each span (or at each point
  mark) the log marks as a step: a label naming an optimizer's ``step`` or ``zero_grad``
  (PyTorch's ``Optimizer.step#AdamW.step`` annotations a snapshot or profiler records), an
  iteration or an epoch. This is where PyTorch users call it: at the end of an iteration.
- **where the run held the most reserved-but-unused memory** (``unused_peak_points``): the
  request stream is cut into ``2 x PEAKS`` windows; in each, the moment (after a whole
  operation) with the most reserved-but-unused bytes in the recorded run; of those, the
  ``PEAKS`` largest holding at least a quarter of the largest. Releasing there returns what the
  cache held idle at its worst.

At each point the allocator does what ``empty_cache()`` does (``TorchCachingAllocator.
release_cached_blocks``): it completes the frees waiting on other streams, then returns every
wholly free segment (with expandable segments: unmaps their free pages). The replay is the
Python model (the C what-if core has no ``empty_cache``), the same one the C replay is checked
against. Sizes in bytes.
"""

from __future__ import annotations

import re

import numpy as np

from gpuviz.analysis.requests import RequestStream
from gpuviz.analysis.timeline import timeline_series
from gpuviz.base.torch_rules import FREE_REQUESTED_MARK, CachingRules
from gpuviz.base.units import MiB
from gpuviz.capture.upstream import Upstream
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind, MarkPhase
from gpuviz.scenarios.policies import Policy
from gpuviz.scenarios.torch_caching import TorchCachingAllocator
from gpuviz.scenarios.whatif import replay_policy

__all__ = ["PEAKS", "STEP_LABEL", "step_points", "unused_peak_points", "replay_empty_cache", "EmptyingAllocator"]

PEAKS = 8
"""The most moments of reserved-but-unused memory ``unused_peak_points`` picks."""

STEP_LABEL = re.compile(r"optimizer\.step|\.step\b|zero_grad|\bstep\b|iteration|epoch", re.IGNORECASE)
"""Mark labels that end a step."""


class EmptyingAllocator(TorchCachingAllocator):
    """PyTorch's caching allocator calling ``empty_cache()`` before the requests whose positions
    (0-based, counting every ``allocate``, ``free`` and ``complete_free`` call) are in ``before``."""

    before: frozenset[int] = frozenset()
    calls = 0
    emptied = 0  # how many times it released its cache
    released = 0  # bytes released, in all
    _segments_now: dict[int, int] | None = None  # the segments, read once per release

    def release_cached_blocks(self) -> int:
        # the heap's segment table is read once per release, not once per free block: releasing
        # only removes segments, and each block asks about its own segment before it is released
        self._segments_now = self.heap.segments
        try:
            return super().release_cached_blocks()
        finally:
            self._segments_now = None

    def _is_split(self, address: int) -> bool:
        segments = self._segments_now
        if segments is None:
            return super()._is_split(address)
        block = self._blocks[address]
        return not (address == block.segment and block.size == segments[block.segment])

    def _tick(self) -> None:
        if self.calls in self.before:
            self.released += self.release_cached_blocks()
            self.emptied += 1
        self.calls += 1

    def allocate(self, nbytes: int, *, stream: int = 0, tag: int = -1, stack: int = -1) -> int:
        self._tick()
        return super().allocate(nbytes, stream=stream, tag=tag, stack=stack)

    def free(self, address: int, *, deferred: bool = False, key: object = None) -> None:
        self._tick()
        super().free(address, deferred=deferred, key=key)

    def complete_free(self, address: int, *, key: object = None) -> bool:
        self._tick()
        return super().complete_free(address, key=key)


def _requests_after(stream: RequestStream, positions: np.ndarray) -> np.ndarray:
    """The stream index of the first request after each log position (sorted, unique, in range)."""
    after = np.searchsorted(stream.position, positions, side="right")
    unique: np.ndarray = np.unique(after[(after > 0) & (after < len(stream))])
    return unique


def step_points(log: EventLog, stream: RequestStream) -> np.ndarray:
    """Stream indices right after each step boundary the log marks (see the module docstring)."""
    cols = log.columns
    at = np.flatnonzero((cols["kind"] == Kind.MARK) & (cols["flags"] != int(MarkPhase.BEGIN)))
    if not len(at):
        return np.zeros(0, dtype=np.int64)
    labels = {}
    keep = []
    for position, tag in zip(at.tolist(), cols["tag"][at].tolist(), strict=True):
        if tag not in labels:
            text = log.strings[tag] if 0 <= tag < len(log.strings) else ""
            labels[tag] = text != FREE_REQUESTED_MARK and bool(STEP_LABEL.search(text))
        if labels[tag]:
            keep.append(position)
    return _requests_after(stream, np.asarray(keep, dtype=np.int64))


def unused_peak_points(log: EventLog, stream: RequestStream, *, peaks: int = PEAKS) -> np.ndarray:
    """Stream indices right after the moments the recorded run held the most reserved-but-unused
    bytes (see the module docstring); empty when it never held any."""
    series = timeline_series(log, stream.device)
    if not len(series) or not len(stream):
        return np.zeros(0, dtype=np.int64)
    unused = np.where(series.settled, series.pool_bytes - series.bytes_in_use, 0).astype(np.int64)
    request = np.searchsorted(stream.position, series.index, side="right")  # the next request's index
    window = np.minimum(request * (2 * peaks) // max(len(stream), 1), 2 * peaks - 1)
    best = np.full(2 * peaks, -1, dtype=np.int64)
    order = np.lexsort((-np.arange(len(unused)), unused))  # most unused last; the earliest on ties
    best[window[order]] = order  # the last write per window wins: its most unused moment
    best = best[best >= 0]
    best = best[unused[best] > 0]
    if not len(best):
        return np.zeros(0, dtype=np.int64)
    top = int(unused[best].max())
    chosen = best[unused[best] * 4 >= top]
    chosen = chosen[np.argsort(-unused[chosen], kind="stable")[:peaks]]
    return _requests_after(stream, series.index[chosen])


def replay_empty_cache(
    stream: RequestStream, source: EventLog, policy: Policy, upstream: Upstream, points: np.ndarray
) -> tuple[EventLog, int, EmptyingAllocator]:
    """Serve ``stream`` with the ``torch`` ``policy`` over ``upstream``, calling ``empty_cache()``
    before each request index in ``points``; returns the replay's log, the requests served and
    the allocator (``emptied``, ``released``)."""
    if policy.kind != "torch":
        raise ValueError(f"empty_cache() is PyTorch's: the policy must be torch, not {policy.kind!r}")
    o = policy.options
    split = o.get("max_split_size_mb")
    settings = {
        "max_split_size": -1 if split is None else int(split) * MiB,  # type: ignore[call-overload]
        "roundup_power2_divisions": o.get("roundup_power2_divisions", 0),
        "expandable_segments": bool(o.get("expandable_segments", False)),
    }
    alloc = EmptyingAllocator(
        upstream,
        device=stream.device,
        log=EventLog(),
        rules=CachingRules.from_settings(settings),
        garbage_collection_threshold=o.get("garbage_collection_threshold"),  # type: ignore[arg-type]
        memory_fraction=o.get("fraction"),  # type: ignore[arg-type]
    )
    alloc.before = frozenset(int(p) for p in points.tolist())
    replayed, served = replay_policy(stream, source, policy, upstream, allocator=alloc)
    return replayed, served, alloc
