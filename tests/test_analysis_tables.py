"""Tables, diagnosis and profile derived from logs with known contents."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuviz
from gpuviz import EventLog, SimUpstream, config
from gpuviz.analysis.diagnosis import diagnose
from gpuviz.analysis.profile import ViewOptions, profile
from gpuviz.analysis.tables import alive_at, allocation_table, oom_table, placement_table, transfer_table
from gpuviz.base.units import MiB
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.runtime.context import get_runtime

BASE = 1 << 40


def test_allocation_lifetimes() -> None:
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), growth=False)
    a = alloc.allocate(100, tag="a")
    b = alloc.allocate(200, tag="b")
    alloc.free(a)
    c = alloc.allocate(50, tag="c")  # reuses a's address
    table = allocation_table(alloc.log)
    assert table[["address", "tag", "size", "requested"]].values.tolist() == [
        [BASE, "a", 256, 100],
        [BASE + 256, "b", 256, 200],
        [BASE, "c", 256, 50],
    ]
    kinds = [e.kind for e in alloc.log]
    assert table["free_index"].tolist() == [kinds.index("free"), -1, -1]
    assert alive_at(table, len(alloc.log) - 1)["tag"].tolist() == ["b", "c"]
    assert b and c


def test_intermediates_are_freed_without_the_cycle_collector(runtime_log: EventLog) -> None:
    gc.disable()
    try:
        w = gpuviz.asarray(np.ones((4, 4), np.float32))
        a = gpuviz.asarray(np.ones((4, 4), np.float32))
        gpu = get_runtime().devices["GPU:0"].allocator
        for _ in range(5):
            a = np.maximum(a @ w, 0)
        assert gpu.stats().bytes_in_use == 512  # w and the last a only
    finally:
        gc.enable()


def test_placement_table_rows_and_totals(runtime_log: EventLog) -> None:
    config.set_transfer_model(h2d_bytes_per_s=1e9, d2h_bytes_per_s=1e9, latency_ns=0)
    a = gpuviz.asarray(np.ones(1000, np.float32))  # Const on GPU:0: 4000 B H2D
    b = a * 2  # Mul on GPU:0, allocates 4000 B
    with gpuviz.device("/GPU:5"):
        c = b + 1  # soft-placed AddV2
    with gpuviz.device("CPU:0"):
        d = c - 1  # Sub on CPU:0, copies c back (D2H 4000 B)
    table = placement_table(runtime_log)
    rows = {(r.op, r.requested, r.device): r for r in table.itertuples()}
    const = rows[("Const", None, "GPU:0")]
    assert (const.count, const.soft, const.bytes_allocated, const.bytes_transferred, const.transfer_ns) == (
        1,
        0,
        4096,
        4000,
        4000,
    )
    mul = rows[("Mul", None, "GPU:0")]
    assert (mul.count, mul.bytes_allocated, mul.bytes_transferred) == (1, 4096, 0)
    add = rows[("AddV2", "GPU:5", "GPU:0")]
    assert (add.count, add.soft) == (1, 1)
    sub = rows[("Sub", "CPU:0", "CPU:0")]
    assert (sub.soft, sub.bytes_transferred, sub.transfer_ns) == (0, 4000, 4000)
    assert sub.bytes_allocated == 8192  # the copy of c on the CPU and the result
    assert int(table["count"].sum()) == 4
    transfers = transfer_table(runtime_log)
    assert transfers[["direction", "source", "destination", "bytes", "reason"]].values.tolist() == [
        ["H2D", "CPU:0", "GPU:0", 4000, "Const"],
        ["D2H", "GPU:0", "CPU:0", 4000, "Sub"],
    ]
    assert transfers["bandwidth"].tolist() == [1e9, 1e9]
    del d


def test_oom_table_and_diagnosis_hints() -> None:
    alloc = ReferenceBFCAllocator(SimUpstream("8MiB"), growth=False)
    ptrs = [alloc.allocate(MiB, tag="float64[131072]") for _ in range(8)]
    for p in ptrs[::2]:
        alloc.free(p)
    with pytest.raises(gpuviz.OutOfMemoryError):
        alloc.allocate(2 * MiB)
    ooms = oom_table(alloc.log)
    assert ooms[["requested", "free", "largest_free", "reservable"]].values.tolist() == [[2 * MiB, 4 * MiB, MiB, 0]]
    assert bool(ooms["fragmentation_cause"].iloc[0]) is True
    d = diagnose(alloc.log)
    (summary,) = d.devices
    assert summary.peak.bytes == 8 * MiB
    assert summary.fragmentation_at_end == pytest.approx(0.75)
    assert any("fragmentation reaches 75%" in h for h in d.hints)
    assert any("out of memory" in h and "fragmentation" in h for h in d.hints)
    assert summary.top_at_peak[["group", "bytes", "count"]].values.tolist() == [["float64[131072]", 8 * MiB, 8]]


def test_float64_hint_and_leaks_by_span(runtime_log: EventLog) -> None:
    keep = gpuviz.asarray(np.ones(1000))  # float64
    with gpuviz.span("cell 1"):
        leak = gpuviz.asarray(np.ones(10, np.float32))
        tmp = leak * 2
        del tmp
    d = diagnose(runtime_log)
    gpu = next(x for x in d.devices if x.device == "GPU:0")
    assert gpu.leaks["span"].tolist() == ["cell 1"]
    assert gpu.leaks["tag"].tolist() == ["Const:float32[10]"]
    assert any("float64 arrays hold" in h for h in d.hints)
    assert gpu.dtype_at_peak["group"].tolist()[0] == "float64"
    del keep, leak


def test_profile_options() -> None:
    with pytest.raises(ValueError, match="color_by"):
        ViewOptions(color_by="rainbow")
    with pytest.raises(ValueError, match="group_by"):
        ViewOptions(group_by="colour")
    with pytest.raises(ValueError, match="points must be >= 1"):
        ViewOptions(points=0)
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"))
    for _ in range(100):
        alloc.free(alloc.allocate(1000))
    p = profile(alloc.log, ViewOptions(scrub_points=5))
    assert p.device == "GPU:0"
    # 5 evenly spread over the 200 events that end an operation (allocs and merges: 2, 4, 6, ...)
    assert p.devices["GPU:0"].scrub_index.tolist() == [2, 102, 202, 300, 400]
    assert p.devices["GPU:0"].opening == 2
    with pytest.raises(ValueError, match="has no allocator events"):
        profile(alloc.log, ViewOptions(device="GPU:9"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=60))
def test_pairing_allocs_with_their_frees(events: list[tuple[bool, int]]) -> None:
    """The free that ends an alloc is the next event at its address when that is a free (else
    -1), on streams with repeated allocs and stray
    frees (imported traces have both)."""
    import gpuviz.analysis.tables as tables
    from gpuviz.log.schema import Kind

    kinds = np.array([Kind.ALLOC if alloc else Kind.FREE for alloc, _ in events], dtype=np.uint8)
    addresses = np.array([address for _, address in events], dtype=np.int64)
    expected = []
    for i, (alloc, address) in enumerate(events):
        later = [j for j in range(i + 1, len(events)) if events[j][1] == address]
        expected.append(later[0] if alloc and later and not events[later[0]][0] else -1)
    assert tables._free_of(kinds, addresses).tolist() == expected


def test_allocated_by_address_index_equals_the_scan() -> None:
    """Looking the live chunks up by address (what each scrubber frame does) gives what scanning
    every allocation gives, at every event of a run that reuses addresses."""
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB", base=BASE), growth=True)
    rng = np.random.default_rng(5)
    live: list[int] = []
    for _ in range(400):
        if live and rng.random() < 0.5:
            alloc.free(live.pop(int(rng.integers(len(live)))))
        else:
            live.append(alloc.allocate(int(rng.integers(1, 4)) * 256))
    p = profile(alloc.log)
    dp = p.devices["GPU:0"]
    t0 = p.t0_ns
    for index in range(0, len(alloc.log), 7):
        state = dp.state_at(index)
        by_address = dp.allocated(index, t0, addresses=[c.address for c in state.chunks() if c.in_use])
        assert by_address == dp.allocated(index, t0)
        assert set(by_address) == {c.address for c in state.chunks() if c.in_use}
