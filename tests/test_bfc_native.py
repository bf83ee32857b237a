"""The native core against the Python reference: the same operations give the same addresses,
errors, stats, states and event logs (every column but time and thread)."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from waiting import HANG_GUARD_S

from gpuviz import EventLog, InvalidFreeError, OutOfMemoryError, SimUpstream, replay
from gpuviz.base.units import MiB
from gpuviz.capture import ReferenceBFCAllocator, native
from gpuviz.capture.native import NativeBFCAllocator, allocator_class, native_core_available

needs_core = pytest.mark.skipif(not native_core_available(), reason="the native core is not built (no C compiler)")

SIZES = st.one_of(
    st.integers(1, 2048),
    st.integers(2049, 512 * 1024),
    st.integers(512 * 1024, 3 * MiB),
    st.sampled_from([256, 1024, MiB, 2 * MiB, 130 * MiB]),
)
TAGS = st.sampled_from([None, "a", "b", "matmul/weights"])


class _FreeingUpstream(SimUpstream):
    """An upstream that frees an address of its allocator inside allocate (as a finalizer would)."""

    victim: ReferenceBFCAllocator | None = None
    address = 0

    def allocate(self, nbytes: int) -> int:
        if self.victim is not None and self.address:
            address, self.address = self.address, 0
            self.victim.free(address)
        return super().allocate(nbytes)


def log_columns(log: EventLog) -> dict[str, list[int]]:
    log.flush()
    return {name: values.tolist() for name, values in log.columns.items() if name not in ("time_ns", "thread")}


def outcome(call: object) -> tuple[str, object]:
    """What a call did: its value, or its error's type, message and (for OOM) numbers."""
    try:
        return "value", call()  # type: ignore[operator]
    except OutOfMemoryError as e:
        fields = (e.requested, e.rounded, e.free, e.largest_free_chunk, e.reservable, e.limit, e.fragmentation)
        return "oom", (str(e), fields)
    except (InvalidFreeError, TypeError, ValueError, RuntimeError) as e:
        return type(e).__name__, str(e)


class DifferentialMachine(RuleBasedStateMachine):
    """Drives a ReferenceBFCAllocator and a NativeBFCAllocator with the same operations."""

    def __init__(self) -> None:
        super().__init__()
        self.live: list[int] = []
        self.pair: tuple[ReferenceBFCAllocator, ReferenceBFCAllocator] | None = None
        self.upstreams: list[_FreeingUpstream] = []

    @initialize(
        limit_mib=st.integers(4, 300),
        hog_mib=st.integers(0, 200),
        growth=st.booleans(),
        gc=st.booleans(),
        stacks=st.booleans(),
    )
    def setup(self, limit_mib: int, hog_mib: int, growth: bool, gc: bool, stacks: bool) -> None:
        allocators = []
        for cls in (ReferenceBFCAllocator, NativeBFCAllocator):
            upstream = _FreeingUpstream("512MiB")
            if hog_mib:  # another user of the device: growth must back off (TF's 10 % steps)
                upstream.allocate(hog_mib * MiB)
            self.upstreams.append(upstream)
            allocators.append(
                cls(upstream, memory_limit=limit_mib * MiB, growth=growth, garbage_collection=gc, stacks=stacks)
            )
        self.pair = (allocators[0], allocators[1])

    def both(self, name: str, *args: object, **kwargs: object) -> tuple[str, object]:
        assert self.pair is not None
        results = [outcome(lambda a=a: getattr(a, name)(*args, **kwargs)) for a in self.pair]  # one call site
        assert results[0] == results[1], (name, args, results)
        return results[0]

    @rule(size=SIZES, tag=TAGS)
    def allocate(self, size: int, tag: str | None) -> None:
        kind, value = self.both("allocate", size, tag=tag)
        if kind == "value":
            self.live.append(value)  # type: ignore[arg-type]

    @rule(bad=st.sampled_from([0, -5, 1.5, True, "7", np.int32(700)]))
    def allocate_odd_sizes(self, bad: object) -> None:
        kind, value = self.both("allocate", bad)
        if kind == "value" and value:
            self.live.append(value)  # type: ignore[arg-type]

    @rule(tag=st.sampled_from([3, b"x"]))
    def allocate_bad_tag(self, tag: object) -> None:
        self.both("allocate", 100, tag=tag)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        address = self.live.pop(data.draw(st.integers(0, len(self.live) - 1)))
        self.both("free", address)

    @rule(offset=st.sampled_from([0, 256, 1000, -256, 1 << 41]), data=st.data())
    def free_bad_address(self, offset: int, data: st.DataObject) -> None:
        assert self.pair is not None
        state = self.pair[0].state()
        chunks = [c for s in state.segments for c in s.chunks if not c.in_use or offset]
        base = data.draw(st.sampled_from([c.address for c in chunks])) if chunks else 1 << 40
        if base + offset not in self.live:
            self.both("free", base + offset)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free_during_growth(self, data: st.DataObject) -> None:
        """The next segment reservation frees a live chunk first: the free is deferred."""
        address = self.live.pop(data.draw(st.integers(0, len(self.live) - 1)))
        assert self.pair is not None
        for upstream, alloc in zip(self.upstreams, self.pair, strict=True):
            upstream.victim, upstream.address = alloc, address
        kind, value = self.both("allocate", 8 * MiB)
        if kind == "value":
            self.live.append(value)  # type: ignore[arg-type]
        for upstream in self.upstreams:
            if upstream.address:  # no growth happened: free it now
                upstream.address = 0
                assert upstream.victim is not None
                upstream.victim.free(address)

    @rule()
    def clear_stats(self) -> None:
        self.both("clear_stats")

    @rule()
    def release(self) -> None:
        self.both("release_free_segments")

    @rule(stacks=st.sampled_from([None, True, False]))
    def record_into_a_fresh_log(self, stacks: bool | None) -> None:
        assert self.pair is not None
        for alloc in self.pair:
            alloc.record_into(EventLog(), stacks=stacks)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def sizes(self, data: st.DataObject) -> None:
        address = data.draw(st.sampled_from(self.live))
        self.both("requested_size", address)
        self.both("allocated_size", address)

    @invariant()
    def same_everything(self) -> None:
        if self.pair is None:
            return
        python, native_ = self.pair
        native_.check()
        assert python.stats() == native_.stats()
        assert python.state() == native_.state()
        assert python.bins() == native_.bins()
        assert log_columns(python.log) == log_columns(native_.log)
        assert python.log.strings == native_.log.strings
        assert python.log.stacks == native_.log.stacks
        assert python.log.devices == native_.log.devices
        assert [u.regions() for u in self.upstreams[:1]] == [u.regions() for u in self.upstreams[1:]]


DifferentialMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestDifferential = needs_core(DifferentialMachine.TestCase)


@needs_core
def test_a_long_mixed_run_matches_the_reference_event_for_event() -> None:
    logs = []
    for cls in (ReferenceBFCAllocator, NativeBFCAllocator):
        rng = np.random.default_rng(7)
        alloc = cls(SimUpstream("16GiB"), growth=True)
        live: list[int] = []
        for _ in range(20_000):
            if live and rng.random() < 0.48:
                alloc.free(live.pop(int(rng.integers(len(live)))))
            else:
                live.append(alloc.allocate(int(2 ** rng.uniform(0, 26)), tag=["x", "y", None][int(rng.integers(3))]))
        alloc.check()
        logs.append((log_columns(alloc.log), alloc.state(), alloc.stats()))
    assert logs[0] == logs[1]
    assert len(logs[0][0]["seq"]) > 20_000
    assert replay(alloc.log).state_at(-1) == alloc.state()


@pytest.mark.parametrize("cls", [ReferenceBFCAllocator, pytest.param(NativeBFCAllocator, marks=needs_core)])
def test_numpy_integer_addresses_are_freed_like_ints(cls: type[ReferenceBFCAllocator]) -> None:
    alloc = cls(SimUpstream("1GiB"))
    p = alloc.allocate(1000)
    assert alloc.requested_size(np.int64(p)) == 1000  # type: ignore[arg-type]
    alloc.free(np.uint64(p))  # type: ignore[arg-type]
    assert alloc.stats().bytes_in_use == 0


@pytest.mark.parametrize("limit", ["64MiB", "128MiB"])
@needs_core
def test_preallocate_reserves_as_the_python_allocator(limit: str) -> None:
    results = []
    for cls in (ReferenceBFCAllocator, NativeBFCAllocator):
        upstream = SimUpstream("128MiB")
        upstream.allocate(16 * MiB)  # another user of the device: 128 MiB backs off by 10 % steps
        alloc = cls(upstream, memory_limit=limit, growth=False)
        reserved = alloc.preallocate()
        again = alloc.preallocate()
        p = alloc.allocate(1000)
        alloc.check()
        results.append((reserved, again, p, upstream.regions(), alloc.state(), log_columns(alloc.log)))
    assert results[0] == results[1]
    assert results[0][0] > 0 and results[0][1] == 0
    assert NativeBFCAllocator(SimUpstream("1GiB"), growth=True).preallocate() == 0


@needs_core
def test_the_hot_path_is_the_compiled_method() -> None:
    alloc = NativeBFCAllocator(SimUpstream("1GiB"))
    assert type(alloc.allocate).__name__ == "builtin_function_or_method"
    assert type(alloc.free).__name__ == "builtin_function_or_method"


@needs_core
def test_threads_block_on_the_lock_while_one_grows_the_pool() -> None:
    """A thread inside an upstream call holds the allocator; others wait, then go on."""
    entered, release = threading.Event(), threading.Event()

    class SlowUpstream(SimUpstream):
        def allocate(self, nbytes: int) -> int:
            if nbytes > 4 * MiB:
                entered.set()
                assert release.wait(HANG_GUARD_S)
            return super().allocate(nbytes)

    alloc = NativeBFCAllocator(SlowUpstream("1GiB"))
    small = alloc.allocate(256)
    grower = threading.Thread(target=alloc.allocate, args=(6 * MiB,))
    grower.start()
    assert entered.wait(HANG_GUARD_S)
    done: list[int] = []
    other = threading.Thread(target=lambda: done.append(alloc.allocate(512)))
    other.start()
    other.join(0.2)
    assert done == []  # waiting on the lock (with the GIL released: this thread runs)
    release.set()
    grower.join(HANG_GUARD_S)
    other.join(HANG_GUARD_S)
    assert done == [small + 256]
    alloc.free(small)
    alloc.check()
    assert alloc.stats().bytes_in_use == 8 * MiB + 512  # the 8 MiB segment is handed out whole (< 2x 6 MiB)


@needs_core
def test_reentrant_allocate_is_an_error_and_changes_nothing() -> None:
    class AllocatingUpstream(SimUpstream):
        allocator: ReferenceBFCAllocator | None = None

        def allocate(self, nbytes: int) -> int:
            assert self.allocator is not None
            self.allocator.allocate(10)
            return super().allocate(nbytes)

    for cls in (ReferenceBFCAllocator, NativeBFCAllocator):
        upstream = AllocatingUpstream("1GiB")
        alloc = cls(upstream)
        upstream.allocator = alloc
        with pytest.raises(RuntimeError, match="re-entrant allocate"):
            alloc.allocate(100)
        assert alloc.stats().bytes_in_use == 0
        alloc.check()


@needs_core
def test_a_failed_deferred_free_is_logged_and_the_allocation_still_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    upstream = _FreeingUpstream("1GiB")
    alloc = NativeBFCAllocator(upstream)
    upstream.victim, upstream.address = alloc, 12345
    with caplog.at_level(logging.ERROR, logger="gpuviz"):
        address = alloc.allocate(100)
    assert address == 1 << 40
    assert "GPU:0: a deferred free failed" in caplog.text
    assert "cannot free 0x3039: this allocator never allocated it" in caplog.text
    alloc.check()


_DEFERRED_FREE_WITHOUT_ROOM = """
import json, logging, resource
from gpuviz import EventLog, SimUpstream
from gpuviz.analysis.replay import replay
from gpuviz.base.units import MiB
from gpuviz.capture.native import NativeBFCAllocator

class FreeingUpstream(SimUpstream):  # frees a chunk of its allocator inside allocate, as a finalizer would
    victim = None
    address = 0
    def allocate(self, nbytes):
        if self.address:
            address, self.address = self.address, 0
            self.victim.free(address)
        return super().allocate(nbytes)

def setup():
    log = EventLog(arena=False, flush_rows=1 << 24)  # rows staged in one bytearray, no flush meanwhile
    upstream = FreeingUpstream("1GiB")
    alloc = NativeBFCAllocator(upstream, growth=True, log=log)
    victim = alloc.allocate(256)
    upstream.victim, upstream.address = alloc, victim
    return log, alloc, victim

def vm_size():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))

twin_log, twin, _ = setup()  # how many rows the allocation itself writes, before the free's
before = len(twin_log)
twin.allocate(64 * MiB)
rows = [event.kind for event in twin_log[before:]].index("free")
log, alloc, victim = setup()
staged = log.row_sink()[0]
room = lambda: staged.__alloc__() - len(staged) - 1
while len(staged) < (8 << 20) or not 4 * 78 <= room() < (rows + 3) * 78:
    log.mark("fill")  # room for the segment's row and the allocation's 3 reserved, not the free's 3 after
messages = []
logging.getLogger("gpuviz").addHandler(logging.Handler())
logging.getLogger("gpuviz").handlers[-1].emit = lambda record: messages.append(record.getMessage())
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (vm_size() + (4 << 20), hard))  # the bytearray cannot grow
start = len(log)
address = alloc.allocate(64 * MiB)
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
made = [(e.kind, e.address) for e in log[start:] if e.kind != "mark"]  # reading the log is no operation
alloc.free(address)  # the next operation: the due free is made after it
then = [(e.kind, e.address) for e in log[start:] if e.kind != "mark"][len(made):]
alloc.check()
state = {(c.address, c.size, c.in_use) for c in alloc.state().chunks()}
print(json.dumps({"rows": rows, "address": address, "victim": victim, "made": made, "then": then,
                  "replayed": {(c.address, c.size, c.in_use) for c in replay(log).state_at(-1).chunks()} == state,
                  "in_use": [c for c in state if c[2]], "messages": messages}))
"""


@needs_core
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status")
def test_a_deferred_free_without_room_for_its_rows_stays_due_and_the_allocation_stands() -> None:
    """A free arriving inside an allocation (a finalizer) that finds no memory for its rows
    when the allocation ends is not made and stays due: the allocation returns its address
    (before, it raised MemoryError and the address was lost), the failure is logged, and the
    next operation makes the free. The log replays to the allocator's state."""
    import json

    out = subprocess.run(
        [sys.executable, "-c", _DEFERRED_FREE_WITHOUT_ROOM], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["rows"] == 2  # segment_alloc, alloc
    address, victim = result["address"], result["victim"]
    assert address == (1 << 40) + 2 * MiB  # the allocation returned its address
    assert result["made"] == [["segment_alloc", address], ["alloc", address]]  # and no free of the victim
    # the next operation: its own free, then the due one (each merging with the free chunks)
    assert [kind for kind, _ in result["then"]] == ["free", "free", "merge"]
    assert [a for kind, a in result["then"] if kind == "free"] == [address, victim]
    assert result["in_use"] == [] and result["replayed"] is True
    assert result["messages"] == ["GPU:0: a deferred free could not be made now; it stays due, for the next operation"]


@needs_core
def test_tags_are_released_with_their_chunks() -> None:
    log = EventLog()
    alloc = NativeBFCAllocator(SimUpstream("1GiB"), log=log)
    tag = "".join(["unique", "-tag"])  # a fresh str object
    alloc.free(alloc.allocate(100, tag=tag))  # the log's string table keeps its own references
    before = sys.getrefcount(tag)
    p = alloc.allocate(100, tag=tag)
    assert sys.getrefcount(tag) == before + 1
    assert alloc.state().segments[0].chunks[0].tag == "unique-tag"
    alloc.free(p)
    assert sys.getrefcount(tag) == before
    q = alloc.allocate(100, tag=tag)
    del alloc
    gc.collect()
    assert sys.getrefcount(tag) == before
    assert q == 1 << 40


@needs_core
def test_allocator_class_follows_gpuviz_native(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUVIZ_NATIVE", "1")
    assert allocator_class() is NativeBFCAllocator
    monkeypatch.setenv("GPUVIZ_NATIVE", "0")
    assert allocator_class() is ReferenceBFCAllocator


def test_without_the_core_the_native_class_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "_CoreClass", None)
    assert not native_core_available()
    assert allocator_class() is ReferenceBFCAllocator
    with pytest.raises(RuntimeError, match="installed without a C compiler"):
        NativeBFCAllocator(SimUpstream("1GiB"))


def test_the_core_is_built_where_a_compiler_exists() -> None:
    has_cc = subprocess.run(["sh", "-c", "command -v cc || command -v gcc"], capture_output=True).returncode == 0
    if has_cc and os.environ.get("GPUVIZ_NATIVE", "1") != "0":
        assert native._CoreClass is not None, "a C compiler exists but gpuviz.capture._bfcnative was not built"


def test_the_taught_name_is_the_native_allocator_where_it_was_built() -> None:
    import gpuviz
    import gpuviz.capture

    expected = NativeBFCAllocator if native_core_available() else ReferenceBFCAllocator
    assert gpuviz.BFCAllocator is gpuviz.capture.BFCAllocator is expected
    assert gpuviz.capture.ReferenceBFCAllocator is ReferenceBFCAllocator
    assert repr(gpuviz.BFCAllocator(SimUpstream("1GiB"))).startswith("<BFCAllocator GPU:0: 0 bytes in use")
    script = "import gpuviz; print(gpuviz.BFCAllocator.__name__)"
    for env, name in (("1", expected.__name__), ("0", "ReferenceBFCAllocator")):
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                              env={**os.environ, "GPUVIZ_NATIVE": env})  # fmt: skip
        assert proc.stdout.strip() == name
