"""Replay applies recorded decisions and matches the live allocator exactly."""

from __future__ import annotations

import random

import pytest

from gpuviz import BFCAllocator, EventLog, SimUpstream, replay
from gpuviz.base.units import MiB


def random_run(alloc: BFCAllocator, steps: int, seed: int) -> list[tuple[int, object]]:
    rng = random.Random(seed)
    live: list[int] = []
    states = []
    for _ in range(steps):
        if live and rng.random() < 0.5:
            alloc.free(live.pop(rng.randrange(len(live))))
        else:
            live.append(alloc.allocate(rng.randint(1, 3 * MiB), tag=rng.choice(["a", "b", None])))
        states.append((len(alloc.log) - 1, alloc.state()))
    return states


@pytest.mark.parametrize("every", [1, 5, 64, 100_000])
def test_replay_matches_every_intermediate_state(every: int) -> None:
    alloc = BFCAllocator(SimUpstream("1GiB"), growth=True)
    states = random_run(alloc, 400, seed=every)
    heap = replay(alloc.log, checkpoint_every=every)
    for index, state in states:
        assert heap.state_at(index) == state
    assert heap.state_at(-1) == alloc.state()


def test_replay_separates_devices_of_one_log() -> None:
    log = EventLog()
    gpu0 = BFCAllocator(SimUpstream("1GiB"), device="GPU:0", log=log)
    gpu1 = BFCAllocator(SimUpstream("1GiB", base=1 << 41), device="GPU:1", log=log)
    random_run(gpu0, 100, 1)
    random_run(gpu1, 100, 2)
    heap = replay(log)
    assert heap.devices == ["GPU:0", "GPU:1"]
    assert heap.state_at(-1, device="GPU:0") == gpu0.state()
    assert heap.state_at(-1, device="GPU:1") == gpu1.state()
    with pytest.raises(ValueError, match="several devices"):
        heap.state_at(-1)
    with pytest.raises(ValueError, match="not in this log"):
        heap.state_at(-1, device="GPU:7")


def test_state_before_any_event_and_bad_indices() -> None:
    alloc = BFCAllocator(SimUpstream("1GiB"))
    alloc.allocate(10)
    heap = replay(alloc.log)
    assert heap.state_at(-len(alloc.log)).segments[0].chunks[0].in_use is False  # after segment_alloc only
    with pytest.raises(IndexError):
        heap.state_at(len(alloc.log))


def test_replay_of_a_saved_file_matches(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpuviz import load

    alloc = BFCAllocator(SimUpstream("1GiB"))
    random_run(alloc, 300, 3)
    path = tmp_path / "run.arrow"
    alloc.log.save(path)
    assert replay(load(path)).state_at(-1) == alloc.state()


def test_record_into_a_new_log_starts_with_the_current_heap() -> None:
    alloc = BFCAllocator(SimUpstream("1GiB"), growth=True)
    live = random_run(alloc, 200, 9)
    assert live
    fresh = EventLog()
    alloc.record_into(fresh)
    assert alloc.log is fresh
    assert replay(fresh).state_at(-1) == alloc.state()
    states = random_run(alloc, 200, 10)
    heap = replay(fresh)
    for index, state in states:
        assert heap.state_at(index) == state
