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

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from gpuviz.analysis.advice import device_capacity, source_allocator
from gpuviz.analysis.comparison import outcome
from gpuviz.analysis.explain import explain, gib
from gpuviz.analysis.moments import oom_indices
from gpuviz.analysis.requests import RequestStream, request_stream
from gpuviz.analysis.timeline import timeline_series
from gpuviz.base.units import GiB, MiB
from gpuviz.capture.upstream import SimUpstream
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind
from gpuviz.scenarios.policies import Policy
from gpuviz.scenarios.whatif import busiest_device, replay_policy

__all__ = ["GPU_SIZES", "Trial", "Advice", "advise", "setting_words"]

GPU_SIZES = tuple(n * GiB for n in (8, 12, 16, 24, 32, 40, 48, 64, 80, 94, 141, 192))
"""Common GPU memory sizes (bytes), smallest first."""

_SPLITS_MB = (64, 128, 256, 512)
_GC_THRESHOLDS = (0.6, 0.8)


def smallest_gpu(peak_reserved: int) -> int | None:
    """The smallest of ``GPU_SIZES`` holding ``peak_reserved`` bytes, None when none does."""
    return next((size for size in GPU_SIZES if size >= peak_reserved), None)


def setting_words(family: str, policy: Policy) -> str:
    """How a user of ``family`` sets ``policy`` (or, for another allocator, what it is)."""
    o = policy.options
    if policy.kind == "torch" and family == "pytorch":
        parts = []
        if o.get("expandable_segments"):
            parts.append("expandable_segments:True")
        if "max_split_size_mb" in o:
            parts.append(f"max_split_size_mb:{o['max_split_size_mb']}")
        if "garbage_collection_threshold" in o:
            parts.append(f"garbage_collection_threshold:{o['garbage_collection_threshold']}")
        words = f"PYTORCH_CUDA_ALLOC_CONF={','.join(parts)}" if parts else "PyTorch's defaults"
        if "fraction" in o:
            words += f" with torch.cuda.set_per_process_memory_fraction({o['fraction']})"
        return words
    if policy.kind == "tf-bfc" and family == "jax":
        if o.get("growth", True):
            return "XLA_PYTHON_CLIENT_PREALLOCATE=false"
        return f"XLA_PYTHON_CLIENT_MEM_FRACTION={o.get('fraction', 0.75)}"
    if policy.kind == "no-pool" and family == "jax":
        return "XLA_PYTHON_CLIENT_ALLOCATOR=platform"
    if policy.kind == "tf-bfc" and family in ("tensorflow", "gpuviz"):
        if family == "gpuviz":
            words = f"growth={o.get('growth', True)}, garbage_collection={o.get('gc', False)}"
            return words + (f", memory_limit={gib(int(o['limit']))}" if "limit" in o else "")  # type: ignore[call-overload]
        words = ("memory growth on (tf.config.experimental.set_memory_growth / TF_FORCE_GPU_ALLOW_GROWTH=true)"
                 if o.get("growth", True) else "memory growth off (the BFC preallocates)")  # fmt: skip
        if o.get("gc"):
            words += ", the BFC's garbage collection of free regions on OOM"
        if "limit" in o:
            words += f", memory_limit={gib(int(o['limit']))}"  # type: ignore[call-overload]
        return words
    if policy.kind == "rmm-pool" and family == "rmm":
        initial = int(o.get("initial", 0))  # type: ignore[call-overload]
        maximum = o.get("maximum")
        return f"rmm pool: initial_pool_size={gib(initial)}" + (
            f", maximum_pool_size={gib(int(maximum))}" if maximum is not None else ""  # type: ignore[call-overload]
        )
    names = {"tf-bfc": "a BFC allocator (TensorFlow's, XLA's)", "torch": "PyTorch's caching allocator",
             "rmm-pool": "an RMM pool", "no-pool": "no pool (cudaMalloc per tensor: the lower bound)"}  # fmt: skip
    words = names[policy.kind]
    if policy.kind == "torch" and o.get("expandable_segments"):
        words += " with expandable segments"
    return words


@dataclass(frozen=True)
class Trial:
    """One replay: the policy, how a user sets it, and what it did (bytes)."""

    policy: Policy
    setting: str
    own: bool  # a setting of the allocator that made the run (else another policy)
    finished: bool
    served: int
    requests: int
    peak_reserved: int
    peak_in_use: int

    @property
    def smallest_gpu(self) -> int | None:
        """The smallest common GPU size holding this replay's peak reserved bytes."""
        return smallest_gpu(self.peak_reserved)


@dataclass(frozen=True)
class Advice:
    """What ``advise`` found for ``device``; ``lines`` says it in words."""

    device: str
    family: str
    capacity: int
    capacity_basis: str  # "the log", "assumed" (the smallest common size above the OOM) or "a bound"
    hit_oom: bool
    recorded: Trial  # the run's own settings, replayed
    trials: tuple[Trial, ...]  # the grid, in order tried
    seconds: float  # the replays' wall time
    notes: tuple[str, ...] = field(default=())

    @property
    def finishing(self) -> list[Trial]:
        """The settings under which every request was served, lowest peak reserved first (own first on ties)."""
        done = [t for t in self.trials if t.finished]
        return sorted(done, key=lambda t: (t.peak_reserved, not t.own))

    @property
    def best(self) -> Trial | None:
        """The allocator's own setting with the lowest peak reserved that finishes (else any policy's)."""
        own = [t for t in self.finishing if t.own]
        return own[0] if own else (self.finishing[0] if self.finishing else None)

    @property
    def lines(self) -> list[str]:
        lines = [self.headline]
        for t in sorted(self.trials, key=lambda t: (not t.own, not t.finished, t.peak_reserved)):
            state = "finishes" if t.finished else f"out of memory after {t.served:,} of {t.requests:,} requests"
            fits = t.smallest_gpu
            where = f", fits {_a(fits)}" if t.finished and fits else ""
            lines.append(f"  {t.setting}: {state}, peak reserved {gib(t.peak_reserved)}{where}")
        lines.extend(f"note: {n}" for n in self.notes)
        return lines

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def headline(self) -> str:
        """The answer in one sentence."""
        best, rec = self.best, self.recorded
        gpu = f"a GPU of {gib(self.capacity)} ({self.capacity_basis})"
        if self.hit_oom:
            if best is None:
                return f"{self.device}: no setting tried lets this run finish on {gpu}; it needs a larger GPU."
            own = [t for t in self.finishing if t.own]
            named = ", ".join(f"`{t.setting}` (peak reserved {gib(t.peak_reserved)})" for t in (own or [best])[:3])
            return f"{self.device}: the run ran out of memory; on {gpu} it would have finished with {named}."
        if best is None:
            return f"{self.device}: no setting tried serves every request on {gpu}."
        fits = best.smallest_gpu
        fit_words = f" and fits {_a(fits)}" if fits else ""
        if best.peak_reserved < rec.peak_reserved:
            return (f"{self.device}: with `{best.setting}` this run peaks at {gib(best.peak_reserved)} reserved "
                    f"instead of {gib(rec.peak_reserved)}{fit_words}.")  # fmt: skip
        return (f"{self.device}: the run's own settings already give the lowest peak reserved tried "
                f"({gib(rec.peak_reserved)}){fit_words}.")  # fmt: skip


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


def _grid(family: str, capacity: int) -> list[Policy]:
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
    others = [Policy("torch"), Policy("torch", {"expandable_segments": True}), Policy("rmm-pool"), Policy("no-pool")]
    return [*own, *others]


def _own(family: str, policy: Policy) -> bool:
    kinds = {"pytorch": ("torch",), "jax": ("tf-bfc", "no-pool"), "rmm": ("rmm-pool",)}.get(family, ("tf-bfc",))
    return policy.kind in kinds


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


def _a(size: int) -> str:
    """``a 64 GiB GPU``, ``an 8 GiB GPU``."""
    gib_count = size // GiB
    return f"{'an' if str(gib_count).startswith('8') or gib_count in (11, 18) else 'a'} {gib_count} GiB GPU"


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
    if capacity is None:
        if len(ooms):
            (answer,) = explain(log, name)
            capacity = answer.reserved
            basis = "assumed: what the run held when it ran out, the most the GPU gave it"
        else:
            (answer,) = explain(log, name)
            reserved = max(answer.reserved, int(timeline_series(log, name).pool_bytes.max(initial=0)))
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
    source_peak = int(timeline_series(log, name).pool_bytes.max(initial=0))
    bound = min(capacity, -(-(source_peak * 5 // 4) // GiB) * GiB)
    for policy in [recorded_policy, *_grid(family, capacity)]:
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
        trial = Trial(policy, setting_words(family, policy), _own(family, policy), served == len(stream), served,
                      len(stream), o.peak_reserved, o.peak_in_use)  # fmt: skip
        if recorded is None:
            recorded = trial
        trials.append(trial)
    assert recorded is not None
    if len(ooms) and recorded.finished:
        notes.append(
            "the run's own settings, replayed, serve every request on this capacity: the OOM came from "
            "memory the trace does not show (other processes, the CUDA context) or a smaller limit"
        )
    if stream.unmatched_frees:
        notes.append(f"{stream.unmatched_frees} frees of allocations made before the trace began were left out")
    return Advice(name, family, capacity, basis, bool(len(ooms)), recorded, tuple(trials),
                  time.perf_counter() - start, tuple(notes))  # fmt: skip
