"""Timeline series, resampling, peak and internal waste."""

from __future__ import annotations

import numpy as np
import pytest

from gpuviz import EventLog, SimUpstream, internal_waste, peak, replay, resample, timeline_series
from gpuviz.base.units import MiB
from gpuviz.capture import ReferenceBFCAllocator


def test_series_values_per_event() -> None:
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), growth=True)
    a = alloc.allocate(1000)  # segment 2 MiB, split, alloc 1024
    b = alloc.allocate(3 * MiB)  # segment 4 MiB, whole chunk? 4 < 6 MiB and 1 MiB < 128 MiB -> no split
    alloc.free(a)  # free, merge
    s = timeline_series(alloc.log)
    assert [e.kind for e in alloc.log] == ["segment_alloc", "split", "alloc", "segment_alloc", "alloc", "free", "merge"]
    assert s.bytes_in_use.tolist() == [0, 0, 1024, 1024, 1024 + 4 * MiB, 4 * MiB, 4 * MiB]
    assert s.bytes_requested.tolist() == [0, 0, 1000, 1000, 1000 + 3 * MiB, 3 * MiB, 3 * MiB]
    assert s.pool_bytes.tolist() == [2 * MiB] * 3 + [6 * MiB] * 4
    assert s.largest_free.tolist() == [
        2 * MiB,
        2 * MiB - 1024,
        2 * MiB - 1024,
        4 * MiB,
        2 * MiB - 1024,
        2 * MiB - 1024,
        2 * MiB,
    ]
    assert s.fragmentation[-1] == 0.0
    assert s.internal_waste.tolist()[-1] == MiB
    alloc.free(b)
    # the series agrees with replay at every event
    s = timeline_series(alloc.log)
    heap = replay(alloc.log)
    for i, position in enumerate(s.index):
        state = heap.state_at(int(position))
        assert s.bytes_in_use[i] == state.bytes_in_use
        assert s.pool_bytes[i] == state.pool_bytes
        assert s.largest_free[i] == state.largest_free_chunk
        assert s.fragmentation[i] == pytest.approx(state.fragmentation)


def test_fragmentation_series() -> None:
    alloc = ReferenceBFCAllocator(SimUpstream("1MiB"), growth=False)
    ptrs = [alloc.allocate(64 * 1024) for _ in range(16)]  # fills the 1 MiB
    for p in ptrs[::2]:
        alloc.free(p)  # 8 holes of 64 KiB
    s = timeline_series(alloc.log)
    free, largest = 8 * 64 * 1024, 64 * 1024
    assert s.fragmentation[-1] == pytest.approx((free - largest) / free) == pytest.approx(0.875)
    assert alloc.stats().fragmentation == pytest.approx(0.875)


def test_resample_keeps_spikes() -> None:
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), growth=False)
    for i in range(3000):
        p = alloc.allocate(1000 if i != 1717 else 500 * MiB)  # one short spike
        alloc.free(p)
    s = timeline_series(alloc.log)
    r = resample(s, 50)
    assert len(r.time_ns) <= 50
    assert r.maximum["bytes_in_use"].max() == 500 * MiB
    assert r.minimum["bytes_in_use"].min() == 0
    # plain decimation would almost surely have missed it
    assert s.bytes_in_use[:: len(s) // 50].max() < 500 * MiB
    small = resample(s, 10**6)
    assert np.array_equal(small.maximum["bytes_in_use"], s.bytes_in_use)
    with pytest.raises(ValueError):
        resample(s, 0)


def test_peak_and_waste() -> None:
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), growth=False)
    a = alloc.allocate(1000)
    b = alloc.allocate(5000)
    alloc.free(b)
    alloc.allocate(300)
    top = peak(alloc.log)
    assert top.bytes == 1024 + 5120
    assert alloc.log[top.index].kind == "alloc" and alloc.log[top.index].address == b
    w = internal_waste(alloc.log)
    assert (w.at_peak, w.at_end, w.maximum) == (24 + 120, 24 + 212, 24 + 212)
    alloc.free(a)


def test_series_needs_a_device_when_there_are_several() -> None:
    log = EventLog()
    ReferenceBFCAllocator(SimUpstream("1GiB"), device="GPU:0", log=log).allocate(1)
    ReferenceBFCAllocator(SimUpstream("1GiB"), device="GPU:1", log=log).allocate(1)
    with pytest.raises(ValueError, match="pass device="):
        timeline_series(log)
    assert timeline_series(log, "GPU:1").bytes_in_use.tolist() == [0, 0, 256]


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_extremes_in_chunks_equal_the_whole_series(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    """Peak, largest pool and waste computed a chunk of events at a time (carrying the running
    sums) are those of the whole timeline, on a log with two devices and marks between."""
    import gpuviz.analysis.timeline as timeline

    monkeypatch.setattr(timeline, "EXTREMES_CHUNK", chunk)
    log = EventLog()
    gpu = ReferenceBFCAllocator(SimUpstream("1GiB"), growth=True, log=log, device="GPU:0")
    cpu = ReferenceBFCAllocator(SimUpstream("1GiB"), growth=True, log=log, device="CPU:0")
    rng = np.random.default_rng(3)
    live: list[tuple[ReferenceBFCAllocator, int]] = []
    for step in range(300):
        if live and rng.random() < 0.45:
            owner, address = live.pop(int(rng.integers(len(live))))
            owner.free(address)
        else:
            owner = gpu if rng.random() < 0.7 else cpu
            live.append((owner, owner.allocate(int(rng.integers(1, 3 * MiB)))))
        if step % 17 == 0:
            log.mark(f"step {step}")
    for device in ("GPU:0", "CPU:0"):
        series = timeline_series(log, device)
        i = int(np.argmax(series.bytes_in_use))
        found = timeline.extremes(log, device)
        assert (found.peak.bytes, found.peak.index, found.peak.seq, found.peak.time_ns) == (
            int(series.bytes_in_use[i]), int(series.index[i]), int(series.seq[i]), int(series.time_ns[i])
        )  # fmt: skip
        assert found.pool_bytes == int(series.pool_bytes.max())
        waste = series.internal_waste
        assert (found.waste.at_end, found.waste.at_peak, found.waste.maximum) == (
            int(waste[-1]), int(waste[i]), int(waste.max())
        )  # fmt: skip
        assert peak(log, device) == found.peak and internal_waste(log, device) == found.waste
