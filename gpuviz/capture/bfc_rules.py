"""TensorFlow's BFC allocator rules, stated once for gpuviz's Python: pure functions, no state.

Each rule carries its formula and the name TensorFlow gives it
(``tensorflow/core/common_runtime/bfc_allocator.{h,cc}``). The Python BFC allocators
(``ReferenceBFCAllocator`` and ``NativeBFCAllocator``, whose growth runs in Python) and the
what-if models take them from here; ``csrc/capture/_bfc_rules.h`` states the same rules for the C
core, and ``tests/test_bfc_rules.py`` holds the two equal over random inputs. All sizes in bytes.

    rounding     RoundedBytes: max(256, n rounded up to a multiple of 256)
    bins         BinNumForSize: min(20, floor(log2(max(size, 256) >> 8)))
    split        a chunk taken for ``rounded`` bytes is split when
                 chunk >= 2·rounded or chunk - rounded >= 128 MiB (kMaxInternalFragmentation)
    growth       the first segment is 2 MiB (without growth: the whole limit, rounded); the
                 step doubles until the request fits; after a segment is made it doubles
                 again unless this request doubled it (Extend: curr_region_allocation_bytes_)
    limit        a segment is at most (memory_limit - pool) rounded down to 256 (available_bytes)
    back-off     while the device refuses ``n`` bytes: RoundedBytes(n · 0.9) in float32, or
                 256 less when that is not smaller; give up below the request (kBackpedalFactor)
    GC           on OOM, return the wholly free segments upstream when there are some and
                 rounded <= memory_limit - pool + their bytes (DeallocateFreeRegions)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpuviz.base.units import MiB

__all__ = [
    "BACKPEDAL_FACTOR",
    "INITIAL_SEGMENT_BYTES",
    "MAX_INTERNAL_FRAGMENTATION",
    "MIN_ALLOCATION_SIZE",
    "NUM_BINS",
    "available_bytes",
    "backpedal",
    "bin_for_size",
    "bin_size",
    "extend",
    "first_segment_bytes",
    "gc_helps",
    "grow_step",
    "rounded_bytes",
    "should_split",
    "step_after",
]

MIN_ALLOCATION_SIZE = 256  # kMinAllocationSize
NUM_BINS = 21  # kNumBins
INITIAL_SEGMENT_BYTES = 2 * MiB  # curr_region_allocation_bytes_ with allow_growth
MAX_INTERNAL_FRAGMENTATION = 128 * MiB  # kMaxInternalFragmentation
BACKPEDAL_FACTOR = np.float32(0.9)  # kBackpedalFactor, a float


def rounded_bytes(nbytes: int) -> int:
    """RoundedBytes: ``nbytes`` rounded up to a multiple of 256, at least 256."""
    return 256 if nbytes <= 256 else (nbytes + 255) & ~255


def bin_size(index: int) -> int:
    """Smallest chunk size of bin ``index``: 256·2^index bytes."""
    return MIN_ALLOCATION_SIZE << index


def bin_for_size(nbytes: int) -> int:
    """BinNumForSize: ``min(20, floor(log2(max(nbytes, 256) >> 8)))``."""
    return min(NUM_BINS - 1, (max(nbytes, 256) >> 8).bit_length() - 1)


def should_split(chunk_size: int, rounded: int) -> bool:
    """Whether a free chunk of ``chunk_size`` bytes taken for ``rounded`` bytes is split:
    ``chunk_size >= 2·rounded or chunk_size - rounded >= 128 MiB``."""
    return chunk_size >= rounded << 1 or chunk_size - rounded >= MAX_INTERNAL_FRAGMENTATION


def first_segment_bytes(growth: bool, memory_limit: int) -> int:
    """The first growth step: 2 MiB with growth, else the whole (rounded) limit as one segment."""
    return INITIAL_SEGMENT_BYTES if growth else rounded_bytes(memory_limit)


def available_bytes(memory_limit: int, pool_bytes: int) -> int:
    """What the limit leaves beyond the pool, rounded down to 256 (Extend's available_bytes)."""
    return (memory_limit - pool_bytes) & ~255


def grow_step(rounded: int, step: int) -> tuple[int, bool]:
    """The step doubled until ``rounded`` fits, and whether it doubled (increased_allocation)."""
    increased = False
    while rounded > step:
        step *= 2
        increased = True
    return step, increased


def step_after(step: int, increased: bool) -> int:
    """The next step after a segment was made: doubled, unless this request doubled it."""
    return step if increased else step * 2


def backpedal(nbytes: int) -> int:
    """The next try after the device refused ``nbytes``: RoundedBytes(nbytes · 0.9) in float32,
    or 256 less when that is not smaller."""
    smaller = rounded_bytes(int(np.float32(nbytes) * BACKPEDAL_FACTOR))
    return smaller if smaller < nbytes else nbytes - 256


def gc_helps(rounded: int, memory_limit: int, pool_bytes: int, free_bytes: int) -> bool:
    """DeallocateFreeRegions' test: wholly free segments of ``free_bytes`` in all are worth
    returning when there are some and ``rounded <= memory_limit - pool_bytes + free_bytes``."""
    return free_bytes > 0 and rounded <= memory_limit - pool_bytes + free_bytes


def extend(
    rounded: int, *, memory_limit: int, pool_bytes: int, step: int, reserve: Callable[[int], int | None]
) -> tuple[tuple[int, int] | None, int]:
    """TensorFlow's Extend: a segment that holds ``rounded`` bytes, reserved with ``reserve(nbytes)``
    (the base, or None when the device refuses), and the growth step after it.

    Returns ``((base, size), step)``, or ``(None, step)`` when nothing fits under the limit (the
    step stays doubled, as TF's member does).
    """
    available = available_bytes(memory_limit, pool_bytes)
    if rounded > available:
        return None, step
    step, increased = grow_step(rounded, step)
    nbytes = min(step, available)
    while (base := reserve(nbytes)) is None:
        nbytes = backpedal(nbytes)
        if nbytes < rounded:
            return None, step
    return (base, nbytes), step_after(step, increased)
