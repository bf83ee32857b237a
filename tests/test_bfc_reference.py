"""TensorFlow BFC reference behaviour, with exact addresses on a simulated device at 1<<40."""

from __future__ import annotations

import numpy as np
import pytest

from gpuviz import OutOfMemoryError, SimUpstream
from gpuviz.base.units import GiB, MiB
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.capture.chunks import NUM_BINS, bin_for_size, bin_size, rounded_bytes

BASE = 1 << 40


def events(alloc: ReferenceBFCAllocator) -> list[tuple[str, int, int]]:
    return [(e.kind, e.address, e.size) for e in alloc.log]


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (1, 0),
        (256, 0),
        (511, 0),
        (512, 1),
        (1023, 1),
        (1024, 2),
        (2047, 2),
        (2048, 3),
        (128 * MiB, 19),
        (256 * MiB - 1, 19),
        (256 * MiB, 20),
        (512 * MiB, 20),
        (1 << 40, 20),
    ],
)
def test_bin_of_each_size(size: int, expected: int) -> None:
    assert bin_for_size(size) == expected


def test_bin_self_check_of_tensorflow_constructor() -> None:
    for b in range(NUM_BINS):
        s = bin_size(b)
        assert bin_for_size(s) == b
        assert bin_for_size(s + 255) == b
        assert bin_for_size(2 * s - 1) == b
        if b < NUM_BINS - 1:
            assert bin_for_size(2 * s) != b


@pytest.mark.parametrize(("n", "rounded"), [(1, 256), (4, 256), (256, 256), (257, 512), (700, 768), (1024, 1024)])
def test_rounding(n: int, rounded: int) -> None:
    assert rounded_bytes(n) == rounded


def test_one_float_requests_4_and_gets_256(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1GiB"))
    p = alloc.allocate(np.dtype(np.float32).itemsize)
    assert p == BASE
    assert alloc.requested_size(p) == 4
    assert alloc.allocated_size(p) == 256
    assert alloc.stats().bytes_in_use == 256


def test_1023_allocations_in_a_1gib_non_growing_allocator(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1GiB"), growth=False)
    addresses = [alloc.allocate(n) for n in range(1, 1024)]
    assert alloc.stats().bytes_in_use == 654336
    expected, position = [], BASE
    for n in range(1, 1024):
        expected.append(position)
        position += rounded_bytes(n)
    assert addresses == expected
    assert alloc.stats().pool_bytes == GiB
    assert alloc.stats().num_allocs == 1023
    alloc.check()


def test_growth_regions_after_128_allocations_of_4mib(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1GiB"), memory_limit="512MiB", growth=True)
    addresses = [alloc.allocate(4 * MiB) for _ in range(128)]
    state = alloc.state()
    sizes = [s.size // MiB for s in state.segments]
    assert sizes == [4, 4, 8, 16, 32, 64, 128, 256]
    bases = [s.base for s in state.segments]
    assert bases == [BASE + o * MiB for o in (0, 4, 8, 16, 32, 64, 128, 256)]
    assert addresses[0] == BASE and addresses[-1] == BASE + 508 * MiB
    assert alloc.stats().pool_bytes == 512 * MiB
    # after freeing the first 127, 508 MiB are free but no chunk holds 508 MiB
    for p in addresses[:127]:
        alloc.free(p)
    before = alloc.state()
    with pytest.raises(OutOfMemoryError) as info:
        alloc.allocate(508 * MiB)
    error = info.value
    assert error.fragmentation is True
    assert (error.requested, error.free, error.largest_free_chunk, error.reservable) == (
        508 * MiB,
        508 * MiB,
        252 * MiB,
        0,
    )
    assert "fragmentation" in str(error)
    assert alloc.state() == before
    assert alloc.log[-1].kind == "oom" and alloc.log[-1].size == 508 * MiB
    alloc.check()


def test_oom_without_fragmentation_says_not_enough_memory(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("4MiB"), growth=False)
    alloc.allocate(3 * MiB)
    with pytest.raises(OutOfMemoryError) as info:
        alloc.allocate(2 * MiB)
    assert info.value.fragmentation is False
    assert "not enough memory" in str(info.value)


def test_request_beyond_the_limit_is_an_oom_that_names_the_limit(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("16GiB"), memory_limit="1GiB")
    with pytest.raises(OutOfMemoryError, match="larger than the memory limit"):
        alloc.allocate(2 * GiB)
    assert alloc.stats().pool_bytes == 0
    assert isinstance(OutOfMemoryError, type) and issubclass(OutOfMemoryError, MemoryError)


def test_best_fit_takes_smallest_chunk_then_lowest_address(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1GiB"), growth=False)
    # layout: [A 4096][s][B 2048][s][C 2048][s][D 8192][s] ... rest
    sizes = [4096, 256, 2048, 256, 2048, 256, 8192, 256]
    ptrs = [alloc.allocate(n) for n in sizes]
    a, b, c, d = ptrs[0], ptrs[2], ptrs[4], ptrs[6]
    for p in (a, b, c, d):
        alloc.free(p)
    # 2000 rounds to 2048: B and C both fit exactly; B has the lower address
    assert alloc.allocate(2000) == b
    assert alloc.allocate(2048) == c
    # 3000 -> 3072: only A (4096) and D (8192) and the tail fit; A is smallest; no split (4096 < 6144)
    p = alloc.allocate(3000)
    assert p == a and alloc.allocated_size(p) == 4096
    alloc.check()


def test_split_rule(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1GiB"), growth=False)
    a = alloc.allocate(1024)
    alloc.allocate(256)  # separator keeps A from merging with the tail
    alloc.free(a)
    # 1024 chunk, request 700 (768): 1024 < 1536 and 256 < 128 MiB -> no split
    p = alloc.allocate(700)
    assert (p, alloc.allocated_size(p), alloc.requested_size(p)) == (a, 1024, 700)
    alloc.free(p)
    # request 512: 1024 >= 2*512 -> split
    p = alloc.allocate(512)
    assert alloc.allocated_size(p) == 512
    assert alloc.state().segments[0].chunks[1].address == a + 512


def test_split_when_remainder_is_at_least_128mib(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1GiB"), growth=False)
    big = alloc.allocate(384 * MiB)
    alloc.allocate(256)
    alloc.free(big)
    p = alloc.allocate(200 * MiB)  # 384 < 400 but 184 MiB >= 128 MiB
    assert alloc.allocated_size(p) == 200 * MiB
    alloc.free(p)
    q = alloc.allocate(300 * MiB)  # 384 < 600 and 84 MiB < 128 MiB -> whole chunk
    assert alloc.allocated_size(q) == 384 * MiB


def test_free_coalesces_next_then_previous(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1GiB"), growth=False)
    a, b, c = (alloc.allocate(1024) for _ in range(3))
    alloc.allocate(256)
    alloc.free(a)
    alloc.free(c)
    start = len(alloc.log)
    alloc.free(b)
    assert events(alloc)[start:] == [("free", b, 1024), ("merge", b, 2048), ("merge", a, 3072)]
    chunks = alloc.state().segments[0].chunks
    assert (chunks[0].address, chunks[0].size, chunks[0].in_use) == (a, 3072, False)


def test_preallocation_reserves_the_whole_limit_at_first_allocation(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("16GiB"), memory_limit="4GiB", growth=False)
    assert alloc.stats().pool_bytes == 0
    alloc.allocate(10)
    assert events(alloc)[:3] == [("segment_alloc", BASE, 4 * GiB), ("split", BASE, 256), ("alloc", BASE, 256)]
    assert alloc.stats().pool_bytes == 4 * GiB


def test_memory_limit_and_fraction(bfc: type[ReferenceBFCAllocator]) -> None:
    up = SimUpstream("16GiB")
    assert bfc(up, memory_fraction=0.5).stats().bytes_limit == 8 * GiB
    assert bfc(up, memory_limit="4GiB").stats().bytes_limit == 4 * GiB
    assert bfc(up, memory_limit=1 << 20).stats().bytes_limit == MiB
    assert bfc(up).stats().bytes_limit == 16 * GiB
    with pytest.raises(ValueError, match="not both"):
        bfc(up, memory_limit="1GiB", memory_fraction=0.5)
    with pytest.raises(ValueError, match="memory_fraction"):
        bfc(up, memory_fraction=1.5)
    with pytest.raises(ValueError, match="exceeds the device capacity"):
        bfc(up, memory_limit="32GiB")
    with pytest.raises(ValueError, match="unknown unit"):
        bfc(up, memory_limit="4 parsecs")


def test_garbage_collection_returns_free_segments_and_retries(bfc: type[ReferenceBFCAllocator]) -> None:
    def run(gc: bool) -> ReferenceBFCAllocator:
        alloc = bfc(SimUpstream("1GiB"), memory_limit="4MiB", garbage_collection=gc)
        alloc.free(alloc.allocate(2 * MiB))  # a wholly free 2 MiB segment
        alloc.allocate(3 * MiB)
        return alloc

    with pytest.raises(OutOfMemoryError):
        run(gc=False)
    alloc = run(gc=True)
    kinds = events(alloc)
    # 4 MiB < 2 * 3 MiB and the 1 MiB remainder < 128 MiB: the chunk is handed out whole
    assert kinds[-3:] == [("segment_free", BASE, 2 * MiB), ("segment_alloc", BASE, 4 * MiB), ("alloc", BASE, 4 * MiB)]
    assert alloc.stats().pool_bytes == 4 * MiB
    alloc.check()


def test_gc_is_skipped_when_it_cannot_make_the_request_fit(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1GiB"), memory_limit="6MiB", garbage_collection=True)
    alloc.free(alloc.allocate(2 * MiB))  # free segment of 2 MiB; next step 4 MiB
    alloc.allocate(4 * MiB)  # second segment, in use; pool 6 MiB
    with pytest.raises(OutOfMemoryError):
        alloc.allocate(3 * MiB)  # 3 > 6 - 6 + 2
    assert [s.size for s in alloc.state().segments] == [2 * MiB, 4 * MiB]


def test_backpedal_when_the_device_has_less_than_the_step(bfc: type[ReferenceBFCAllocator]) -> None:
    upstream = SimUpstream("8MiB")
    other = bfc(upstream, memory_limit="8MiB", growth=False, device="GPU:1")
    hog = upstream.allocate(6 * MiB)  # someone else holds 6 MiB of the device
    alloc = bfc(upstream, memory_limit="8MiB", growth=False)
    alloc.allocate(MiB)
    expected = 8 * MiB
    while expected > 2 * MiB:
        smaller = rounded_bytes(int(np.float32(expected) * np.float32(0.9)))
        expected = smaller if smaller < expected else expected - 256
    assert alloc.state().segments[0].size == expected
    assert alloc.state().segments[0].base == BASE + 6 * MiB
    upstream.free(hog)
    assert other.stats().pool_bytes == 0


def test_stats_and_clear_stats(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1GiB"), growth=False)
    s = alloc.stats()
    assert (s.num_allocs, s.bytes_in_use, s.pool_bytes, s.fragmentation) == (0, 0, 0, 0.0)
    a = alloc.allocate(1000)
    b = alloc.allocate(5000)
    alloc.allocate(256)
    alloc.free(b)
    s = alloc.stats()
    assert s.num_allocs == 3
    assert s.bytes_in_use == 1024 + 256
    assert s.peak_bytes_in_use == 1024 + 5120 + 256
    assert s.largest_alloc_size == 5120
    free = GiB - 1280
    assert s.largest_free_block_bytes == GiB - 1024 - 5120 - 256
    assert s.fragmentation == pytest.approx((free - s.largest_free_block_bytes) / free)
    alloc.clear_stats()
    s = alloc.stats()
    assert (s.num_allocs, s.peak_bytes_in_use, s.largest_alloc_size) == (0, 1280, 0)
    alloc.free(a)
    assert alloc.stats().peak_bytes_in_use == 1280


def test_fragmentation_is_zero_when_nothing_is_free(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1MiB"), growth=False)
    alloc.allocate(MiB)
    s = alloc.stats()
    assert (s.pool_bytes, s.bytes_in_use, s.fragmentation) == (MiB, MiB, 0.0)


def test_release_free_segments(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1GiB"))
    a = alloc.allocate(2 * MiB)
    b = alloc.allocate(4 * MiB)
    alloc.free(a)
    assert alloc.release_free_segments() == 2 * MiB
    assert alloc.stats().pool_bytes == 4 * MiB
    alloc.free(b)
    assert alloc.release_free_segments() == 4 * MiB
    assert alloc.state().segments == ()
    assert alloc.upstream.regions() == []  # type: ignore[attr-defined]


def test_zero_byte_allocation_returns_null_and_records_nothing(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1GiB"))
    assert alloc.allocate(0) == 0
    alloc.free(0)
    assert len(alloc.log) == 0


def test_tags_are_recorded_and_kept_in_state(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1GiB"))
    p = alloc.allocate(100, tag="float32[5,5]")
    assert alloc.state().segments[0].chunks[0].tag == "float32[5,5]"
    assert alloc.log[-1].tag == "float32[5,5]"
    alloc.free(p)
    assert alloc.log.filter(kind="free")[0].tag == "float32[5,5]"


def test_recording_off_keeps_the_log_empty(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1GiB"), record=False)
    alloc.free(alloc.allocate(100))
    assert len(alloc.log) == 0
    assert alloc.stats().num_allocs == 1


def test_stacks_point_at_the_callers_line(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("1GiB"), stacks=True)
    alloc.allocate(100)
    event = alloc.log[-1]
    frames = alloc.log.stacks[event.stack]
    assert frames[0].filename == __file__
    assert frames[0].function == "test_stacks_point_at_the_callers_line"
