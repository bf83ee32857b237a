"""Junk arguments interleaved with valid operations never break the allocator or lose an event.

Every junk call raises (``TypeError``, ``ValueError``, ``InvalidFreeError`` or, for sizes
no device holds, ``OutOfMemoryError``) and changes nothing but, for an OOM, one ``oom``
event; every valid call records exactly its events; at the end ``check()`` passes and
replaying the log reproduces the allocator's state. Runs over every allocator class and
both recorders.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pytest
from conftest import ALLOCATOR_FACTORIES, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuviz import InvalidFreeError, OutOfMemoryError, SimUpstream, replay
from gpuviz.base.units import MiB
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.log.schema import Kind

JUNK_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(max_value=-1),
    st.integers(min_value=2**62, max_value=2**80),
    st.integers(min_value=2**63, max_value=2**64 - 1).map(np.uint64),
    st.lists(st.integers(0, 3), max_size=2),
)
OPS = st.one_of(
    st.tuples(st.just("allocate"), st.integers(0, 3 * MiB)),
    st.tuples(st.just("free"), st.integers(0, 50)),  # the n-th live allocation
    st.tuples(st.just("free float"), st.integers(0, 50)),  # its address as a float: junk
    st.tuples(st.just("free again"), st.integers(0, 50)),  # an address freed before: junk
    st.tuples(st.just("allocate junk"), JUNK_VALUES),
    st.tuples(st.just("free junk"), JUNK_VALUES),
    st.tuples(st.just("tag junk"), st.one_of(st.integers(), st.floats(), st.binary(max_size=2))),
)
JUNK_ERRORS = (TypeError, ValueError, InvalidFreeError, OutOfMemoryError)


def _junk_call(
    alloc: ReferenceBFCAllocator, op: str, arg: Any, live: list[int], freed: list[int]
) -> Callable[[], object] | None:
    """The junk call ``op`` stands for, or None for a valid operation (or nothing to free)."""
    if op == "allocate junk":
        return partial(alloc.allocate, arg)
    if op == "free junk":
        return partial(alloc.free, arg)
    if op == "tag junk":
        return partial(alloc.allocate, 512, tag=arg)
    if op == "free float" and live:
        return partial(alloc.free, float(live[arg % len(live)]))
    if op == "free again" and freed and freed[arg % len(freed)] not in live:
        return partial(alloc.free, freed[arg % len(freed)])
    return None


def _apply(alloc: ReferenceBFCAllocator, op: str, arg: Any, live: list[int], freed: list[int]) -> tuple[str, int]:
    """Run one operation; returns ("ok", address) or ("oom", 0)."""
    if op == "allocate":
        try:
            address = alloc.allocate(arg)
        except OutOfMemoryError:
            return "oom", 0
        if address:
            live.append(address)
        return "ok", address
    address = live.pop(arg % len(live))
    alloc.free(address)
    freed.append(address)
    return "ok", address


@pytest.mark.parametrize("factory_name", sorted(ALLOCATOR_FACTORIES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, max_size=60), growth=st.booleans())
def test_junk_never_breaks_check_and_never_loses_an_event(
    factory_name: str, ops: list[tuple[str, Any]], growth: bool
) -> None:
    factory: Callable[..., ReferenceBFCAllocator] = ALLOCATOR_FACTORIES[factory_name]
    alloc = factory(SimUpstream("64MiB"), memory_limit=8 * MiB, growth=growth)
    live: list[int] = []
    freed: list[int] = []
    expected = {"alloc": 0, "free": 0, "oom": 0}
    for op, arg in ops:
        before = snapshot(alloc)
        junk = _junk_call(alloc, op, arg, live, freed)
        if junk is not None:
            with pytest.raises(JUNK_ERRORS) as info:
                junk()
            state, stats, n = before
            assert (alloc.state(), alloc.stats()) == (state, stats)
            if isinstance(info.value, OutOfMemoryError):
                expected["oom"] += 1
                assert len(alloc.log) == n + 1 and alloc.log[-1].kind == "oom"
            else:
                assert len(alloc.log) == n
            continue
        if op == "allocate" or (op == "free" and live):
            outcome, address = _apply(alloc, op, arg, live, freed)
            if outcome == "oom":
                expected["oom"] += 1
            elif op == "allocate" and address:
                expected["alloc"] += 1
                assert (alloc.log[-1].kind, alloc.log[-1].address) == ("alloc", address)
            elif op == "free":
                expected["free"] += 1
                frees = [e for e in alloc.log[before[2] :] if e.kind == "free"]
                assert [e.address for e in frees] == [address]
    alloc.check()
    kinds = list(alloc.log["kind"])
    counted = {name: kinds.count(int(Kind[name.upper()])) for name in expected}
    assert counted == expected
    if len(alloc.log):
        assert replay(alloc.log).state_at(-1) == alloc.state()
