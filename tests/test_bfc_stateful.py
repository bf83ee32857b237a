"""Random allocate/free/clear_stats/release sequences hold every invariant, and replay
reproduces the allocator's state at every point of the run."""

from __future__ import annotations

import pytest
from conftest import ALLOCATOR_CLASSES
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpuviz import EventLog, HeapState, OutOfMemoryError, SimUpstream, replay
from gpuviz.base.units import MiB
from gpuviz.capture import ReferenceBFCAllocator

SIZES = st.one_of(
    st.integers(1, 2048),
    st.integers(2049, 512 * 1024),
    st.integers(512 * 1024, 3 * MiB),
    st.sampled_from([256, 1024, MiB, 2 * MiB]),
)


STEPS: list[int] = []  # allocator steps (allocate, free, release) of each example


class AllocatorMachine(RuleBasedStateMachine):
    alloc: ReferenceBFCAllocator
    allocator_class: type[ReferenceBFCAllocator] = ReferenceBFCAllocator

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.states: list[tuple[int, HeapState]] = []
        self.steps = 0

    @initialize(
        limit_mib=st.integers(4, 24),
        growth=st.booleans(),
        gc=st.booleans(),
    )
    def setup(self, limit_mib: int, growth: bool, gc: bool) -> None:
        self.alloc = self.allocator_class(
            SimUpstream("64MiB"), memory_limit=limit_mib * MiB, growth=growth, garbage_collection=gc
        )

    def _capture(self) -> None:
        self.steps += 1
        self.states.append((len(self.alloc.log) - 1, self.alloc.state()))

    @rule(size=SIZES)
    def allocate(self, size: int) -> None:
        try:
            address = self.alloc.allocate(size)
        except OutOfMemoryError as error:
            assert error.rounded > error.largest_free_chunk
        else:
            assert address not in self.live
            self.live[address] = size
            assert self.alloc.requested_size(address) == size
        self._capture()

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        address = data.draw(st.sampled_from(sorted(self.live)))
        del self.live[address]
        self.alloc.free(address)
        self._capture()

    @rule()
    def clear_stats(self) -> None:
        self.alloc.clear_stats()
        stats = self.alloc.stats()
        assert stats.num_allocs == 0 and stats.peak_bytes_in_use == stats.bytes_in_use

    @rule()
    def release(self) -> None:
        before = self.alloc.stats().pool_bytes
        released = self.alloc.release_free_segments()
        assert self.alloc.stats().pool_bytes == before - released
        self._capture()

    @rule()
    def record_into_a_fresh_log(self) -> None:
        # the heap written as synthetic events: the new log must replay exactly from here on
        self.alloc.record_into(EventLog())
        self.states = []
        self._capture()

    @invariant()
    def invariants_hold(self) -> None:
        if hasattr(self, "alloc"):
            self.alloc.check()
            state = self.alloc.state()
            state.check()
            assert state.bytes_in_use == self.alloc.stats().bytes_in_use
            assert sum(self.live.values()) == state.bytes_requested

    def teardown(self) -> None:
        if not hasattr(self, "alloc"):
            return
        STEPS.append(self.steps)
        heap = replay(self.alloc.log, checkpoint_every=7)
        for index, state in self.states:
            if index >= 0:
                assert heap.state_at(index) == state
        if len(self.alloc.log):
            assert heap.state_at(-1) == self.alloc.state()
        # the log's largest_free column is what replay finds at every event
        for index, value in enumerate(self.alloc.log["largest_free"].tolist()):
            assert value == heap.state_at(index).largest_free_chunk, index


AllocatorMachine.TestCase.settings = settings(
    max_examples=250, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.parametrize("bfc", ALLOCATOR_CLASSES)
def test_random_sequences_keep_invariants_and_replay_exactly(bfc: type[ReferenceBFCAllocator]) -> None:
    STEPS.clear()
    AllocatorMachine.allocator_class = bfc
    try:
        AllocatorMachine.TestCase().runTest()
    finally:
        AllocatorMachine.allocator_class = ReferenceBFCAllocator
    assert sum(STEPS) >= 3000, f"only {sum(STEPS)} allocator steps ran"
