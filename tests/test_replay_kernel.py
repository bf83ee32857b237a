"""Replay's compiled pass and the allocation table's compiled pairing give exactly what the Python
rules give; the timeline (NumPy) equals its definition."""

from __future__ import annotations

import numpy as np
import pytest
from built import built

from gpuviz import EventLog, SimUpstream, replay, timeline_series
from gpuviz.analysis import replay as replay_module
from gpuviz.capture.native import allocator_class
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
        compiled.state_at(-1, device=device)  # the pass runs at the first query of a device
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
