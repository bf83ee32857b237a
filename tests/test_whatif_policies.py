"""What-if policies on hand-computed cases, at exact addresses on a simulated device (base 1<<40)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuviz import InvalidFreeError, OutOfMemoryError, SimUpstream, replay
from gpuviz.base.torch_rules import CachingRules, allocation_size
from gpuviz.scenarios import parse_policy
from gpuviz.scenarios.pools import NoPoolAllocator, RmmPoolAllocator
from gpuviz.scenarios.torch_caching import TorchCachingAllocator

B = 1 << 40
KiB, MiB = 1 << 10, 1 << 20


def _events(log, kinds=("segment_alloc", "segment_free")):  # type: ignore[no-untyped-def]
    return [(e.kind, e.address - B, e.size) for e in log if e.kind in kinds]


def test_torch_rounding_and_segment_sizes() -> None:
    round_size = CachingRules().round_size
    four = CachingRules.from_settings({"roundup_power2_divisions": 4}).round_size
    assert [round_size(n) for n in (1, 511, 512, 513, 1000, 3 * MiB + 1)] == [512, 512, 512, 1024, 1024, 3 * MiB + 512]
    # roundup_power2_divisions=4: 1.2 MiB lies between 1 and 2 MiB, in steps of 256 KiB -> 1.25 MiB
    assert four(int(1.2 * MiB)) == 1280 * KiB
    assert four(2 * MiB) == 2 * MiB  # powers of two stay
    assert four(1000) == 1024  # below 512 * 4: plain 512 rounding
    assert [allocation_size(n) for n in (512, MiB, MiB + 512, 10 * MiB - 512, 10 * MiB, 25 * MiB)] == [
        2 * MiB, 2 * MiB, 20 * MiB, 20 * MiB, 10 * MiB, 26 * MiB,
    ]  # fmt: skip


def test_torch_pools_best_fit_and_split_rules() -> None:
    t = TorchCachingAllocator(SimUpstream("1GiB"))
    a = t.allocate(1000)  # small pool: a 2 MiB segment, split
    b = t.allocate(3 * MiB)  # large: a 20 MiB segment, split (17 MiB rest > 1 MiB)
    c = t.allocate(12 * MiB)  # best fit: the 17 MiB rest, split (5 MiB rest)
    d = t.allocate(int(4.5 * MiB))  # the 5 MiB rest: 0.5 MiB would remain, not > 1 MiB -> whole block
    assert [x - B for x in (a, b, c, d)] == [0, 2 * MiB, 5 * MiB, 17 * MiB]
    assert t.state().segments[1].chunks[-1].size == 5 * MiB
    t.free(b)
    e = t.allocate(2 * MiB)  # best fit: b's 3 MiB block; 1 MiB rest is not > 1 MiB -> unsplit
    assert e == b and t.heap.live_size(e) == 3 * MiB
    f = t.allocate(25 * MiB)  # a 26 MiB segment; 1 MiB rest -> unsplit
    assert f - B == 22 * MiB and t.heap.live_size(f) == 26 * MiB
    assert _events(t.log) == [("segment_alloc", 0, 2 * MiB), ("segment_alloc", 2 * MiB, 20 * MiB),
                              ("segment_alloc", 22 * MiB, 26 * MiB)]  # fmt: skip
    assert (t.reserved, t.in_use) == (48 * MiB, 1024 + 3 * MiB + 12 * MiB + 5 * MiB + 26 * MiB)
    t.check()
    assert replay(t.log).state_at(-1) == t.state()


def test_torch_releases_cached_segments_and_retries_before_oom() -> None:
    t = TorchCachingAllocator(SimUpstream(42 * MiB))
    a = t.allocate(3 * MiB)
    b = t.allocate(15 * MiB)
    assert b - a == 3 * MiB
    t.free(a)
    t.free(b)  # the whole 20 MiB segment is free again, still cached
    c = t.allocate(30 * MiB)  # 22 MiB left on the device: release the cached segment, retry
    assert c == B
    assert _events(t.log) == [("segment_alloc", 0, 20 * MiB), ("segment_free", 0, 20 * MiB),
                              ("segment_alloc", 0, 30 * MiB)]  # fmt: skip
    with pytest.raises(OutOfMemoryError) as info:
        t.allocate(20 * MiB)  # 12 MiB left, nothing cached
    assert (info.value.requested, info.value.rounded, info.value.reservable) == (20 * MiB, 20 * MiB, 12 * MiB)
    assert t.log[-1].kind == "oom" and t.reserved == 30 * MiB
    t.check()


def test_torch_max_split_size_keeps_oversize_blocks_whole() -> None:
    t = TorchCachingAllocator(SimUpstream("1GiB"), rules=CachingRules(max_split_size=32 * MiB))
    a = t.allocate(40 * MiB)
    t.free(a)
    small = t.allocate(8 * MiB)  # may not take the oversize 40 MiB block: a new 20 MiB segment
    assert small - B == 40 * MiB
    big = t.allocate(45 * MiB)  # 40 MiB block too small; a 46 MiB segment, not split (>= max_split)
    assert big - B == 60 * MiB and t.heap.live_size(big) == 46 * MiB
    again = t.allocate(40 * MiB)  # the cached 40 MiB block (within 20 MiB of the request)
    assert again == a
    t.free(again)
    with pytest.raises(ValueError, match="above 20 MiB"):
        TorchCachingAllocator(SimUpstream("1GiB"), rules=CachingRules(max_split_size=MiB))
    t.check()


def test_rmm_pool_grows_by_the_pool_size_and_cuts_best_fit_blocks() -> None:
    r = RmmPoolAllocator(SimUpstream("1GiB"))
    a = r.allocate(1000)  # align 1024; grow by max(1024, 0)
    b = r.allocate(3000)  # grow by max(3072, 1024)
    assert (a - B, b - B) == (0, 1024)
    r.free(a)
    c = r.allocate(512)  # best fit: the 1024 block, cut: 512 stays free
    assert c == a and r.heap.chunk_at(a + 512) == (a + 512, 512, 0)
    d = r.allocate(8000)  # 8192: grow by max(8192, 4096)
    assert d - B == 4096
    assert _events(r.log) == [("segment_alloc", 0, 1024), ("segment_alloc", 1024, 3072), ("segment_alloc", 4096, 8192)]
    r.free(b)
    r.free(c)
    r.free(d)
    assert [(c.address - B, c.size, c.in_use) for c in r.state().chunks()] == [
        (0, 1024, False),
        (1024, 3072, False),
        (4096, 8192, False),
    ]  # fmt: skip  (coalesced within each upstream allocation, never across)
    limited = RmmPoolAllocator(SimUpstream("1GiB"), maximum_pool_size=10 * KiB)
    limited.allocate(1000)  # grows by max(1024, 10 KiB / 2)
    assert _events(limited.log) == [("segment_alloc", 0, 5 * KiB)]
    with pytest.raises(OutOfMemoryError):
        limited.allocate(20 * KiB)
    r.check()


def test_no_pool_reserves_exactly_each_aligned_request() -> None:
    n = NoPoolAllocator(SimUpstream("1GiB"))
    a = n.allocate(1000)
    b = n.allocate(1)
    n.free(a)
    assert _events(n.log) == [("segment_alloc", 0, 1024), ("segment_alloc", 1024, 256), ("segment_free", 0, 1024)]
    assert (n.reserved, n.peak_reserved, b - B) == (256, 1280, 1024)


def test_policy_specs_parse_with_clear_errors() -> None:
    assert parse_policy("torch:max_split_size_mb=128").options == {"max_split_size_mb": 128}
    assert parse_policy("tf-bfc:growth=false,limit=8GiB").options == {"growth": False, "limit": 8 << 30}
    assert parse_policy("rmm").label == "rmm-pool"
    with pytest.raises(ValueError, match="unknown policy 'jemalloc'; policies are tf-bfc, torch, rmm-pool, no-pool"):
        parse_policy("jemalloc")
    with pytest.raises(ValueError, match="policy 'torch' has no option 'growth'"):
        parse_policy("torch:growth=true")
    with pytest.raises(ValueError, match="growth='maybe'"):
        parse_policy("tf-bfc:growth=maybe")


_OPS = st.lists(st.tuples(st.booleans(), st.integers(1, 48 * MiB), st.integers(0, 1000)), max_size=60)


@settings(max_examples=40, deadline=None)
@given(_OPS, st.sampled_from(["torch", "torch:max_split_size_mb=32", "torch:expandable_segments=true", "rmm-pool",
                              "no-pool"]))  # fmt: skip
def test_every_policy_keeps_its_invariants_and_replays_exactly(ops, spec) -> None:  # type: ignore[no-untyped-def]
    policy = parse_policy(spec)
    from gpuviz import EventLog

    alloc = policy.build(SimUpstream(256 * MiB), device="GPU:0", log=EventLog())
    live: list[int] = []
    for do_alloc, size, pick in ops:
        if do_alloc or not live:
            with contextlib.suppress(OutOfMemoryError):
                live.append(alloc.allocate(size))
        else:
            alloc.free(live.pop(pick % len(live)))
        alloc.check()  # type: ignore[attr-defined]
    if len(alloc.log):
        assert replay(alloc.log).state_at(-1) == alloc.state()  # type: ignore[attr-defined]


def test_torch_deferred_free_keeps_the_block_until_its_streams_are_done() -> None:
    """A block used on other streams (record_stream) is not reused until its free completes."""
    t = TorchCachingAllocator(SimUpstream("1GiB"))
    a = t.allocate(3 * MiB)  # a 20 MiB segment, split: a at its start
    t.free(a, deferred=True)
    b = t.allocate(3 * MiB)  # a's block still waits: b comes from the 17 MiB remainder
    assert (a, b) == (B, B + 3 * MiB)
    assert t.complete_free(a) is True
    c = t.allocate(3 * MiB)  # now a's 3 MiB block is the best fit
    assert c == B
    kinds = [(e.kind, e.address - B) for e in t.log if e.kind in ("alloc", "free")]
    assert kinds == [("alloc", 0), ("alloc", 3 * MiB), ("free", 0), ("alloc", 0)]
    t.check()


def test_torch_synchronizes_deferred_frees_before_running_out_of_memory() -> None:
    """Before giving up, PyTorch waits for every deferred free (release_cached_blocks), so the
    waiting block's segment is released and the request fits in its place."""
    t = TorchCachingAllocator(SimUpstream(42 * MiB))
    a = t.allocate(30 * MiB)
    t.free(a, deferred=True)
    b = t.allocate(30 * MiB)  # 12 MiB left: synchronize, release a's segment, retry at the same place
    assert b == B
    assert _events(t.log) == [("segment_alloc", 0, 30 * MiB), ("segment_free", 0, 30 * MiB),
                              ("segment_alloc", 0, 30 * MiB)]  # fmt: skip
    assert t.complete_free(a) is False  # the synchronization completed it already
    t.free(b)
    t.check()


def test_deferred_free_errors_name_the_block_and_change_nothing() -> None:
    t = TorchCachingAllocator(SimUpstream("1GiB"))
    a = t.allocate(1000)
    t.free(a, deferred=True)
    with pytest.raises(InvalidFreeError, match="already freed; its free waits on other streams"):
        t.free(a)
    with pytest.raises(InvalidFreeError, match="has no deferred free waiting"):
        t.complete_free(a + 512)
    t.check()
    assert t.complete_free(a) is True
    t.check()


def test_whatif_replays_a_free_that_waited_on_another_stream(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """From a PyTorch trace whose free waited on another stream: PyTorch's model frees the block
    at the synchronization before an OOM, and fits 42 MiB; a policy without deferred frees
    returns the memory only at the recorded completion, after the request, and runs out."""
    import json

    import gpuviz

    base, mib = 0x7F0000000000, 1 << 20
    entry = lambda action, addr, size, t: {"action": action, "addr": addr, "size": size, "stream": 0,  # noqa: E731
                                           "time_us": t, "frames": []}  # fmt: skip
    trace = [entry("segment_alloc", base, 30 * mib, 1), entry("alloc", base, 30 * mib, 2),
             entry("free_requested", base, 30 * mib, 3), entry("segment_alloc", base + 32 * mib, 30 * mib, 4),
             entry("alloc", base + 32 * mib, 30 * mib, 5), entry("free_completed", base, 30 * mib, 6),
             entry("free_requested", base + 32 * mib, 30 * mib, 7),
             entry("free_completed", base + 32 * mib, 30 * mib, 8)]  # fmt: skip
    path = tmp_path / "two_streams.json"
    path.write_text(json.dumps({"segments": [], "device_traces": [trace]}))
    log = gpuviz.load(path)
    comparison = gpuviz.whatif(log, ["torch", "tf-bfc"], capacity=42 * mib)
    torch_outcome, bfc = comparison.outcomes[1], comparison.outcomes[2]
    assert torch_outcome.oom is None and torch_outcome.served == torch_outcome.requests == 5
    assert bfc.oom is not None and bfc.served == 2
