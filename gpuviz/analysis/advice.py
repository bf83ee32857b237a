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
tensorflow     ``tf.config.experimental.set_memory_growth`` / ``TF_FORCE_GPU_ALLOW_GROWTH``, a
               memory limit (``set_logical_device_configuration``), the BFC's garbage collection
jax            ``XLA_PYTHON_CLIENT_PREALLOCATE``, ``XLA_PYTHON_CLIENT_MEM_FRACTION``,
               ``XLA_PYTHON_CLIENT_ALLOCATOR``
rmm            the pool's ``initial_pool_size`` and ``maximum_pool_size``
gpuviz         gpuviz's own BFC allocator (TensorFlow's policy): ``growth``, ``memory_limit``,
               ``garbage_collection``
=============  ==============================================================================

Every family also gets the BFC formula, ``(free - largest free chunk) / free``, labelled as such.
Pure functions; sizes in bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuviz.log.eventlog import EventLog

if TYPE_CHECKING:
    from gpuviz.analysis.explain import Answer

__all__ = ["FAMILIES", "source_allocator", "device_capacity", "fragmentation_hint", "fragmentation_words"]

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
    for key in _CAPACITY_KEYS:
        value = options.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def fragmentation_words(family: str, answer: Answer | None, bfc: float) -> str:
    """Fragmentation as the source allocator measures it, beside the BFC formula, each labelled."""
    from gpuviz.analysis.explain import gib

    formula = f"BFC fragmentation (free - largest free chunk) / free: {bfc:.0%}"
    if family == "pytorch" and answer is not None:
        return (
            f"PyTorch's measures at the {answer.moment}: reserved but unallocated {gib(answer.unused)}, "
            f"inactive split {gib(answer.inactive_split)}; {formula}"
        )
    return formula


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
