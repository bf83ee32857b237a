"""Replay's compiled pass and the allocation table's compiled pairing give exactly what the Python
rules give; the timeline (NumPy) equals its definition."""

from __future__ import annotations

import numpy as np
import pytest
from built import built
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuviz import EventLog, SimUpstream, replay, timeline_series
from gpuviz.analysis import replay as replay_module
from gpuviz.analysis.heapcolumns import HeapColumns
from gpuviz.capture.native import allocator_class
from gpuviz.log.heapbuilder import HeapConflict, PythonHeapBuilder
from gpuviz.log.schema import Kind

needs_kernel = pytest.mark.skipif(
    not built("gpuviz.analysis._replaykernel"), reason="the replay kernel is not built (no C compiler)"
)


def two_device_log(n_steps: int, seed: int) -> EventLog:
    """Two allocators interleaved in one log, with marks between: nothing is one device's alone."""
    log = EventLog()
    rng = np.random.default_rng(seed)
    cls = allocator_class()
    allocs = [cls(SimUpstream("4GiB"), device=f"GPU:{i}", log=log, garbage_collection=True) for i in range(2)]
    live: list[list[int]] = [[], []]
    for step in range(n_steps):
        d = int(rng.integers(2))
        if live[d] and rng.random() < 0.45:
            allocs[d].free(live[d].pop(int(rng.integers(len(live[d])))))
        else:
            live[d].append(allocs[d].allocate(int(2 ** rng.uniform(0, 25)), tag=["a", None][int(rng.integers(2))]))
        if step % 97 == 0:
            log.mark(f"step {step}")
        if step % 301 == 0:
            allocs[d].release_free_segments()
    return log


@needs_kernel
@pytest.mark.parametrize("every", [1, 3, 64, 8192])
def test_the_compiled_pass_gives_the_python_pass_states(every: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUVIZ_NATIVE", "1")  # the compiled pass, whatever the environment says
    log = two_device_log(3000, seed=every)
    compiled = replay(log, checkpoint_every=every)
    for device in ("GPU:0", "GPU:1"):
        first = compiled.state_at(-1, device=device)  # the first query of a device walks from the empty heap,
        assert compiled.state_at(-1, device=device) == first  # the same one again is the state kept,
        compiled.state_at(len(log) // 2, device=device)  # another walks again,
        compiled.state_at(len(log) // 3, device=device)  # and a third makes the checkpoints
    monkeypatch.setenv("GPUVIZ_NATIVE", "0")
    python = replay(log, checkpoint_every=every)
    assert replay_module._load_kernel() is None
    rng = np.random.default_rng(0)
    for index in [0, 1, len(log) - 1, *rng.integers(0, len(log), 40).tolist()]:
        for device in ("GPU:0", "GPU:1"):
            assert compiled.state_at(index, device=device) == python.state_at(index, device=device)
    assert isinstance(compiled._devices[0].checkpoints, replay_module._PackedCheckpoints)
    assert isinstance(python._devices[0].checkpoints, replay_module._DictCheckpoints)


@needs_kernel
def test_single_states_walk_on_from_the_last_one_before_the_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUVIZ_NATIVE", "1")
    log = two_device_log(2000, seed=5)
    compiled = replay(log, checkpoint_every=64)
    device = compiled._devices.get(compiled._device_id("GPU:1"))
    assert device is None
    positions = [len(log) // 4, len(log) // 2, len(log) - 1, 10]
    got = [compiled.state_at(i, device="GPU:1") for i in positions[:2]]  # from the empty heap, then on from the first
    assert compiled._devices[compiled._device_id("GPU:1")].checkpoints is None
    got += [compiled.state_at(i, device="GPU:1") for i in positions[2:]]  # the checkpoints serve the rest
    assert isinstance(compiled._devices[compiled._device_id("GPU:1")].checkpoints, replay_module._PackedCheckpoints)
    monkeypatch.setenv("GPUVIZ_NATIVE", "0")
    python = replay(log, checkpoint_every=64)
    assert got == [python.state_at(i, device="GPU:1") for i in positions]


_COLUMNS = ("bases", "sizes", "address", "size", "requested", "in_use", "tag", "stack", "owner")


def _same_heaps(got: list[HeapColumns], expected: list[HeapColumns]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.device == b.device and list(a.strings) == list(b.strings)
        for name in _COLUMNS:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def growth_log(ops: list[tuple[int, int, int]]) -> EventLog:
    """A log of segments that are allocated, grow (segment_map), shrink (segment_unmap) and hold
    allocations, from ``(operation, a, b)`` triples (operation 0..5)."""
    unit, base = 64 * 1024, 1 << 40
    log = EventLog(flush_rows=16)
    heap = PythonHeapBuilder(log, log.add_device("GPU:0"))
    for time, (operation, a, b) in enumerate(ops):
        chunks = [ch for s in heap.state().segments for ch in s.chunks]
        try:
            if operation == 0:
                heap.segment_map(time, base + a * unit, b * unit)
            elif operation == 1:
                heap.segment_alloc(time, base + a * unit, b * unit)
            elif operation == 2 and any(not ch.in_use for ch in chunks):
                free = [ch for ch in chunks if not ch.in_use][a % sum(not ch.in_use for ch in chunks)]
                heap.segment_unmap(time, free.address + (free.size // 4 if b % 2 else 0), free.size // 2)
            elif operation in (3, 4):
                heap.alloc(time, base + a * unit, b * unit // 2, b)
            elif operation == 5 and any(ch.in_use for ch in chunks):
                live = [ch.address for ch in chunks if ch.in_use]
                heap.free(time, live[a % len(live)])
        except HeapConflict:
            pass
    log.flush()
    return log


def _each_both_ways(
    log: EventLog, every: int, stops: list[int], device: str | None, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[HeapColumns], list[HeapColumns], list[HeapColumns]]:
    """``columns_at_each`` of ``stops`` compiled and in Python, and ``columns_at`` of each stop."""
    monkeypatch.setenv("GPUVIZ_NATIVE", "1")
    compiled = replay(log, checkpoint_every=every)
    got = compiled.columns_at_each(stops, device=device)
    compiled_heaps = [got[k] for k in range(len(got))]
    one_by_one = [compiled.columns_at(i, device=device) for i in stops]
    again = compiled.columns_at_each(stops, device=device)  # from the checkpoints, packed now
    _same_heaps([again[k] for k in range(len(again))], compiled_heaps)
    assert isinstance(compiled._devices[compiled._device_id(device)].checkpoints, replay_module._PackedCheckpoints)
    monkeypatch.setenv("GPUVIZ_NATIVE", "0")
    python = replay(log, checkpoint_every=every).columns_at_each(stops, device=device)
    return compiled_heaps, [python[k] for k in range(len(python))], one_by_one


_HYPOTHESIS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@needs_kernel
@_HYPOTHESIS
@given(
    seed=st.integers(0, 2**16), steps=st.integers(1, 700), every=st.integers(1, 400),
    stops=st.lists(st.floats(-1, 1, exclude_max=True), max_size=24),
)  # fmt: skip
def test_the_heaps_at_many_stops_in_one_pass_are_each_stops_heap(
    seed: int, steps: int, every: int, stops: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``columns_at_each`` (compiled and in Python) gives ``columns_at`` of every stop, for stops in
    any order, repeated, negative, far apart or close, on a log of two interleaved devices."""
    log = two_device_log(steps, seed)
    positions = [int(f * len(log)) for f in stops]
    for device in ("GPU:0", "GPU:1"):
        compiled, python, one_by_one = _each_both_ways(log, every, positions, device, monkeypatch)
        _same_heaps(compiled, one_by_one)
        _same_heaps(python, one_by_one)


@needs_kernel
@_HYPOTHESIS
@given(
    ops=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 63), st.integers(1, 8)), min_size=1, max_size=80),
    every=st.integers(1, 40), stops=st.lists(st.floats(0, 1, exclude_max=True), max_size=12),
)  # fmt: skip
def test_the_heaps_at_many_stops_of_growing_segments_are_each_stops_heap(
    ops: list[tuple[int, int, int]], every: int, stops: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = growth_log(ops)
    if not len(log):
        return
    positions = sorted(int(f * len(log)) for f in stops)
    compiled, python, one_by_one = _each_both_ways(log, every, positions, None, monkeypatch)
    _same_heaps(compiled, one_by_one)
    _same_heaps(python, one_by_one)
    if positions:  # what the states are: those the plain replay gives
        assert compiled[-1].to_state() == replay(log).state_at(positions[-1])


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_stop_outside_the_log_is_an_index_error(native: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUVIZ_NATIVE", native)
    log = two_device_log(50, seed=1)
    replayed = replay(log)
    with pytest.raises(IndexError, match=f"event index {len(log)} out of range"):
        replayed.columns_at_each([0, len(log)], device="GPU:0")
    assert replayed.columns_at_each([], device="GPU:0").__len__() == 0


@needs_kernel
def test_a_merge_with_no_upper_chunk_is_a_key_error_as_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    log = EventLog()
    device = log.add_device("GPU:0")
    base = 1 << 40
    log.append((0, int(Kind.SEGMENT_ALLOC), 0, device, -1, 0, base, 4096, 0, base, 4096, 0, -1, -1))
    log.append((1, int(Kind.MERGE), 0, device, -1, 0, base, 8192, 0, base, 8192, 0, -1, -1))
    for native in ("1", "0"):
        monkeypatch.setenv("GPUVIZ_NATIVE", native)
        with pytest.raises(KeyError) as error:
            replay(log).state_at(-1)
        assert error.value.args == (base + 4096,)


def _timeline_by_the_definition(log: EventLog, device_id: int) -> dict[str, np.ndarray]:
    """The series as timeline.py defines them, written out event by event."""
    cols = log.columns
    in_use = requested = pool = 0
    out: dict[str, list[float]] = {k: [] for k in ("index", "in_use", "requested", "pool", "largest", "frag")}
    for i in range(len(log)):
        kind = int(cols["kind"][i])
        if int(cols["device"][i]) != device_id or kind > int(Kind.OOM):
            continue
        size, req = int(cols["size"][i]), int(cols["requested"][i])
        sign = {int(Kind.ALLOC): 1, int(Kind.FREE): -1}.get(kind, 0)
        in_use += sign * size
        requested += sign * req
        pool += {int(Kind.SEGMENT_ALLOC): size, int(Kind.SEGMENT_FREE): -size}.get(kind, 0)
        largest = max(int(cols["largest_free"][i]), 0)
        free = pool - in_use
        fragmentation = (free - largest) / free if free > 0 else 0.0
        for key, value in zip(out, (i, in_use, requested, pool, largest, fragmentation), strict=True):
            out[key].append(value)
    return {k: np.array(v) for k, v in out.items()}


@pytest.mark.parametrize("devices", [1, 2])
def test_timeline_series_equal_their_definition(devices: int) -> None:
    if devices == 2:
        log = two_device_log(1500, seed=5)
    else:
        log = EventLog()
        alloc = allocator_class()(SimUpstream("4GiB"), log=log)
        rng = np.random.default_rng(3)
        live: list[int] = []
        for _ in range(1500):
            if live and rng.random() < 0.45:
                alloc.free(live.pop(int(rng.integers(len(live)))))
            else:
                live.append(alloc.allocate(int(2 ** rng.uniform(0, 25))))
    for device_id in range(devices):
        series = timeline_series(log, device=f"GPU:{device_id}")
        expected = _timeline_by_the_definition(log, device_id)
        assert series.index.tolist() == expected["index"].tolist()
        assert series.bytes_in_use.tolist() == expected["in_use"].tolist()
        assert series.bytes_requested.tolist() == expected["requested"].tolist()
        assert series.pool_bytes.tolist() == expected["pool"].tolist()
        assert series.largest_free.tolist() == expected["largest"].tolist()
        assert series.fragmentation.tolist() == expected["frag"].tolist()
        assert series.seq.tolist() == log.columns["seq"][series.index].tolist()


@needs_kernel
@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_pairing_gives_the_allocation_table_definition(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """allocation_table's rows and frees from the compiled pass equal the NumPy pairing, for every
    device and all devices at once, also for sequences no allocator writes (a second alloc at an
    open address, frees of addresses never allocated) and for a real allocator's log."""
    from gpuviz.analysis import tables

    rng = np.random.default_rng(seed)
    log = EventLog()
    for name in ("GPU:0", "GPU:1"):
        log.add_device(name)
    for step in range(4000):
        kind = int(rng.choice([Kind.ALLOC, Kind.FREE, Kind.MARK]))
        address = (1 << 40) + int(rng.integers(0, 40)) * 256
        log.append((step, kind, 0, int(rng.integers(2)), -1, 0, address, 256, 200, 1 << 40, 0, 0, -1, -1))
    for each in (log, two_device_log(2000, seed)):
        for device in (None, "GPU:0", "GPU:1"):
            monkeypatch.setenv("GPUVIZ_NATIVE", "1")
            rows, frees = tables._allocations_and_frees(each, device)
            monkeypatch.setenv("GPUVIZ_NATIVE", "0")
            expected_rows, expected_frees = tables._allocations_and_frees(each, device)
            np.testing.assert_array_equal(rows, expected_rows)
            np.testing.assert_array_equal(frees, expected_frees)
            assert len(rows) > 100 and (frees >= 0).any() and (frees < 0).any()
            assert rows.flags.writeable
