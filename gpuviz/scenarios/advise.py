"""Advice backed by a replay: the run's requests served again under its allocator's settings.

``advise(log)`` finds the allocator family that made the run (``analysis.advice``), replays the
busiest device's request stream (``whatif.replay_policy``) under a small grid of that
allocator's knobs and under the other policies, on a simulated device of the GPU's memory, and
answers with numbers:

- a run that hit an out-of-memory error: which settings would have let it finish, and at what
  peak reserved;
- a run that fit: the setting with the lowest peak reserved, and the smallest common GPU it
  fits on (``GPU_SIZES``).

The GPU's memory is the log's where it says (a profiler's ``total_memory``, an XPlane's
``memory_size``); else, at an OOM, what the run had reserved then (the most the GPU gave it);
else the smallest common size holding the run's peak reserved (every size quoted is a
replay's peak, which a GPU at least that large holds as replayed).
Sizes in bytes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from gpuviz.analysis.advice import (
    GPU_SIZES,
    Advice,
    Trial,
    device_capacity,
    empty_cache_words,
    fragmentation_words,
    setting_words,
    smallest_gpu,
    source_allocator,
)
from gpuviz.analysis.comparison import outcome
from gpuviz.analysis.explain import explain
from gpuviz.analysis.moments import oom_indices
from gpuviz.analysis.requests import RequestStream, request_stream
from gpuviz.analysis.timeline import timeline_series
from gpuviz.base.units import GiB, MiB
from gpuviz.capture.upstream import SimUpstream
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind
from gpuviz.scenarios.empty_cache import replay_empty_cache, step_points, unused_peak_points
from gpuviz.scenarios.policies import Policy
from gpuviz.scenarios.whatif import busiest_device, replay_policy

__all__ = ["GPU_SIZES", "Trial", "Advice", "advise", "with_failed_request"]

_SPLITS_MB = (64, 128, 256, 512)
_GC_THRESHOLDS = (0.6, 0.8)


def _recorded_policy(log: EventLog, device: str, family: str) -> Policy:
    options = log.devices[log.device_index(device)].options
    if family == "pytorch":
        source = log.meta.get("source")
        settings = source.get("allocator_settings", {}) if isinstance(source, dict) else {}
        chosen: dict[str, object] = {}
        if settings.get("expandable_segments") or options.get("expandable_segments"):
            chosen["expandable_segments"] = True
        split = settings.get("max_split_size", -1)
        if isinstance(split, int) and 0 < split < (1 << 62) and not chosen:
            chosen["max_split_size_mb"] = split // MiB
        return Policy("torch", chosen)
    if family == "jax":
        return Policy("tf-bfc", {"growth": False, "fraction": 0.75})
    if family == "rmm":
        return Policy("rmm-pool")
    return Policy(
        "tf-bfc", {"growth": bool(options.get("growth", True)), "gc": bool(options.get("garbage_collection"))}
    )


def _grid(family: str, capacity: int, limit: int | None = None) -> list[Policy]:
    """The settings tried; ``limit``: a memory limit (bytes) for TensorFlow's BFC to try."""
    if family == "pytorch":
        own = [Policy("torch"), Policy("torch", {"expandable_segments": True})]
        own += [Policy("torch", {"max_split_size_mb": mb}) for mb in _SPLITS_MB]
        own += [Policy("torch", {"garbage_collection_threshold": g, "fraction": 1.0}) for g in _GC_THRESHOLDS]
        return [*own, Policy("tf-bfc"), Policy("rmm-pool"), Policy("no-pool")]
    if family == "jax":
        own = [Policy("tf-bfc", {"growth": False, "fraction": 0.75}),
               Policy("tf-bfc", {"growth": False, "fraction": 0.9}), Policy("tf-bfc"), Policy("no-pool")]  # fmt: skip
        return [*own, Policy("torch"), Policy("torch", {"expandable_segments": True}), Policy("rmm-pool")]
    if family == "rmm":
        own = [Policy("rmm-pool"), Policy("rmm-pool", {"initial": capacity // 2}),
               Policy("rmm-pool", {"initial": capacity // 2, "maximum": capacity})]  # fmt: skip
        others = [Policy("tf-bfc"), Policy("torch"), Policy("torch", {"expandable_segments": True}), Policy("no-pool")]
        return [*own, *others]
    own = [Policy("tf-bfc", {"growth": True, "gc": False}), Policy("tf-bfc", {"growth": True, "gc": True}),
           Policy("tf-bfc", {"growth": False, "gc": False})]  # fmt: skip
    if family == "tensorflow" and limit is not None and limit < capacity:  # preallocate only what the run needs
        own.append(Policy("tf-bfc", {"growth": False, "gc": False, "limit": limit}))
    others = [Policy("torch"), Policy("torch", {"expandable_segments": True}), Policy("rmm-pool"), Policy("no-pool")]
    return [*own, *others]


def _own(family: str, policy: Policy) -> bool:
    kinds = {"pytorch": ("torch",), "jax": ("tf-bfc", "no-pool"), "rmm": ("rmm-pool",)}.get(family, ("tf-bfc",))
    return policy.kind in kinds


class _QuietReplays(logging.Filter):
    """Drops the warnings a replayed BFC allocator logs when its garbage collection runs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "garbage collection returns" not in str(record.msg)


def _first_oom_device(log: EventLog) -> str | None:
    cols = log.columns
    at = np.flatnonzero(cols["kind"] == Kind.OOM)
    return log.devices[int(cols["device"][at[0]])].name if len(at) else None


def with_failed_request(stream: RequestStream, log: EventLog, oom_index: int) -> RequestStream:
    """``stream`` with the request that failed at log position ``oom_index`` put back where it was
    made (an allocation never freed): a setting lets the run finish only if it serves that too."""
    at = int(np.searchsorted(stream.position, oom_index))
    cols = log.columns

    def put(values: np.ndarray, value: int | bool) -> np.ndarray:
        inserted: np.ndarray = np.insert(values, at, value)
        return inserted

    alloc_of = stream.alloc_of.copy()
    alloc_of[alloc_of >= at] += 1
    return replace(
        stream,
        is_alloc=put(stream.is_alloc, True), deferred=put(stream.deferred, False), alloc_of=put(alloc_of, -1),
        requested=put(stream.requested, int(cols["requested"][oom_index])),
        time_ns=put(stream.time_ns, int(cols["time_ns"][oom_index])), address=put(stream.address, -1),
        tag=put(stream.tag, int(cols["tag"][oom_index])), stack=put(stream.stack, int(cols["stack"][oom_index])),
        position=put(stream.position, oom_index),
    )  # fmt: skip


def _empty_cache_trials(log: EventLog, stream: RequestStream, policy: Policy, capacity: int) -> list[Trial]:
    """The run's own PyTorch settings with ``torch.cuda.empty_cache()`` called after each marked
    step and where the run held the most reserved but unused memory (``scenarios.empty_cache``)."""
    trials = []
    base = setting_words("pytorch", "torch", policy.options)
    seq = log.columns["seq"]
    for where, points in (("steps", step_points(log, stream)), ("unused", unused_peak_points(log, stream))):
        if not len(points):
            continue
        replayed, served, _ = replay_empty_cache(stream, log, policy, SimUpstream(capacity), points)
        label = f"{policy.label}+empty_cache@{where}"
        o = outcome(label, replayed, stream.device, requests=len(stream), served=served)
        events = [int(seq[int(stream.position[p - 1])]) for p in points.tolist()]
        trials.append(Trial(label, "torch", empty_cache_words(base, where, len(points), events), True,
                            served == len(stream), served, len(stream), o.peak_reserved, o.peak_in_use))  # fmt: skip
    return trials


def advise(log: EventLog | str | Path, *, device: str | None = None, capacity: int | None = None) -> Advice:
    """Replay ``log``'s busiest device (or ``device``) under its allocator's settings and the other
    policies (see the module docstring). ``capacity``: the GPU's memory in bytes (default: the
    log's, else inferred). ``log`` may be a path in any format ``gpuviz.load`` reads."""
    if not isinstance(log, EventLog):
        from gpuviz.importers import load

        log = load(log)
    name = device if device is not None else _first_oom_device(log) or busiest_device(log)
    family = source_allocator(log, name)
    ooms = oom_indices(log, name)
    notes: list[str] = []
    basis = "given"
    if capacity is None:
        capacity, basis = device_capacity(log, name), "the log"
    (answer,) = explain(log, name)
    series = timeline_series(log, name)
    at = min(int(np.searchsorted(series.index, answer.index)), len(series) - 1) if len(series) else -1
    fragmentation = fragmentation_words(family, answer, float(series.fragmentation[at]) if at >= 0 else 0.0)
    if capacity is None:
        if len(ooms):
            capacity = answer.reserved
            basis = "assumed: what the run held when it ran out, the most the GPU gave it"
        else:
            reserved = max(answer.reserved, int(series.pool_bytes.max(initial=0)))
            capacity = smallest_gpu(reserved) or GPU_SIZES[-1]
            basis = "assumed: the smallest common size holding what the run reserved"
    start = time.perf_counter()
    stream = request_stream(log, name)
    if len(ooms):
        stream = with_failed_request(stream, log, int(ooms[0]))
    recorded_policy = _recorded_policy(log, name, family)
    trials: list[Trial] = []
    recorded: Trial | None = None
    seen: set[str] = set()
    # expandable segments replay in a time that grows with the device's size: they are replayed
    # first on a device just above what the run reserved, and again on the whole one if that one
    # ran out or released memory to retry (a replay that never reaches a bound does what it does on
    # any larger device; without a GC threshold, PyTorch returns memory only to retry a failure)
    source_peak = int(series.pool_bytes.max(initial=0))
    bound = min(capacity, -(-(source_peak * 5 // 4) // GiB) * GiB)
    # a TensorFlow memory limit: what the run reserved, a quarter more, in whole GiB
    limit = bound if source_peak else None
    quiet = _QuietReplays()  # the replays' own allocator warnings (a BFC's garbage collection) say nothing here
    logging.getLogger("gpuviz").addFilter(quiet)
    try:
        for policy in [recorded_policy, *_grid(family, capacity, limit)]:
            if policy.label in seen:
                continue
            seen.add(policy.label)
            tight = policy.kind == "torch" and bool(policy.options.get("expandable_segments")) and bound < capacity
            replayed, served = replay_policy(stream, log, policy, SimUpstream(bound if tight else capacity))
            o = outcome(policy.label, replayed, name, requests=len(stream), served=served)
            released = np.isin(replayed.columns["kind"], [int(Kind.SEGMENT_FREE), int(Kind.SEGMENT_UNMAP)]).any()
            if tight and (served < len(stream) or released):
                replayed, served = replay_policy(stream, log, policy, SimUpstream(capacity))
                o = outcome(policy.label, replayed, name, requests=len(stream), served=served)
            trial = Trial(policy.label, policy.kind, setting_words(family, policy.kind, policy.options),
                          _own(family, policy), served == len(stream), served, len(stream), o.peak_reserved,
                          o.peak_in_use)  # fmt: skip
            if recorded is None:
                recorded = trial
            trials.append(trial)
        if family == "pytorch":
            trials.extend(_empty_cache_trials(log, stream, recorded_policy, capacity))
    finally:
        logging.getLogger("gpuviz").removeFilter(quiet)
    assert recorded is not None
    if len(ooms) and recorded.finished:
        notes.append(
            "the run's own settings, replayed, serve every request on this capacity: the OOM came from "
            "memory the trace does not show (other processes, the CUDA context) or a smaller limit"
        )
    if stream.unmatched_frees:
        notes.append(f"{stream.unmatched_frees} frees of allocations made before the trace began were left out")
    return Advice(name, family, capacity, basis, bool(len(ooms)), recorded, tuple(trials),
                  time.perf_counter() - start, tuple(notes), fragmentation)  # fmt: skip
