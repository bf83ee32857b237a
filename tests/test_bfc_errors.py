"""Bad input gets a clear error and leaves the allocator exactly as it was.

Tests of arguments run over every allocator class (``ALLOCATOR_FACTORIES`` in conftest)
and both recorders (the C row writer and the Python one).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from conftest import snapshot

from gpuviz import EventLog, InvalidFreeError, OutOfMemoryError, SimUpstream, replay
from gpuviz.base.units import GiB, MiB
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.capture.arguments import LOG_INT_MAX
from gpuviz.capture.recorder import Recorder
from gpuviz.log.schema import Kind

BASE = 1 << 40


@pytest.fixture
def any_alloc(make_allocator: Callable[..., ReferenceBFCAllocator]) -> Iterator[ReferenceBFCAllocator]:
    """The ``alloc`` fixture's heap (1000 B tagged "x", then 3000 B) for each allocator class."""
    a = make_allocator(SimUpstream("1GiB"), growth=True)
    a.allocate(1000, tag="x")
    a.allocate(3000)
    yield a


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
def test_bad_sizes(any_alloc: ReferenceBFCAllocator, bad: object, error: type[Exception], match: str) -> None:
    before = snapshot(any_alloc)
    with pytest.raises(error, match=match):
        any_alloc.allocate(bad)  # type: ignore[arg-type]
    assert snapshot(any_alloc) == before


def test_numpy_integer_sizes_are_accepted(any_alloc: ReferenceBFCAllocator) -> None:
    p = any_alloc.allocate(np.int64(512))
    assert any_alloc.allocated_size(p) == 512


@pytest.mark.parametrize("size", [10, 0])  # a 0-byte request checks its tag too
def test_bad_tag(any_alloc: ReferenceBFCAllocator, size: int) -> None:
    before = snapshot(any_alloc)
    with pytest.raises(TypeError, match="tag must be a string or None, not int"):
        any_alloc.allocate(size, tag=3)  # type: ignore[arg-type]
    assert snapshot(any_alloc) == before


def test_free_unknown_address(any_alloc: ReferenceBFCAllocator) -> None:
    before = snapshot(any_alloc)
    with pytest.raises(InvalidFreeError, match="never allocated"):
        any_alloc.free(12345)
    assert snapshot(any_alloc) == before


def test_double_free(any_alloc: ReferenceBFCAllocator) -> None:
    p = any_alloc.allocate(64)
    any_alloc.free(p)
    before = snapshot(any_alloc)
    with pytest.raises(InvalidFreeError, match="freed twice"):
        any_alloc.free(p)
    assert snapshot(any_alloc) == before


def test_free_of_an_interior_pointer(any_alloc: ReferenceBFCAllocator) -> None:
    before = snapshot(any_alloc)
    with pytest.raises(InvalidFreeError, match="points inside the chunk at 0x10000000000"):
        any_alloc.free(BASE + 8)
    assert snapshot(any_alloc) == before


def test_size_queries_of_a_dead_address(any_alloc: ReferenceBFCAllocator) -> None:
    with pytest.raises(InvalidFreeError):
        any_alloc.requested_size(999)
    with pytest.raises(InvalidFreeError):
        any_alloc.allocated_size(999)


def test_size_beyond_limit_changes_nothing_but_records_the_oom(any_alloc: ReferenceBFCAllocator) -> None:
    state, stats, n = snapshot(any_alloc)
    with pytest.raises(OutOfMemoryError) as info:
        any_alloc.allocate(2 * GiB)
    assert (any_alloc.state(), any_alloc.stats()) == (state, stats)
    assert len(any_alloc.log) == n + 1 and any_alloc.log[-1].kind == "oom"
    assert info.value.requested == 2 * GiB
    any_alloc.check()


def test_oom_is_a_memory_error_with_all_numbers(bfc: type[ReferenceBFCAllocator]) -> None:
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


# ------------------------------------------------------------------ free's argument
def test_free_of_a_float_address_after_another_free_changes_nothing(any_alloc: ReferenceBFCAllocator) -> None:
    p = any_alloc.allocate(5000, tag="p")
    q = any_alloc.allocate(5000)
    assert (p, q) == (BASE + 4096, BASE + 4096 + 5120)
    any_alloc.free(q)
    before = snapshot(any_alloc)
    with pytest.raises(TypeError, match=r"free: the address must be an integer .*not float \(1099511631872\.0\)"):
        any_alloc.free(float(p))  # type: ignore[arg-type]
    assert snapshot(any_alloc) == before
    any_alloc.check()
    any_alloc.free(p)  # the chunk is not lost: the real free works and is recorded
    assert [(e.kind, e.address) for e in any_alloc.log[-2:]] == [("free", p), ("merge", p)]
    any_alloc.check()


@pytest.mark.parametrize(
    ("bad", "shown"),
    [(None, "NoneType (None)"), ("x", "str ('x')"), (1.5, "float (1.5)"), (True, "bool (True)"),
     (0.0, "float (0.0)"), (np.float64(2.0), "float64 (np.float64(2.0))"), ([BASE], "list ([1099511627776])")],
)  # fmt: skip
def test_free_of_a_non_integer_names_the_problem(any_alloc: ReferenceBFCAllocator, bad: object, shown: str) -> None:
    before = snapshot(any_alloc)
    with pytest.raises(TypeError) as info:
        any_alloc.free(bad)  # type: ignore[arg-type]
    assert str(info.value) == f"free: the address must be an integer (the value allocate returned), not {shown}"
    assert snapshot(any_alloc) == before


def test_free_and_size_queries_accept_numpy_integers(any_alloc: ReferenceBFCAllocator) -> None:
    p = any_alloc.allocate(700)
    assert any_alloc.allocated_size(np.uint64(p)) == 768  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="size query: the address must be an integer"):
        any_alloc.requested_size(float(p))  # type: ignore[arg-type]
    any_alloc.free(np.int64(p))  # type: ignore[arg-type]
    assert any_alloc.log[-1].kind in ("free", "merge") and any_alloc.stats().bytes_in_use == 1024 + 3072


def test_free_of_addresses_outside_int64_is_an_invalid_free(any_alloc: ReferenceBFCAllocator) -> None:
    before = snapshot(any_alloc)
    for address in (2**64 + BASE, -BASE, np.uint64(2**64 - 1)):
        with pytest.raises(InvalidFreeError, match="never allocated"):
            any_alloc.free(address)  # type: ignore[arg-type]
    assert snapshot(any_alloc) == before


# ------------------------------------------------------------ sizes beyond int64
@pytest.mark.parametrize(
    ("size", "rounded"),
    [(2**63, 2**63), (2**63 - 1, 2**63), (10**30, (10**30 + 255) // 256 * 256), (np.uint64(2**64 - 1), 2**64)],
    ids=["2**63", "2**63-1", "10**30", "uint64 max"],
)
def test_sizes_beyond_int64_are_out_of_memory_with_one_oom_event(
    any_alloc: ReferenceBFCAllocator, size: int, rounded: int
) -> None:
    state, stats, n = snapshot(any_alloc)
    with pytest.raises(OutOfMemoryError) as info:
        any_alloc.allocate(size)
    e = info.value
    assert (e.requested, e.rounded, e.limit) == (int(size), rounded, GiB)
    assert "larger than the memory limit itself" in str(e)
    assert (any_alloc.state(), any_alloc.stats()) == (state, stats)
    assert len(any_alloc.log) == n + 1
    oom = any_alloc.log[-1]
    # the log's int64 columns hold the numbers saturated; the exception has them exactly
    assert (oom.kind, oom.size, oom.requested) == ("oom", LOG_INT_MAX, min(int(size), LOG_INT_MAX))
    any_alloc.check()
    p = any_alloc.allocate(MiB)  # still fully usable: the rest of the 2 MiB segment (too small to split)
    assert (p, any_alloc.allocated_size(p), any_alloc.log[-1].kind) == (BASE + 4096, 2 * MiB - 4096, "alloc")


def test_the_recorder_refuses_values_outside_int64_and_writes_nothing() -> None:
    log = EventLog()
    device = log.add_device("GPU:0")
    emit = Recorder(log, device).emit
    staged, _ = log.row_sink()
    emit(int(Kind.OOM), 0, LOG_INT_MAX, LOG_INT_MAX, -1, 0, -1, -1)  # the largest value fits
    assert len(staged) == 78
    for bad in (2**63, -(2**63) - 1, 10**30):
        with pytest.raises((OverflowError, struct.error)):
            emit(int(Kind.OOM), 0, bad, 1, -1, 0, -1, -1)
        with pytest.raises((TypeError, struct.error)):
            emit(int(Kind.OOM), 0, 1.5, 1, -1, 0, -1, -1)  # type: ignore[arg-type]
    assert len(staged) == 78
    assert len(log) == 1 and log[0].size == LOG_INT_MAX


def test_preallocate_reserves_the_limit_in_the_allocators_own_pool(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1GiB"), memory_limit="64MiB", growth=False)
    assert alloc.preallocate() == 64 * MiB and alloc.preallocate() == 0
    p = alloc.allocate(MiB)
    assert p == BASE and alloc.stats().pool_bytes == 64 * MiB
    assert replay(alloc.log).state_at(-1) == alloc.state()
    alloc.check()
    assert bfc(SimUpstream("1GiB"), growth=True).preallocate() == 0
