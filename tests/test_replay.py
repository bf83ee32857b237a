"""Replay applies recorded decisions and matches the live allocator exactly."""

from __future__ import annotations

import random

import pytest

from gpuviz import EventLog, SimUpstream, replay
from gpuviz.base.units import MiB
from gpuviz.capture import ReferenceBFCAllocator


def random_run(alloc: ReferenceBFCAllocator, steps: int, seed: int) -> list[tuple[int, object]]:
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
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), growth=True)
    states = random_run(alloc, 400, seed=every)
    heap = replay(alloc.log, checkpoint_every=every)
    for index, state in states:
        assert heap.state_at(index) == state
    assert heap.state_at(-1) == alloc.state()


def test_replay_separates_devices_of_one_log() -> None:
    log = EventLog()
    gpu0 = ReferenceBFCAllocator(SimUpstream("1GiB"), device="GPU:0", log=log)
    gpu1 = ReferenceBFCAllocator(SimUpstream("1GiB", base=1 << 41), device="GPU:1", log=log)
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
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"))
    alloc.allocate(10)
    heap = replay(alloc.log)
    assert heap.state_at(-len(alloc.log)).segments[0].chunks[0].in_use is False  # after segment_alloc only
    with pytest.raises(IndexError):
        heap.state_at(len(alloc.log))


def test_replay_of_a_saved_file_matches(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpuviz import load

    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"))
    random_run(alloc, 300, 3)
    path = tmp_path / "run.arrow"
    alloc.log.save(path)
    assert replay(load(path)).state_at(-1) == alloc.state()


def test_record_into_a_new_log_starts_with_the_current_heap() -> None:
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), growth=True)
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


def assert_largest_free_column_matches_replay(log: EventLog) -> None:
    heap = replay(log)
    column = log["largest_free"].tolist()
    assert column == [heap.state_at(i).largest_free_chunk for i in range(len(log))]


def test_largest_free_of_record_into_events_is_exact_at_every_event() -> None:
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), growth=True)
    p = [alloc.allocate(n) for n in (MiB, 768 * 1024, 3 * MiB, 256, 5 * MiB, 700 * 1024, 2 * MiB)]
    for i in (0, 2, 5):  # free chunks before in-use ones, a wholly free segment
        alloc.free(p[i])
    fresh = EventLog()
    alloc.record_into(fresh)
    assert [e.kind for e in fresh].count("split") == 4 and len(fresh) == 12
    assert_largest_free_column_matches_replay(fresh)
    assert fresh["largest_free"].tolist()[:4] == [2 * MiB, MiB, MiB, 4 * MiB]


def test_largest_free_after_a_split_by_the_128mib_rule_counts_the_split_off_part() -> None:
    # 300 MiB chunk, 170 MiB request: split because the 130 MiB remainder is >= 128 MiB,
    # so the part split off (170 MiB, allocated by the next event) is larger than the remainder
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), memory_limit=300 * MiB, growth=False)
    alloc.allocate(170 * MiB)
    assert [e.kind for e in alloc.log] == ["segment_alloc", "split", "alloc"]
    assert alloc.log["largest_free"].tolist() == [300 * MiB, 170 * MiB, 130 * MiB]
    assert_largest_free_column_matches_replay(alloc.log)
