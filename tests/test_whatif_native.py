"""The C what-if replay (gpuviz.scenarios._whatifcore) against the Python models: the same request
streams under torch, rmm-pool and no-pool must give the same logs, row by row, the same string
and stack tables, the same served counts, comparisons and out-of-memory points."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from traces import trace_files

import gpuviz
from gpuviz import EventLog, SimUpstream
from gpuviz.analysis.comparison import PolicyOutcome, outcome
from gpuviz.analysis.requests import RequestStream, request_stream
from gpuviz.base.heapstate import ChunkState, HeapState, SegmentState
from gpuviz.base.torch_rules import CachingRules
from gpuviz.capture.native import allocator_class
from gpuviz.log.eventlog import Frame
from gpuviz.scenarios import native as native_module
from gpuviz.scenarios import parse_policy, replay_policy
from gpuviz.scenarios.native import native_replay_available, replay_native
from gpuviz.scenarios.torch_caching import TorchCachingAllocator
from gpuviz.scenarios.whatif import UNBOUNDED, busiest_device

pytestmark = pytest.mark.skipif(not native_replay_available(), reason="the C replay is not built, or GPUVIZ_NATIVE=0")

KiB, MiB = 1 << 10, 1 << 20
B = 1 << 40


def _source() -> EventLog:
    """A source log whose tables the stream's tags and stacks point into: 7 strings and 5 stacks,
    the last of each a repeat of an earlier one (as an imported table may hold)."""
    log = EventLog()
    for i in range(6):
        log.intern_string(f"op{i}")
    for i in range(4):
        log.intern_stack(tuple(Frame(f"f{i}.py", j, "g") for j in range(i + 1)))
    log.strings.append("op1")
    log.stacks.append(log.stacks[2])
    return log


# one request stream: ("alloc", bytes, tag, stack) | ("free", pick) | ("defer", pick) | ("complete", pick)
_SIZES = st.one_of(
    st.integers(1, 4 * KiB),
    st.integers(1, 2 * MiB),
    st.integers(MiB, 24 * MiB),
    st.integers(20 * MiB, 80 * MiB),
    st.integers(1, 96).map(lambda mib: mib * MiB),  # whole MiB: the rules' boundaries (20 MiB apart, > 1 MiB rest)
)
_OP = st.one_of(
    st.tuples(st.just("alloc"), _SIZES, st.integers(-1, 6), st.integers(-1, 4)),
    st.tuples(st.sampled_from(["free", "defer", "complete"]), st.integers(0, 1000)),
)


def _stream(ops: list[tuple[object, ...]]) -> RequestStream:
    is_alloc: list[bool] = []
    deferred: list[bool] = []
    alloc_of: list[int] = []
    requested: list[int] = []
    tags: list[int] = []
    stacks: list[int] = []
    live: list[int] = []  # positions of allocations not yet freed
    waiting: list[int] = []  # positions whose free request waits for its completion

    def add(alloc: bool, defer: bool, made: int, nbytes: int = 0, tag: int = -1, stack: int = -1) -> None:
        is_alloc.append(alloc), deferred.append(defer), alloc_of.append(made)
        requested.append(nbytes), tags.append(tag), stacks.append(stack)

    for op in ops:
        if op[0] == "alloc":
            _, nbytes, tag, stack = op
            live.append(len(is_alloc))
            add(True, False, -1, int(nbytes), int(tag), int(stack))  # type: ignore[call-overload]
        elif op[0] == "complete" and waiting:
            add(False, False, waiting.pop(int(op[1]) % len(waiting)))  # type: ignore[call-overload]
        elif op[0] in ("free", "defer") and live:
            made = live.pop(int(op[1]) % len(live))  # type: ignore[call-overload]
            add(False, op[0] == "defer", made)
            if op[0] == "defer":
                waiting.append(made)
    n = len(is_alloc)
    return RequestStream(
        device="GPU:0", is_alloc=np.array(is_alloc, dtype=bool), deferred=np.array(deferred, dtype=bool),
        alloc_of=np.array(alloc_of, dtype=np.int64), requested=np.array(requested, dtype=np.int64),
        time_ns=np.arange(n, dtype=np.int64) * 1000 + 7, address=np.zeros(n, dtype=np.int64),
        tag=np.array(tags, dtype=np.int32), stack=np.array(stacks, dtype=np.int32),
        position=np.arange(n, dtype=np.int64), unmatched_frees=0,
    )  # fmt: skip


def _python(stream: RequestStream, source: EventLog, spec: str, capacity: int, stop: bool) -> tuple[EventLog, int]:
    """The Python models' replay: an allocator handed in is never replayed in C."""
    policy = parse_policy(spec)
    upstream = SimUpstream(capacity)
    built = policy.build(upstream, device=stream.device, log=EventLog())
    return replay_policy(stream, source, policy, upstream, stop_at_oom=stop, allocator=built)


def _native(
    stream: RequestStream, source: EventLog, spec: str, capacity: int, stop: bool, *, device: str = "GPU:0"
) -> tuple[EventLog, int]:
    policy = parse_policy(spec)
    upstream = SimUpstream(capacity)
    replayed = replay_native(stream, source, policy.build(upstream, device=device, log=EventLog()), upstream,
                             stop_at_oom=stop)  # fmt: skip
    assert replayed is not None
    return replayed


def _measures(o: PolicyOutcome) -> tuple[object, ...]:
    return (o.requests, o.served, o.peak_reserved, o.peak_in_use, o.peak_requested, o.waste_at_peak,
            o.final_reserved, o.oom, o.worst_index)  # fmt: skip


def assert_same_replay(
    a: tuple[EventLog, int], b: tuple[EventLog, int], requests: int, *, device: str = "GPU:0"
) -> None:
    (log_a, served_a), (log_b, served_b) = a, b
    assert served_a == served_b
    assert len(log_a) == len(log_b)
    for name, column in log_b.columns.items():
        assert np.array_equal(log_a.columns[name], column), name
        assert log_a.columns[name].dtype == column.dtype, name
    assert (log_a.strings, log_a.stacks, log_a.devices) == (log_b.strings, log_b.stacks, log_b.devices)
    if len(log_b):
        measured = [outcome("p", log, device, requests=requests, served=served_a) for log in (log_a, log_b)]
        assert _measures(measured[0]) == _measures(measured[1])


_POLICIES = st.sampled_from([
    "torch", "torch:max_split_size_mb=21", "torch:max_split_size_mb=32", "torch:roundup_power2_divisions=4",
    "torch:roundup_power2_divisions=8,max_split_size_mb=64", "torch:fraction=0.5",
    "torch:garbage_collection_threshold=0.5,fraction=0.8", "torch:garbage_collection_threshold=0.2,fraction=1",
    "torch:garbage_collection_threshold=0.7,fraction=0.6,max_split_size_mb=24",
    "rmm-pool", "rmm-pool:initial=8MiB", "rmm-pool:initial=3MiB,maximum=100MiB", "rmm-pool:maximum=64MiB", "no-pool",
    "tf-bfc", "tf-bfc:gc=true", "tf-bfc:limit=40MiB", "tf-bfc:fraction=0.5,gc=true", "tf-bfc:growth=false",
    "tf-bfc:growth=false,limit=30MiB",
])  # fmt: skip
_CAPACITIES = st.sampled_from([48 * MiB, 96 * MiB, 160 * MiB, 512 * MiB, UNBOUNDED])


@settings(max_examples=400, deadline=None)
@given(st.lists(_OP, max_size=120), _POLICIES, _CAPACITIES, st.booleans())
def test_the_c_replay_writes_the_python_models_log(ops: list[tuple[object, ...]], spec: str, capacity: int,
                                                   stop: bool) -> None:  # fmt: skip
    stream = _stream(ops)
    source = _source()
    assert_same_replay(
        _native(stream, source, spec, capacity, stop), _python(stream, source, spec, capacity, stop), len(stream)
    )


def test_replay_policy_uses_the_c_replay_unless_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same stream through ``replay_policy`` with the C replay and with ``GPUVIZ_NATIVE=0``:
    an allocation that needs a new segment after another stream's free waits, an OOM skipped."""
    ops: list[tuple[object, ...]] = [
        ("alloc", 30 * MiB, 1, 2), ("defer", 0), ("alloc", 30 * MiB, 3, -1), ("alloc", 50 * MiB, 2, 1),
        ("complete", 0), ("alloc", 100, 1, 2), ("free", 2),
    ]  # fmt: skip
    stream, source = _stream(ops), _source()
    runs = {}
    calls: list[int] = []
    core = native_module._core

    class Spy:  # counts the C replays
        def replay(self, *args: object) -> object:
            calls.append(1)
            return core.replay(*args)

    monkeypatch.setattr(native_module, "_core", Spy())
    for native in ("1", "0"):
        monkeypatch.setenv("GPUVIZ_NATIVE", native)
        assert native_replay_available() == (native == "1")
        runs[native] = replay_policy(stream, source, parse_policy("torch"), SimUpstream(42 * MiB), stop_at_oom=False)
    assert len(calls) == 1  # the first run only
    assert_same_replay(runs["1"], runs["0"], len(stream))
    log, served = runs["1"]
    assert served == 6  # the 50 MiB request does not fit 42 MiB next to 30 MiB in use
    kinds = [(e.kind, e.address - B if e.address else 0, e.size) for e in log]
    assert kinds == [
        ("segment_alloc", 0, 30 * MiB), ("alloc", 0, 30 * MiB),  # the deferred free keeps it in use
        ("free", 0, 30 * MiB), ("segment_free", 0, 30 * MiB),  # synchronized before giving up: released
        ("segment_alloc", 0, 30 * MiB), ("alloc", 0, 30 * MiB),
        ("oom", 0, 50 * MiB),
        ("segment_alloc", 30 * MiB, 2 * MiB), ("split", 30 * MiB, 512), ("alloc", 30 * MiB, 512),
        ("free", 30 * MiB, 512), ("merge", 30 * MiB, 2 * MiB),
    ]  # fmt: skip
    assert [source.strings.index(log.strings[t]) for t in log.columns["tag"] if t >= 0] == [1, 1, 3, 2, 1, 1]


@pytest.mark.parametrize(
    ("first", "second"),
    [(32 * MiB, 25 * MiB), (54 * MiB, 34 * MiB), (52 * MiB, 34 * MiB)],
)
def test_oversize_blocks_at_the_max_split_boundaries(first: int, second: int) -> None:
    """max_split_size_mb=32: a free block of exactly 32 MiB is oversize (not for a 25 MiB request),
    and a 34 MiB request does not take a block of 34 + 20 MiB or more, but does take 52 MiB."""
    stream, source = _stream([("alloc", first, -1, -1), ("free", 0), ("alloc", second, -1, -1)]), _source()
    native = _native(stream, source, "torch:max_split_size_mb=32", UNBOUNDED, True)
    assert_same_replay(native, _python(stream, source, "torch:max_split_size_mb=32", UNBOUNDED, True), 3)
    segments = [e.size for e in native[0] if e.kind == "segment_alloc"]
    assert segments == ([first] if first == 52 * MiB else [first, -(-second // (2 * MiB)) * 2 * MiB])


SNAPSHOTS = [
    "pt_snapshot_assignment2_2026a.pickle", "pt_snapshot_assignment2_2026b.pickle",
    "pt_snapshot_cs336_ctx128_forward_mixed_2025.pickle", "pt_snapshot_cs336_ctx128_fullstep_2025.pickle",
    "pt_snapshot_ftcourse_2024.pickle",
]  # fmt: skip


@pytest.mark.parametrize("path", trace_files(SNAPSHOTS))
def test_the_c_replay_of_real_pytorch_snapshots_is_the_python_models(path: Path) -> None:
    """The five real PyTorch snapshots (GPUVIZ_TEST_TRACES) under each policy, unbounded and on a device
    10% smaller than PyTorch's recorded peak (out of memory: stopping there, or skipping what does not fit)."""
    log = gpuviz.load(path)
    device = busiest_device(log)
    stream = request_stream(log, device)
    peak = int(outcome("recorded", log, device, requests=len(stream), served=len(stream)).peak_reserved)
    for spec in ("torch", "torch:max_split_size_mb=64,roundup_power2_divisions=4", "rmm-pool", "no-pool", "tf-bfc"):
        for capacity, stop in ((UNBOUNDED, True), (peak * 9 // 10, True), (peak * 9 // 10, False)):
            native = _native(stream, log, spec, capacity, stop, device=device)
            assert_same_replay(native, _python(stream, log, spec, capacity, stop), len(stream), device=device)


def test_what_the_c_replay_does_not_model_is_left_to_the_python_models() -> None:
    """None (nothing done, nothing recorded) for expandable segments, a seeded or used allocator, a
    backed or used device, requests beyond 2**62 bytes; replay_policy then replays in Python."""
    stream, source = _stream([("alloc", 3 * MiB, -1, -1), ("free", 0)]), _source()

    def declined(alloc: object, upstream: SimUpstream) -> bool:
        return replay_native(stream, source, alloc, upstream) is None

    upstream = SimUpstream(UNBOUNDED)
    bfc = allocator_class()(upstream, device="GPU:0", log=EventLog())
    assert not declined(bfc, upstream)
    bfc.allocate(100)
    assert declined(bfc, upstream)
    huge = _stream([("alloc", 1 << 62, -1, -1)])
    fresh_bfc = allocator_class()(SimUpstream(UNBOUNDED), device="GPU:0", log=EventLog())
    assert replay_native(huge, source, fresh_bfc, fresh_bfc.upstream) is None
    torch = parse_policy("torch").build(upstream, device="GPU:0", log=EventLog())
    assert isinstance(torch, TorchCachingAllocator)
    torch.rules = CachingRules(expandable=True)
    assert declined(torch, upstream) and len(torch.log) == 0
    seeded = parse_policy("torch").build(upstream, device="GPU:0", log=EventLog())
    assert isinstance(seeded, TorchCachingAllocator)
    seeded.seed(HeapState("GPU:0", (SegmentState(B, 2 * MiB, (ChunkState(B, 2 * MiB, 100, True, None, -1),)),)))
    assert declined(seeded, upstream)
    backed = SimUpstream(64 * MiB, backed=True)
    assert declined(parse_policy("no-pool").build(backed, device="GPU:0", log=EventLog()), backed)
    used = SimUpstream(64 * MiB)
    used.allocate(MiB)
    assert declined(parse_policy("rmm-pool").build(used, device="GPU:0", log=EventLog()), used)
    fresh = SimUpstream(64 * MiB)
    assert not declined(parse_policy("rmm-pool:initial=4MiB").build(fresh, device="GPU:0", log=EventLog()), fresh)


@pytest.mark.parametrize("last", [16 * MiB, 24 * MiB])
def test_tf_bfc_garbage_collection_warns_as_the_python_replay_does(last: int, caplog: pytest.LogCaptureFixture) -> None:
    """tf-bfc with gc on a 24 MiB device: a 2 MiB, 4 MiB and 8 MiB segment, all freed; 16 MiB (or
    all 24 MiB) then fits only once the free segments go back (one warning, the same from both)."""
    ops: list[tuple[object, ...]] = [
        ("alloc", 2 * MiB, 1, -1), ("alloc", 3 * MiB, 2, -1), ("alloc", 7 * MiB, 3, -1),
        ("free", 0), ("free", 0), ("free", 0), ("alloc", last, 4, -1),
    ]  # fmt: skip
    stream, source = _stream(ops), _source()
    warnings = []
    for replayed in (_native, _python):
        caplog.clear()
        with caplog.at_level("WARNING", logger="gpuviz"):
            runs = replayed(stream, source, "tf-bfc:gc=true", 24 * MiB, True)
        warnings.append([r.getMessage() for r in caplog.records])
        log, served = runs
        assert served == 7
        sizes = [(e.kind, e.size) for e in log if e.kind.startswith("segment")]
        assert sizes == [("segment_alloc", 2 * MiB), ("segment_alloc", 4 * MiB), ("segment_alloc", 8 * MiB),
                         ("segment_free", 2 * MiB), ("segment_free", 4 * MiB), ("segment_free", 8 * MiB),
                         ("segment_alloc", last)]  # fmt: skip
    assert (
        warnings[0]
        == warnings[1]
        == [f"GPU:0: garbage collection returns 3 free segments (14680064 bytes) upstream to fit {last} bytes"]
    )
