"""Bad input gets a clear error and leaves the allocator exactly as it was."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import snapshot

from gpuviz import BFCAllocator, InvalidFreeError, OutOfMemoryError, SimUpstream
from gpuviz.base.units import GiB

BASE = 1 << 40


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (-1, ValueError, "must not be negative"),
        (1.5, TypeError, "integer number of bytes"),
        ("100", TypeError, "integer number of bytes"),
        (True, TypeError, "integer number of bytes"),
        (None, TypeError, "integer number of bytes"),
    ],
)
def test_bad_sizes(alloc: BFCAllocator, bad: object, error: type[Exception], match: str) -> None:
    before = snapshot(alloc)
    with pytest.raises(error, match=match):
        alloc.allocate(bad)  # type: ignore[arg-type]
    assert snapshot(alloc) == before


def test_numpy_integer_sizes_are_accepted(alloc: BFCAllocator) -> None:
    p = alloc.allocate(np.int64(512))
    assert alloc.allocated_size(p) == 512


def test_bad_tag(alloc: BFCAllocator) -> None:
    before = snapshot(alloc)
    with pytest.raises(TypeError, match="tag must be a string"):
        alloc.allocate(10, tag=3)  # type: ignore[arg-type]
    assert snapshot(alloc) == before


def test_free_unknown_address(alloc: BFCAllocator) -> None:
    before = snapshot(alloc)
    with pytest.raises(InvalidFreeError, match="never allocated"):
        alloc.free(12345)
    assert snapshot(alloc) == before


def test_double_free(alloc: BFCAllocator) -> None:
    p = alloc.allocate(64)
    alloc.free(p)
    before = snapshot(alloc)
    with pytest.raises(InvalidFreeError, match="freed twice"):
        alloc.free(p)
    assert snapshot(alloc) == before


def test_free_of_an_interior_pointer(alloc: BFCAllocator) -> None:
    before = snapshot(alloc)
    with pytest.raises(InvalidFreeError, match="points inside the chunk at 0x10000000000"):
        alloc.free(BASE + 8)
    assert snapshot(alloc) == before


def test_size_queries_of_a_dead_address(alloc: BFCAllocator) -> None:
    with pytest.raises(InvalidFreeError):
        alloc.requested_size(999)
    with pytest.raises(InvalidFreeError):
        alloc.allocated_size(999)


def test_size_beyond_limit_changes_nothing_but_records_the_oom(alloc: BFCAllocator) -> None:
    state, stats, n = snapshot(alloc)
    with pytest.raises(OutOfMemoryError) as info:
        alloc.allocate(2 * GiB)
    assert (alloc.state(), alloc.stats()) == (state, stats)
    assert len(alloc.log) == n + 1 and alloc.log[-1].kind == "oom"
    assert info.value.requested == 2 * GiB
    alloc.check()


def test_oom_is_a_memory_error_with_all_numbers(bfc: type[BFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1MiB"), growth=False)
    alloc.allocate(400 * 1024)  # 1 MiB >= 2 * 400 KiB: split, 624 KiB stay free
    with pytest.raises(MemoryError) as info:
        alloc.allocate(700 * 1024)
    e = info.value
    assert isinstance(e, OutOfMemoryError)
    assert (e.requested, e.rounded, e.free, e.largest_free_chunk, e.reservable, e.limit, e.device) == (
        716800,
        716800,
        638976,
        638976,
        0,
        1048576,
        "GPU:0",
    )
    assert e.fragmentation is False
