"""Which allocator made a run, and advice in its own words.

Each framework names its allocator's knobs and measures fragmentation its own way; advice that
names TensorFlow's options on a PyTorch run helps nobody. ``source_allocator`` says which
allocator family a device's events come from:

=============  ==============================================================================
family         knobs named in advice
=============  ==============================================================================
pytorch        ``PYTORCH_CUDA_ALLOC_CONF``: ``expandable_segments``, ``max_split_size_mb``,
               ``garbage_collection_threshold``; ``torch.cuda.empty_cache()``,
               ``torch.cuda.set_per_process_memory_fraction``. Fragmentation as PyTorch measures
               it: reserved but unallocated bytes, inactive split bytes
tensorflow     ``tf.config.experimental.set_memory_growth`` / ``TF_FORCE_GPU_ALLOW_GROWTH`` /
               ``allow_growth``, a memory limit (``set_logical_device_configuration``), the
               BFC's garbage collection
jax            ``XLA_PYTHON_CLIENT_PREALLOCATE``, ``XLA_PYTHON_CLIENT_MEM_FRACTION``,
               ``XLA_PYTHON_CLIENT_ALLOCATOR``
rmm            the pool's ``initial_pool_size`` and ``maximum_pool_size``
gpuviz         gpuviz's own BFC allocator (TensorFlow's policy): ``growth``, ``memory_limit``,
               ``garbage_collection``
=============  ==============================================================================

Every family also gets the BFC formula, ``(free - largest free chunk) / free``, labelled as such,
and says whether that is its own measure (TensorFlow's and XLA's BFC) or what it measures
instead (PyTorch: reserved but unallocated bytes, inactive split bytes; RMM: none).
``Advice`` and ``Trial`` hold what ``scenarios.advise`` found by replaying a run, and say it in
words. Pure functions; sizes in bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuviz.analysis.explain import gib
from gpuviz.base.units import GiB, MiB
from gpuviz.log.eventlog import EventLog

if TYPE_CHECKING:
    from gpuviz.analysis.explain import Answer

__all__ = [
    "FAMILIES",
    "GPU_SIZES",
    "Advice",
    "Trial",
    "source_allocator",
    "device_capacity",
    "fragmentation_hint",
    "fragmentation_words",
    "setting_words",
    "empty_cache_words",
    "smallest_gpu",
]

FAMILIES = ("pytorch", "tensorflow", "jax", "rmm", "gpuviz")

_CAPACITY_KEYS = ("total_memory", "memory_size", "memory_capacity", "capacity", "memory_limit")


def source_allocator(log: EventLog, device: str) -> str:
    """The allocator family (one of ``FAMILIES``) that made ``device``'s events in ``log``."""
    options = log.devices[log.device_index(device)].options
    allocator = str(options.get("allocator", options.get("policy", ""))).lower()
    source = log.meta.get("source")
    fmt = str(source.get("format", "")) if isinstance(source, dict) else ""
    tool = str(source.get("tool", "")).lower() if isinstance(source, dict) else ""
    if fmt.startswith("pytorch") or allocator.startswith(("pytorch", "torch")):
        return "pytorch"
    if "rmm" in fmt or allocator == "rmm" or allocator.startswith("rmm"):
        return "rmm"
    if fmt in ("xplane", "xprof-memory-profile", "tf-memory") or fmt.startswith("tensorflow") or fmt.startswith("tf"):
        return "jax" if _looks_like_jax(log, device, tool) else "tensorflow"
    return "gpuviz"


def _looks_like_jax(log: EventLog, device: str, tool: str) -> bool:
    """A TensorFlow/JAX profile made by JAX: a TPU, a tool that says so, or jitted function names
    (``jit_*``, ``pjit``) and no TensorFlow function names (``__inference_*``)."""
    if device.startswith("TPU") or (tool and "jax" in tool and "tensorflow" not in tool):
        return True
    names = log.strings[: min(len(log.strings), 5000)]
    jitted = any(s.startswith(("jit_", "pjit", "xla_computation")) for s in names)
    tf_functions = any(s.startswith(("__inference_", "__forward_", "__backward_")) or "/replica_" in s for s in names)
    return jitted and not tf_functions


def device_capacity(log: EventLog, device: str) -> int | None:
    """The device's memory in bytes where the log says (a profiler's ``total_memory``, an XPlane's
    ``memory_size``, a simulated device's ``capacity`` or an allocator's ``memory_limit``), else None."""
    options = log.devices[log.device_index(device)].options
    sizes = [v for v in (options.get(key) for key in _CAPACITY_KEYS) if isinstance(v, int) and v > 0]
    return min(sizes) if sizes else None  # a memory limit below the device's size is what the run had


_OWN_MEASURE = {
    "tensorflow": ", TensorFlow's own measure (its BFC allocator's and memory profile's)",
    "jax": ", XLA's own measure (its BFC allocator's and memory profile's)",
    "rmm": "; RMM has no measure of its own",
    "gpuviz": ", gpuviz's BFC allocator's own measure",
}


def fragmentation_words(family: str, answer: Answer | None, bfc: float) -> str:
    """Fragmentation as the source allocator measures it, beside the BFC formula, each labelled:
    PyTorch's reserved but unallocated and inactive split bytes; TensorFlow's and XLA's BFC
    measure by the formula itself; RMM measures none."""
    formula = f"BFC fragmentation (free - largest free chunk) / free: {bfc:.0%}"
    if family == "pytorch" and answer is not None:
        return (
            f"PyTorch's measures at the {answer.moment}: reserved but unallocated {gib(answer.unused)}, "
            f"inactive split {gib(answer.inactive_split)}; {formula}"
        )
    unused = f"; reserved but unused at the {answer.moment}: {gib(answer.unused)}" if answer is not None else ""
    return f"{formula}{_OWN_MEASURE.get(family, _OWN_MEASURE['gpuviz'])}{unused}"


_ADVICE = {
    "pytorch": "try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb) and run "
    "`gpuviz advise` to see each setting replayed",
    "tensorflow": "enable memory growth (tf.config.experimental.set_memory_growth or TF_FORCE_GPU_ALLOW_GROWTH=true), "
    "allocate large, long-lived buffers first; `gpuviz advise` replays the BFC's settings",
    "jax": "try XLA_PYTHON_CLIENT_PREALLOCATE=false or XLA_PYTHON_CLIENT_ALLOCATOR=platform; `gpuviz advise` "
    "replays them",
    "rmm": "size the pool (initial_pool_size, maximum_pool_size) to the peak; `gpuviz advise` replays pool sizes",
    "gpuviz": "allocate large, long-lived buffers first and release memory between experiments",
}


def fragmentation_hint(log: EventLog, device: str, worst: float, answer: Answer | None) -> str:
    """The diagnosis hint for fragmentation ``worst`` (BFC formula, 0-1) on ``device``, in the
    words of the allocator that made the run."""
    family = source_allocator(log, device)
    if family == "gpuviz":
        return (
            f"{device}: fragmentation reaches {worst:.0%}: free memory is split into chunks too small to reuse;"
            " allocate large, long-lived buffers first and release memory between experiments."
        )
    measures = fragmentation_words(family, answer, worst)
    return f"{device}: fragmentation reaches {worst:.0%} ({measures}): {_ADVICE[family]}."


GPU_SIZES = tuple(n * GiB for n in (8, 12, 16, 24, 32, 40, 48, 64, 80, 94, 141, 192))
"""Common GPU memory sizes (bytes), smallest first."""


def _a(size: int) -> str:
    """``a 64 GiB GPU``, ``an 8 GiB GPU``."""
    gib_count = size // GiB
    return f"{'an' if str(gib_count).startswith('8') or gib_count in (11, 18) else 'a'} {gib_count} GiB GPU"


def smallest_gpu(peak_reserved: int) -> int | None:
    """The smallest of ``GPU_SIZES`` holding ``peak_reserved`` bytes, None when none does."""
    return next((size for size in GPU_SIZES if size >= peak_reserved), None)


def setting_words(family: str, kind: str, o: Mapping[str, object]) -> str:
    """How a user of ``family`` sets the what-if policy ``kind`` with options ``o`` (or, for
    another allocator, what it is): ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``."""
    if kind == "torch" and family == "pytorch":
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
    if kind == "tf-bfc" and family == "jax":
        if o.get("growth", True):
            return "XLA_PYTHON_CLIENT_PREALLOCATE=false"
        return f"XLA_PYTHON_CLIENT_MEM_FRACTION={o.get('fraction', 0.75)}"
    if kind == "no-pool" and family == "jax":
        return "XLA_PYTHON_CLIENT_ALLOCATOR=platform"
    if kind == "tf-bfc" and family in ("tensorflow", "gpuviz"):
        if family == "gpuviz":
            words = f"growth={o.get('growth', True)}, garbage_collection={o.get('gc', False)}"
            return words + (f", memory_limit={gib(int(o['limit']))}" if "limit" in o else "")  # type: ignore[call-overload]
        words = ("memory growth on (tf.config.experimental.set_memory_growth / TF_FORCE_GPU_ALLOW_GROWTH=true"
                 " / gpu_options.allow_growth=True)"
                 if o.get("growth", True) else "memory growth off (the BFC preallocates)")  # fmt: skip
        if o.get("gc"):
            words += ", the BFC's garbage collection of free regions on OOM"
        if "limit" in o:
            limit = int(o["limit"])  # type: ignore[call-overload]
            words += (f", a memory limit of {gib(limit)} (tf.config.set_logical_device_configuration(gpu, "
                      f"[tf.config.LogicalDeviceConfiguration(memory_limit={limit // MiB})]))")  # fmt: skip
        return words
    if kind == "rmm-pool" and family == "rmm":
        initial = int(o.get("initial", 0))  # type: ignore[call-overload]
        maximum = o.get("maximum")
        return f"rmm pool: initial_pool_size={gib(initial)}" + (
            f", maximum_pool_size={gib(int(maximum))}" if maximum is not None else ""  # type: ignore[call-overload]
        )
    names = {"tf-bfc": "a BFC allocator (TensorFlow's, XLA's)", "torch": "PyTorch's caching allocator",
             "rmm-pool": "an RMM pool", "no-pool": "no pool (cudaMalloc per tensor: the lower bound)"}  # fmt: skip
    words = names[kind]
    if kind == "torch" and o.get("expandable_segments"):
        words += " with expandable segments"
    return words


def empty_cache_words(base: str, where: str, count: int, events: list[int]) -> str:
    """How a PyTorch user sets a replay of ``torch.cuda.empty_cache()`` called ``count`` times,
    ``where`` ``"steps"`` (after each marked step) or ``"unused"`` (where the run held the most
    reserved but unused memory), right after the log's ``events`` (sequence numbers), on top of
    the setting ``base`` (``setting_words``)."""
    shown = ", ".join(f"{e:,}" for e in events[:3]) + (", ..." if len(events) > 3 else "")
    after = f"after event{'s' if len(events) > 1 else ''} {shown}" if events else ""
    if where == "steps":
        ends = f"{count} marked step end{'s' if count != 1 else ''}"
        said = f"torch.cuda.empty_cache() after each step ({ends}{': ' + after if after else ''})"
    else:
        moments = f"{count} moment{'s' if count != 1 else ''}" if count != 1 else "moment"
        said = f"torch.cuda.empty_cache() at the {moments} the run held the most reserved but unused memory"
        said += f" ({after})" if after else ""
    return said if base == "PyTorch's defaults" else f"{base} and {said}"


@dataclass(frozen=True)
class Trial:
    """One replay: the policy, how a user sets it, and what it did (bytes)."""

    policy: str  # the what-if policy's label (``torch:expandable_segments=True``)
    kind: str  # the what-if policy (``torch``, ``tf-bfc``, ``rmm-pool``, ``no-pool``)
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
    fragmentation: str = ""  # at the run's moment, as its allocator measures it (``fragmentation_words``)

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
        if self.fragmentation:
            lines.append(f"fragmentation: {self.fragmentation}")
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
