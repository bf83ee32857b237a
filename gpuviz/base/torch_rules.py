"""PyTorch's CUDA caching allocator: the size rules that decide a block's size and a segment's.

Shared by the importer of PyTorch snapshots (whose traces record the bytes each caller asked
for, not the block handed out) and the what-if model of the allocator. The rules restate
c10/cuda/CUDACachingAllocator.cpp:

- ``round_size``: requests under 512 B take 512 B; others round up to a multiple of
  512 B, or, where ``roundup_power2_divisions`` gives n > 1 divisions for the request's
  power-of-two interval and the request exceeds 512·n B, to the next of n equal steps
  between two powers of two;
- requests of at most 1 MiB (after rounding) come from the small pool (2 MiB segments),
  larger ones from the large pool;
- ``should_split``: the free block found is split when the remainder is at least 512 B
  (small pool, and every pool with expandable segments), or, in the large pool, when the
  remainder exceeds 1 MiB and the request is below ``max_split_size`` (oversize blocks are
  handed out whole);
- ``allocation_size``: the segment cudaMalloc'd for a request that no cached block serves:
  2 MiB for small requests, 20 MiB for requests under 10 MiB, else rounded up to 2 MiB.

Sizes are bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FREE_REQUESTED_MARK",
    "MIN_BLOCK",
    "SMALL_SIZE",
    "SMALL_BUFFER",
    "LARGE_BUFFER",
    "MIN_LARGE_ALLOC",
    "ROUND_LARGE",
    "NO_MAX_SPLIT",
    "CachingRules",
    "allocation_size",
]

FREE_REQUESTED_MARK = "free_requested"
"""The label of the mark a PyTorch snapshot's ``free_requested`` becomes when its ``free_completed``
does not follow at once (the free waited on other streams' work)."""

MIN_BLOCK = 512  # kMinBlockSize: every block is a multiple of this
SMALL_SIZE = 1 << 20  # kSmallSize: the largest request served from the small pool
SMALL_BUFFER = 2 << 20  # kSmallBuffer: the size of a small-pool segment
LARGE_BUFFER = 20 << 20  # kLargeBuffer: 1-10 MiB requests get 20 MiB segments
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge: larger segments are rounded up to 2 MiB
_INTERVALS = 16  # roundup_power2_divisions: one setting per power of two from 1 MiB to 32 GiB
NO_MAX_SPLIT = (1 << 64) - 1  # max_split_size when unset (SIZE_MAX)


def _next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: ``size`` rounded up to one of ``divisions`` equal steps
    between the powers of two around it (a power of two stays as it is)."""
    if size <= 4 or divisions <= 1 or size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


@dataclass(frozen=True)
class CachingRules:
    """The allocator settings that change block sizes (see the module docstring).

    ``divisions``: ``roundup_power2_divisions`` per interval, 1 MiB, 2 MiB, … 32 GiB (0 = off);
    ``max_split_size``: bytes (``SIZE_MAX`` when unlimited); ``expandable``: expandable segments.
    """

    divisions: tuple[int, ...] = (0,) * _INTERVALS
    max_split_size: int = NO_MAX_SPLIT
    expandable: bool = False

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any] | None) -> CachingRules:
        """The rules of a snapshot's ``allocator_settings`` (defaults where absent).

        ``roundup_power2_divisions`` is a mapping {"1": n, "2": n, … "32768": n} keyed by each
        interval's start in MiB (as ``_dump_snapshot`` writes it), a list of 16, or one int.
        """
        if not settings:
            return cls()
        raw = settings.get("roundup_power2_divisions")
        if isinstance(raw, Mapping):
            by_mib = {int(key): int(value) for key, value in raw.items()}
            divisions = tuple(by_mib.get(1 << i, 0) for i in range(_INTERVALS))
        elif isinstance(raw, (list, tuple)):
            divisions = tuple(int(v) for v in raw[:_INTERVALS]) + (0,) * max(0, _INTERVALS - len(raw))
        elif isinstance(raw, int) and not isinstance(raw, bool):
            divisions = (raw,) * _INTERVALS
        else:
            divisions = (0,) * _INTERVALS
        max_split = settings.get("max_split_size", -1)
        max_split = NO_MAX_SPLIT if not isinstance(max_split, int) or max_split < 0 else max_split
        return cls(divisions, max_split, bool(settings.get("expandable_segments", False)))

    def round_size(self, size: int) -> int:
        """The block size a request of ``size`` bytes needs before any split decision."""
        if size < MIN_BLOCK:
            return MIN_BLOCK
        index = min(max(size.bit_length() - 1 - 20, 0), _INTERVALS - 1)
        divisions = self.divisions[index]
        if divisions > 1 and size > MIN_BLOCK * divisions:
            return _next_division(size, divisions)
        return -(-size // MIN_BLOCK) * MIN_BLOCK

    @staticmethod
    def is_small(rounded: int) -> bool:
        """Whether a request of ``rounded`` bytes (after ``round_size``) comes from the small pool."""
        return rounded <= SMALL_SIZE

    def should_split(self, block: int, rounded: int) -> bool:
        """Whether a free block of ``block`` bytes is split to serve ``rounded`` bytes."""
        remaining = block - rounded
        if self.is_small(rounded) or self.expandable:
            return remaining >= MIN_BLOCK
        return rounded < self.max_split_size and remaining > SMALL_SIZE

    def block_size(self, free_block: int, requested: int) -> int:
        """Bytes of the block handed out for ``requested`` bytes from a free block of ``free_block`` bytes."""
        rounded = self.round_size(requested)
        return rounded if self.should_split(free_block, rounded) else free_block


def allocation_size(rounded: int) -> int:
    """``get_allocation_size``: the segment cudaMalloc'd for a request of ``rounded`` bytes."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((rounded + ROUND_LARGE - 1) // ROUND_LARGE)
