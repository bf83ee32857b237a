"""SimUpstream places regions first-fit by address: checked against a plain scan of every region."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuviz import SimUpstream

BASE = 1 << 40


def _first_fit(regions: dict[int, int], nbytes: int) -> int:
    address = BASE
    for start in sorted(regions):
        if start - address >= nbytes:
            break
        address = max(address, start + regions[start])
    return address


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 64), st.integers(0, 1000)), max_size=120))
def test_addresses_are_the_lowest_gap_that_fits(ops: list[tuple[bool, int, int]]) -> None:
    upstream = SimUpstream(1 << 30)
    regions: dict[int, int] = {}
    for allocate, units, pick in ops:
        if allocate or not regions:
            nbytes = units * 256
            expected = _first_fit(regions, nbytes)
            assert upstream.allocate(nbytes) == expected
            regions[expected] = nbytes
        else:
            address = sorted(regions)[pick % len(regions)]
            upstream.free(address)
            del regions[address]
        assert upstream.regions() == sorted(regions.items())


def test_freeing_the_last_regions_gives_the_tail_back() -> None:
    upstream = SimUpstream(1 << 30)
    a, b, c = (upstream.allocate(n) for n in (256, 512, 1024))
    upstream.free(c)
    upstream.free(b)
    assert upstream.allocate(2048) == b  # the tail begins right after a again
    upstream.free(a)
    assert upstream.allocate(256) == a
