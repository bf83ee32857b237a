from __future__ import annotations

import pytest

from gpuviz import BFCAllocator, SimUpstream


def snapshot(alloc: BFCAllocator) -> tuple[object, object, int]:
    """Everything a bad call must leave unchanged: heap state, stats, log length."""
    return alloc.state(), alloc.stats(), len(alloc.log)


@pytest.fixture
def alloc() -> BFCAllocator:
    a = BFCAllocator(SimUpstream("1GiB"), growth=True)
    a.allocate(1000, tag="x")
    a.allocate(3000)
    return a
