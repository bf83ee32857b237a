"""One block of the PyTorch caching-allocator model (``Block`` in ``CUDACachingAllocator.cpp``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Block"]


@dataclass
class Block:
    """A block of ``size`` bytes of the segment at ``segment``, in the small or large pool, last
    used on ``stream``. Sizes in bytes."""

    size: int
    segment: int
    small: bool
    stream: int
    requested: int = 0  # 0 when free
    age: int = 0  # the pool's get_free_block call count when the block became free (GC)
    expandable: bool = False  # in an expandable segment; ``segment`` is then its virtual range's base
