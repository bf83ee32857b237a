"""TensorFlow's BFC rules, stated twice (gpuviz/capture/bfc_rules.py for Python,
csrc/capture/_bfc_rules.h for C), give the same answer for every input: the C functions as the
native extension exposes them against the Python functions, over random inputs; and the Python
rules' values where TensorFlow's are known."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuviz.base import native as registry
from gpuviz.base.units import MiB
from gpuviz.capture import bfc_rules

_MODULE = "gpuviz.capture._bfcnative"
core: Any = registry.load(_MODULE)
needs_core = pytest.mark.skipif(core is None, reason="the native core is not built (no C compiler)")

SIZE = st.one_of(st.integers(0, 1 << 20), st.integers(0, 1 << 40), st.integers(0, 1 << 62))
ROUNDED = st.integers(1, 1 << 42).map(lambda n: n * 256)
STEP = st.integers(0, 40).map(lambda k: 256 << k)


def test_the_python_rules_give_tensorflows_values() -> None:
    assert [bfc_rules.rounded_bytes(n) for n in (0, 1, 256, 257, 1000)] == [256, 256, 256, 512, 1024]
    assert [bfc_rules.bin_for_size(n) for n in (0, 256, 511, 512, 256 * MiB - 1, 256 * MiB, 1 << 40)] == [
        0, 0, 0, 1, 19, 20, 20]  # fmt: skip
    assert bfc_rules.should_split(512, 256) and not bfc_rules.should_split(768, 512)
    assert bfc_rules.should_split(300 * MiB, 172 * MiB)  # 128 MiB left over
    assert not bfc_rules.should_split(300 * MiB, 172 * MiB + 256)
    assert bfc_rules.first_segment_bytes(True, 1 << 30) == 2 * MiB
    assert bfc_rules.first_segment_bytes(False, 1000) == 1024
    assert bfc_rules.grow_step(2 * MiB, 2 * MiB) == (2 * MiB, False)
    assert bfc_rules.grow_step(5 * MiB, 2 * MiB) == (8 * MiB, True)
    assert bfc_rules.backpedal(2 * MiB) == 1887488  # RoundedBytes(float32(2 MiB) * 0.9f)
    assert bfc_rules.backpedal(256) == 0  # 256 * 0.9 rounds back up to 256: 256 less
    assert not bfc_rules.gc_helps(MiB, 4 * MiB, 4 * MiB, 0)  # nothing to return
    assert bfc_rules.gc_helps(4 * MiB, 4 * MiB, 4 * MiB, 4 * MiB)
    assert not bfc_rules.gc_helps(4 * MiB + 256, 4 * MiB, 4 * MiB, 4 * MiB)


def test_extend_doubles_backs_off_and_keeps_the_doubled_step() -> None:
    def device(free: int) -> Callable[[int], int | None]:
        return lambda n: 1 << 40 if n <= free else None

    extend = bfc_rules.extend
    assert extend(256, memory_limit=1 << 30, pool_bytes=0, step=2 * MiB, reserve=device(1 << 30)) == (
        (1 << 40, 2 * MiB), 4 * MiB)  # fmt: skip
    # the request doubled the step: it does not double again
    assert extend(5 * MiB, memory_limit=1 << 30, pool_bytes=0, step=2 * MiB, reserve=device(1 << 30)) == (
        (1 << 40, 8 * MiB), 8 * MiB)  # fmt: skip
    # the limit caps the segment
    assert extend(256, memory_limit=3 * MiB, pool_bytes=2 * MiB, step=4 * MiB, reserve=device(1 << 30)) == (
        (1 << 40, MiB), 8 * MiB)  # fmt: skip
    # the device refuses 4 MiB; 90 % of it (float32, rounded) fits
    assert extend(3 * MiB, memory_limit=1 << 30, pool_bytes=0, step=4 * MiB, reserve=device(3900000)) == (
        (1 << 40, 3774976), 8 * MiB)  # fmt: skip
    # nothing the device gives holds the request: no segment, the step stays doubled
    assert extend(3 * MiB, memory_limit=1 << 30, pool_bytes=0, step=2 * MiB, reserve=device(3 * MiB - 256)) == (
        None, 4 * MiB)  # fmt: skip


@needs_core
@given(n=SIZE)
def test_rounding_and_bins_are_the_same_in_c(n: int) -> None:
    assert core.rounded_bytes(n) == bfc_rules.rounded_bytes(n)
    assert core.bin_for_size(n) == bfc_rules.bin_for_size(n)


@needs_core
@given(chunk=SIZE, rounded=ROUNDED)
def test_the_split_rule_is_the_same_in_c(chunk: int, rounded: int) -> None:
    assert core.should_split(chunk, rounded) is bfc_rules.should_split(chunk, rounded)


@needs_core
@given(growth=st.booleans(), limit=st.integers(256, 1 << 50), pool=st.integers(0, 1 << 50))
def test_first_segment_and_the_limit_are_the_same_in_c(growth: bool, limit: int, pool: int) -> None:
    assert core.first_segment_bytes(growth, limit) == bfc_rules.first_segment_bytes(growth, limit)
    assert core.available_bytes(limit, pool) == bfc_rules.available_bytes(limit, pool)


@needs_core
@given(rounded=ROUNDED, step=STEP, increased=st.booleans(), n=st.integers(256, 1 << 50))
def test_growth_and_back_off_are_the_same_in_c(rounded: int, step: int, increased: bool, n: int) -> None:
    assert core.grow_step(rounded, step) == bfc_rules.grow_step(rounded, step)
    assert core.step_after(step, increased) == bfc_rules.step_after(step, increased)
    assert core.backpedal(n) == bfc_rules.backpedal(n)


@needs_core
@given(rounded=ROUNDED, limit=st.integers(0, 1 << 50), pool=st.integers(0, 1 << 50), free=st.integers(0, 1 << 50))
def test_garbage_collection_is_the_same_in_c(rounded: int, limit: int, pool: int, free: int) -> None:
    assert core.gc_helps(rounded, limit, pool, free) is bfc_rules.gc_helps(rounded, limit, pool, free)


@needs_core
@given(
    rounded=st.integers(1, 1 << 34).map(lambda n: n * 256),
    limit=st.integers(256, 1 << 44),
    pool=st.integers(0, 1 << 44),
    step=STEP,
    device_free=st.one_of(st.integers(0, 1 << 44), st.just(1 << 62)),
)
def test_extend_is_the_same_in_c(rounded: int, limit: int, pool: int, step: int, device_free: int) -> None:
    """The core's Extend (bfc_grow without garbage collection) over a device that refuses more than
    ``device_free`` bytes decides the segment and the next step as bfc_rules.extend does."""
    pool = min(pool, limit) // 256 * 256

    def reserve(nbytes: int) -> int | None:
        return 1 << 40 if nbytes <= device_free else None

    expected = bfc_rules.extend(rounded, memory_limit=limit, pool_bytes=pool, step=step, reserve=reserve)
    assert core.extend(rounded, limit, pool, step, device_free) == expected
