"""Does the PyTorch model decide as PyTorch did? Replay an imported PyTorch run under the model.

``reproduce(log)`` seeds ``TorchCachingAllocator`` with the heap as it was when the source's
trace began (a snapshot's ring buffer starts mid-run: the segments and allocations alive then
are the importer's first events, ``meta["source"]["trace_start"]``), serves every request of the
trace (frees of allocations from before the trace included), and compares its decisions with
the recorded ones:

    addresses="source"     new segments get the addresses the run got from cudaMalloc, in order
                           (cudaMalloc's addresses decide best-fit ties): every allocation's address,
                           every segment's size and the final heap must match
    addresses="simulated"  new segments come from a simulated device at other addresses: the
                           segment sizes, their order and the peak reserved bytes must still match
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from gpuviz.analysis.replay import replay
from gpuviz.analysis.requests import request_stream
from gpuviz.analysis.timeline import timeline_series
from gpuviz.base.heapstate import HeapState
from gpuviz.base.torch_rules import CachingRules
from gpuviz.capture.scripted_upstream import ScriptedUpstream
from gpuviz.capture.upstream import SimUpstream, Upstream
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind
from gpuviz.scenarios.policies import Policy
from gpuviz.scenarios.torch_caching import TorchCachingAllocator
from gpuviz.scenarios.whatif import UNBOUNDED, busiest_device, replay_policy

__all__ = ["Agreement", "reproduce", "trace_start"]


@dataclass(frozen=True)
class Agreement:
    """How the model's replay compares with the recorded run (bytes; indices count allocations)."""

    device: str
    allocations: int
    same_addresses: int
    first_difference: int | None  # the first allocation placed elsewhere, None when all agree
    segments_source: tuple[int, ...]  # sizes of the segments the trace reserved, in order
    segments_model: tuple[int, ...]
    final_same: bool
    peak_reserved_source: int
    peak_reserved_model: int
    log: EventLog = field(repr=False)

    @property
    def exact(self) -> bool:
        return (
            self.first_difference is None
            and self.segments_source == self.segments_model
            and self.final_same
            and self.peak_reserved_source == self.peak_reserved_model
        )


def trace_start(log: EventLog, device: str) -> int:
    """The log position where the source's own trace begins on ``device`` (after the importer's seed)."""
    source = log.meta.get("source")
    starts = source.get("trace_start", {}) if isinstance(source, dict) else {}
    return int(starts.get(device, 0))


def _segments(log: EventLog, device: int, start: int) -> tuple[list[int], list[int]]:
    cols = log.columns
    mask = (cols["kind"] == Kind.SEGMENT_ALLOC) & (cols["device"] == device)
    mask[:start] = False
    return cols["address"][mask].tolist(), cols["size"][mask].tolist()


def _peak_reserved(log: EventLog, device: str, start: int) -> int:
    """The most bytes ``device`` held reserved from log position ``start - 1`` on."""
    series = timeline_series(log, device)
    after = series.pool_bytes[series.index >= start - 1]
    return int(after.max()) if len(after) else 0


def reproduce(
    log: EventLog,
    *,
    device: str | None = None,
    policy: Policy | None = None,
    addresses: Literal["source", "simulated"] = "source",
) -> Agreement:
    """Replay ``log``'s trace under the PyTorch model (``policy``: a ``torch`` policy with options;
    default the run's own settings from its snapshot) seeded with the heap at the trace's start; see
    the module docstring."""
    name = device if device is not None else busiest_device(log)
    device_id = log.device_index(name)
    start = trace_start(log, name)
    seed: HeapState | None = replay(log).state_at(start - 1, device=name) if start > 0 else None
    held = {s.base: s.size for s in seed.segments} if seed is not None else {}
    bases, sizes = _segments(log, device_id, start)
    upstream: Upstream
    if addresses == "source":
        upstream = ScriptedUpstream(bases, sizes, preexisting=held)
    elif addresses == "simulated":
        upstream = SimUpstream(UNBOUNDED)
    else:
        raise ValueError(f"addresses must be 'source' or 'simulated', not {addresses!r}")
    if policy is not None and policy.kind != "torch":
        raise ValueError(f"reproduce checks the PyTorch model; {policy.kind!r} is another policy")
    chosen = policy if policy is not None else Policy("torch")
    if policy is None:  # the run's own settings, as its snapshot recorded them
        settings = _run_settings(log)
        threshold = settings.get("garbage_collection_threshold")
        gc = float(threshold) if isinstance(threshold, (int, float)) and threshold > 0 else None
        model = TorchCachingAllocator(
            upstream, device=name, log=EventLog(), rules=CachingRules.from_settings(settings),
            garbage_collection_threshold=gc,
        )  # fmt: skip
    else:
        built = chosen.build(upstream, device=name, log=EventLog())
        assert isinstance(built, TorchCachingAllocator)
        model = built
    if model.rules.expandable:  # the seed's mapped ranges would be seeded as cudaMalloc'd segments
        raise ValueError(
            "reproduce does not check runs with expandable segments: the model maps its own virtual "
            "addresses and cannot seed the run's mapped ranges (use whatif with torch:expandable_segments=true)"
        )
    if seed is not None:
        model.seed(seed)
    stream = request_stream(log, name, start=start, keep_unmatched=True)
    replayed, _ = replay_policy(stream, log, chosen, upstream, allocator=model)
    cols, out = log.columns, replayed.columns
    seeded_allocs = sum(c.in_use for c in seed.chunks()) if seed is not None else 0
    source_allocs = cols["address"][stream.position[stream.is_alloc]]
    model_allocs = out["address"][out["kind"] == Kind.ALLOC][seeded_allocs:]
    n = min(len(source_allocs), len(model_allocs))
    differ = np.flatnonzero(source_allocs[:n] != model_allocs[:n])
    first = int(differ[0]) if len(differ) else (None if len(source_allocs) == len(model_allocs) else n)
    _, model_sizes = _segments(replayed, 0, 0)
    final_same = replay(replayed).state_at(-1) == replay(log).state_at(-1, device=name)
    return Agreement(
        device=name,
        allocations=len(source_allocs),
        same_addresses=int(n - len(differ)),
        first_difference=first,
        segments_source=tuple(sizes),
        segments_model=tuple(model_sizes[len(held) :]),
        final_same=final_same,
        peak_reserved_source=_peak_reserved(log, name, start),
        peak_reserved_model=_peak_reserved(replayed, name, 0),
        log=replayed,
    )


def _run_settings(log: EventLog) -> dict[str, Any]:
    """A PyTorch snapshot's ``allocator_settings`` as the importer kept them (empty when absent)."""
    source = log.meta.get("source")
    settings = source.get("allocator_settings") if isinstance(source, dict) else None
    return dict(settings) if isinstance(settings, dict) else {}
