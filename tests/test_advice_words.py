"""Advice speaks the words of the allocator that made the run: every knob of each allocator's
grid is named as its users set it, and fragmentation is named as that allocator measures it,
beside the BFC formula, each labelled."""

from __future__ import annotations

import pytest

from gpuviz.analysis.advice import empty_cache_words, fragmentation_words, setting_words
from gpuviz.base.units import GiB
from gpuviz.scenarios.advise import _grid

KNOBS = {
    "pytorch": ["expandable_segments:True", "max_split_size_mb:64", "garbage_collection_threshold:0.6",
                "torch.cuda.set_per_process_memory_fraction(1.0)"],
    "tensorflow": ["tf.config.experimental.set_memory_growth", "TF_FORCE_GPU_ALLOW_GROWTH=true",
                   "gpu_options.allow_growth=True", "memory growth off", "the BFC's garbage collection",
                   "LogicalDeviceConfiguration(memory_limit=4096)"],
    "jax": ["XLA_PYTHON_CLIENT_PREALLOCATE=false", "XLA_PYTHON_CLIENT_MEM_FRACTION=0.75",
            "XLA_PYTHON_CLIENT_ALLOCATOR=platform"],
    "rmm": ["initial_pool_size=8.0 GiB", "maximum_pool_size=16.0 GiB"],
}  # fmt: skip
FOREIGN = {
    "pytorch": ("TF_FORCE_GPU_ALLOW_GROWTH", "XLA_", "rmm pool:"),
    "tensorflow": ("PYTORCH_CUDA_ALLOC_CONF", "XLA_", "rmm pool:"),
    "jax": ("PYTORCH_CUDA_ALLOC_CONF", "TF_FORCE_GPU_ALLOW_GROWTH", "rmm pool:"),
    "rmm": ("PYTORCH_CUDA_ALLOC_CONF", "TF_FORCE_GPU_ALLOW_GROWTH", "XLA_"),
}


@pytest.mark.parametrize("family", sorted(KNOBS))
def test_each_allocators_grid_names_its_own_knobs_and_no_others(family: str) -> None:
    words = " | ".join(setting_words(family, p.kind, p.options) for p in _grid(family, 16 * GiB, 4 * GiB))
    for knob in KNOBS[family]:
        assert knob in words
    for other in FOREIGN[family]:
        assert other not in words


def test_empty_cache_in_pytorch_words() -> None:
    assert empty_cache_words("PyTorch's defaults", "steps", 2, [10, 20]) == (
        "torch.cuda.empty_cache() after each step (2 marked step ends: after events 10, 20)"
    )
    assert empty_cache_words("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "unused", 4, [1, 2, 3, 4]) == (
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and torch.cuda.empty_cache() at the 4 moments the run "
        "held the most reserved but unused memory (after events 1, 2, 3, ...)"
    )


def test_fragmentation_named_as_each_allocator_measures_it() -> None:
    formula = "BFC fragmentation (free - largest free chunk) / free: 40%"
    assert fragmentation_words("tensorflow", None, 0.4) == (
        f"{formula}, TensorFlow's own measure (its BFC allocator's and memory profile's)"
    )
    assert (
        fragmentation_words("jax", None, 0.4)
        == f"{formula}, XLA's own measure (its BFC allocator's and memory profile's)"
    )
    assert fragmentation_words("rmm", None, 0.4) == f"{formula}; RMM has no measure of its own"


def test_pytorch_fragmentation_is_reserved_but_unallocated_and_inactive_split() -> None:
    from gpuviz.analysis.explain import explain
    from gpuviz.base.units import MiB
    from gpuviz.capture.upstream import SimUpstream
    from gpuviz.scenarios.torch_caching import TorchCachingAllocator

    alloc = TorchCachingAllocator(SimUpstream(GiB), device="GPU:0")
    alloc.allocate(30 * MiB)  # a 30 MiB segment
    alloc.free(alloc.allocate(40 * MiB))  # a 40 MiB segment, cached
    alloc.allocate(25 * MiB)  # 25 MiB of the cached 40 MiB segment: 15 MiB inactive split
    alloc.allocate(20 * MiB)  # a segment of its own: the peak, 75 MiB in use of 90 MiB reserved
    (answer,) = explain(alloc.log)
    assert fragmentation_words("pytorch", answer, 0.5) == (
        "PyTorch's measures at the peak: reserved but unallocated 15 MiB, inactive split 15 MiB; "
        "BFC fragmentation (free - largest free chunk) / free: 50%"
    )
