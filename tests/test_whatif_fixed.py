"""What-if: expandable segments on an unbounded device, policy labels that read back, the
documented ``reproduce``, the run's own failed requests replayed, and the expandable model
against a real PyTorch run with expandable segments on three GPUs."""

from __future__ import annotations

import contextlib
import os
import random
import tracemalloc
from pathlib import Path

import pytest
from traces import REASON

import gpuviz
from gpuviz import EventLog, OutOfMemoryError, SimUpstream, replay
from gpuviz.analysis.requests import request_stream
from gpuviz.analysis.timeline import timeline_series
from gpuviz.base.heapstate import HeapState
from gpuviz.base.torch_rules import LARGE_BUFFER, CachingRules
from gpuviz.scenarios import parse_policy, whatif
from gpuviz.scenarios.torch_caching import TorchCachingAllocator
from gpuviz.scenarios.torch_expandable import ExpandableSegment, reservation_size
from gpuviz.scenarios.whatif import UNBOUNDED

TRACES = os.environ.get("GPUVIZ_TEST_TRACES")
needs_traces = pytest.mark.skipif(not TRACES, reason=REASON)
MiB = 1 << 20
EXPANDABLE = "torch:expandable_segments=true"


# ---------------------------------------------------------------------------- expandable segments: sparse
class _Dense:
    """The reference: one slot per granule."""

    def __init__(self, count: int) -> None:
        self.mapped = [False] * count

    def runs(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for i, on in enumerate(self.mapped):
            if on and (not out or out[-1][1] != i):
                out.append((i, i + 1))
            elif on:
                out[-1] = (out[-1][0], i + 1)
        return out


def test_the_sparse_range_answers_as_one_slot_per_granule_would() -> None:
    granule, count = 4, 64
    es = ExpandableSegment(1000, granule * count, granule, small=True, stream=0)
    dense = _Dense(count)
    upstream = SimUpstream(1 << 30)
    rng = random.Random(7)
    for _ in range(2000):
        begin = rng.randrange(count)
        length = rng.randrange(1, 9)
        end = min(begin + length, count)
        address = 1000 + begin * granule
        if not any(dense.mapped[begin:end]) and rng.random() < 0.6:
            assert (
                es.map(upstream, address, (end - begin) * granule - rng.randrange(granule)) == (end - begin) * granule
            )
            dense.mapped[begin:end] = [True] * (end - begin)
        elif all(dense.mapped[begin:end]):
            start, size = es.unmap(upstream, address, (end - begin) * granule)
            assert (start, size) == (address, (end - begin) * granule)
            dense.mapped[begin:end] = [False] * (end - begin)
        runs = dense.runs()
        assert es.mapped_runs() == [(1000 + a * granule, (b - a) * granule) for a, b in runs]
        assert es.mapped_bytes == sum(dense.mapped) * granule == upstream.reserved
        probe = rng.randrange(count)
        assert es.is_mapped(1000 + probe * granule) == dense.mapped[probe]
        following = next((i for i in range(probe, count) if dense.mapped[i]), count)
        expected_run = 0 if dense.mapped[probe] else (following - probe) * granule
        assert es.unmapped_run(1000 + probe * granule) == expected_run
        starts = [i for i in range(count) if not dense.mapped[i] and (i == 0 or dense.mapped[i - 1])]
        assert es.unmapped_starts() == [1000 + i * granule for i in starts]


def test_a_range_for_an_unbounded_device_costs_what_is_mapped() -> None:
    """1 1/8 PiB of virtual range in 20 MiB granules: 59 million granules, three of them mapped."""
    size = reservation_size(UNBOUNDED, LARGE_BUFFER)
    tracemalloc.start()
    try:
        es = ExpandableSegment(1 << 44, size, LARGE_BUFFER, small=False, stream=0)
        upstream = SimUpstream(UNBOUNDED)
        es.map(upstream, es.base, 3 * LARGE_BUFFER)
        starts = es.unmapped_starts()
        run = es.unmapped_run(es.base + 3 * LARGE_BUFFER)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size // LARGE_BUFFER == 60_397_978
    assert (es.mapped_bytes, starts, run) == (3 * LARGE_BUFFER, [es.base + 3 * LARGE_BUFFER], size - 3 * LARGE_BUFFER)
    assert peak < 1 << 20  # bytes: nothing per unmapped granule


def _run(capacity: int = 64 * MiB) -> TorchCachingAllocator:
    """A run on PyTorch's fixed segments: ten 6 MiB blocks, two freed; the tenth fails on 64 MiB."""
    source = TorchCachingAllocator(SimUpstream(capacity), rules=CachingRules.from_settings({}))
    kept = []
    for _ in range(10):
        with contextlib.suppress(OutOfMemoryError):
            kept.append(source.allocate(6 * MiB))
    source.free(kept[0])
    source.free(kept[1])
    return source


def test_expandable_segments_without_a_capacity_replay_on_an_unbounded_device() -> None:
    log = _run(1 << 30).log
    comparison = whatif(log, [EXPANDABLE, "torch"])
    grown = comparison[EXPANDABLE]
    assert comparison.capacity is None and grown.fits and grown.served == grown.requests == 12
    assert grown.peak_reserved == 60 * MiB  # three 20 MiB granules
    assert [s.size for s in replay(grown.log).state_at(-1).segments] == [60 * MiB]
    assert comparison["torch"].peak_reserved == 80 * MiB  # four 20 MiB segments of three 6 MiB blocks
    bounded = whatif(log, [EXPANDABLE], capacity=1 << 30)[EXPANDABLE]
    assert (bounded.peak_reserved, bounded.final_reserved) == (grown.peak_reserved, grown.final_reserved)


# ---------------------------------------------------------------------------- labels
@pytest.mark.parametrize(
    ("spec", "label"),
    [
        ("torch:expandable_segments=true", "torch:expandable_segments=true"),
        ("torch:expandable_segments=True", "torch:expandable_segments=true"),
        ("pytorch:expandable_segments=1", "torch:expandable_segments=true"),
        ("torch:max_split_size_mb=128", "torch:max_split_size_mb=128"),
        ("tf-bfc:growth=false,limit=1GiB", "tf-bfc:growth=false,limit=1073741824"),
        ("rmm:initial=64MiB", "rmm-pool:initial=67108864"),
        (" No-Pool ", "no-pool"),
    ],
)
def test_a_label_reads_back_as_its_policy(spec: str, label: str) -> None:
    policy = parse_policy(spec)
    assert policy.label == label
    assert parse_policy(label) == policy


def test_any_string_that_selects_a_policy_indexes_the_comparison() -> None:
    comparison = whatif(_run(1 << 30).log, ["torch:expandable_segments=True", "rmm:initial=64MiB"])
    assert [o.name for o in comparison.outcomes] == ["recorded", EXPANDABLE, "rmm-pool:initial=67108864"]
    for spec in (EXPANDABLE, "torch:expandable_segments=True", "pytorch:expandable_segments=yes"):
        assert comparison[spec] is comparison.outcomes[1]
    assert comparison["rmm-pool:initial=64MiB"] is comparison.outcomes[2]
    with pytest.raises(KeyError, match="no policy 'torch'; policies are recorded, torch:expandable_segments=true"):
        comparison["torch"]
    with pytest.raises(KeyError, match="no policy 'nonsense'"):
        comparison["nonsense"]


def test_reproduce_is_importable_as_documented() -> None:
    import gpuviz.scenarios
    from gpuviz.scenarios import Agreement, reproduce

    assert gpuviz.scenarios.reproduce is reproduce
    log = TorchCachingAllocator(SimUpstream(1 << 30), rules=CachingRules.from_settings({}))
    for size in (6 * MiB, 100, 3 * MiB):
        log.allocate(size)
    agreement = reproduce(log.log)
    assert isinstance(agreement, Agreement) and agreement.exact and agreement.allocations == 3


# ---------------------------------------------------------------------------- the run's own failed requests
def test_the_runs_failed_request_is_replayed_and_each_policy_says_if_it_serves_it() -> None:
    source = _run()
    ooms = [e for e in source.log if e.kind == "oom"]
    assert [(e.requested, e.device) for e in ooms] == [(6 * MiB, "GPU:0")]
    stream = request_stream(source.log, "GPU:0", failed=True)
    assert stream.failed is not None and stream.failed_allocations.tolist() == [9]
    assert stream.is_alloc[9:11].tolist() == [True, False] and stream.alloc_of[10] == 9
    assert len(stream) == len(request_stream(source.log, "GPU:0")) + 2
    comparison = whatif(source.log, ["torch", EXPANDABLE, "no-pool"], capacity=64 * MiB)
    recorded, fixed, grown, nopool = comparison.outcomes
    assert (recorded.source_ooms, recorded.served, recorded.requests) == ((False,), 11, 13)
    # fixed segments fail it again (the same fragmentation); growing segments and no pool serve it
    assert (fixed.source_ooms, fixed.fits, fixed.served) == ((False,), False, 9)
    assert fixed.oom is not None and fixed.oom.requested == 6 * MiB
    assert (grown.source_ooms, grown.fits, grown.served) == ((True,), True, 13)
    assert (nopool.source_ooms, nopool.fits) == ((True,), True)
    assert comparison.headline().startswith("as recorded: 1 request failed (out of memory), reserved at most")
    assert "torch:expandable_segments=true: fits on 64.00MiB (the run's own failed requests included)" in (
        comparison.headline()
    )
    assert comparison.table()[1]["source_ooms_served"] == [False]
    from gpuviz.views.comparison import _table_rows

    columns, rows = _table_rows(comparison)
    assert columns[-1] == "run's failed requests served"
    assert [row[-1] for row in rows] == ["0 / 1", "0 / 1", "1 / 1", "1 / 1"]
    assert any(note.startswith("the run failed 1 request (out of memory)") for note in comparison.notes)
    skipping = whatif(source.log, ["torch"], capacity=64 * MiB, stop_at_oom=False)["torch"]
    assert (skipping.source_ooms, skipping.served) == ((False,), 11)


def test_smallest_capacity_counts_the_failed_request() -> None:
    from gpuviz.scenarios import smallest_capacity

    source = _run()
    assert smallest_capacity(source.log, "torch", resolution="2MiB") == 80 * MiB  # four 20 MiB segments
    assert smallest_capacity(source.log, "no-pool", resolution="2MiB") == 60 * MiB


# ---------------------------------------------------------------------------- the real expandable run
def _layout(state: HeapState) -> list[tuple[str, int, int, tuple[tuple[int, int, int, bool], ...]]]:
    """The heap with addresses relative to its pool's first segment: (pool, offset, size, chunks
    relative to the segment). Large-pool ranges are multiples of 20 MiB in this run, small-pool ones not."""
    out = []
    firsts: dict[str, int] = {}
    for segment in state.segments:
        pool = "large" if segment.size % LARGE_BUFFER == 0 else "small"
        first = firsts.setdefault(pool, segment.base)
        chunks = tuple((c.address - segment.base, c.size, c.requested, c.in_use) for c in segment.chunks)
        out.append((pool, segment.base - first, segment.size, chunks))
    return sorted(out)


@pytest.fixture(scope="module")
def real_run() -> EventLog:
    path = Path(TRACES or "") / "pt_snapshot_codelocation_3gpu_expandable_oom.pickle"
    assert path.is_file(), f"{path} is missing"
    return gpuviz.load(path)


# device -> (peak reserved, final mapped segment sizes), from the run's own trace
REAL = {
    "GPU:0": (8_541_700_096, [8_535_408_640, 6_291_456]),
    "GPU:1": (84_202_749_952, [21_663_580_160, 692_060_160, 1_761_607_680, 692_060_160, 27_493_662_720,
                               25_899_827_200, 5_997_854_720, 2_097_152]),
    "GPU:2": (21_883_781_120, [21_873_295_360, 10_485_760]),
}  # fmt: skip
DEVICE_FREE_AT_OOM = 95_682_560  # the oom entry's device_free (bytes)


@needs_traces
def test_the_real_runs_own_figures(real_run: EventLog) -> None:
    assert real_run.meta["source"]["allocator_settings"]["expandable_segments"] is True
    assert real_run.meta["source"]["initially_allocated"] == 0  # the trace covers the run from its start
    for device, (peak, sizes) in REAL.items():
        assert int(timeline_series(real_run, device).pool_bytes.max()) == peak
        assert [s.size for s in replay(real_run).state_at(-1, device=device).segments] == sizes


@needs_traces
@pytest.mark.parametrize("device", ["GPU:0", "GPU:2"])
def test_the_expandable_model_agrees_with_the_real_run_unbounded(real_run: EventLog, device: str) -> None:
    """No OOM on these devices: on an unbounded device the model reserves and maps as PyTorch did."""
    comparison = whatif(real_run, [EXPANDABLE], device=device)
    model = comparison[EXPANDABLE]
    assert model.fits and model.served == model.requests
    assert model.peak_reserved == comparison["recorded"].peak_reserved == REAL[device][0]
    source_end = replay(real_run).state_at(-1, device=device)
    assert _layout(replay(model.log).state_at(-1)) == _layout(source_end)


@needs_traces
def test_the_expandable_model_fails_the_real_runs_oom_on_the_real_device(real_run: EventLog) -> None:
    """GPU:1 ran out of memory asking for 5,308,694,528 bytes with 95,682,560 free on the device:
    on a device of what the run reserved then plus that, the model fails the same request, after
    the same peak, and ends with the same mapped ranges (the same gaps) and blocks."""
    device = "GPU:1"
    stream = request_stream(real_run, device, failed=True)
    (failed,) = stream.failed_allocations.tolist()
    assert int(stream.requested[failed]) == 5_308_694_528
    capacity = REAL[device][0] + DEVICE_FREE_AT_OOM
    comparison = whatif(real_run, [EXPANDABLE], device=device, capacity=capacity, stop_at_oom=False)
    model = comparison[EXPANDABLE]
    assert model.source_ooms == (False,) and model.oom is not None
    assert (model.oom.requested, model.oom.reservable) == (5_308_694_528, DEVICE_FREE_AT_OOM)
    assert model.served == model.requests - 2  # the failed request and its free
    assert model.peak_reserved == REAL[device][0]
    assert _layout(replay(model.log).state_at(-1)) == _layout(replay(real_run).state_at(-1, device=device))
    # with no capacity the model serves it (the run's failure was the device's size)
    unbounded = whatif(real_run, [EXPANDABLE], device=device)[EXPANDABLE]
    assert unbounded.source_ooms == (True,) and unbounded.fits


@pytest.mark.parametrize("spec", ["torch", "rmm-pool", "no-pool", "tf-bfc"])
@pytest.mark.parametrize("stop", [True, False])
def test_the_c_replay_serves_a_stream_with_failed_requests_as_python_does(spec: str, stop: bool) -> None:
    from gpuviz.scenarios import replay_policy
    from gpuviz.scenarios.native import native_replay_available, replay_native

    if not native_replay_available():
        pytest.skip("the C what-if replay is not built")
    source = _run()
    stream = request_stream(source.log, "GPU:0", failed=True)
    policy = parse_policy(spec)
    python_upstream, c_upstream = SimUpstream(64 * MiB), SimUpstream(64 * MiB)
    built = policy.build(python_upstream, device="GPU:0", log=EventLog())
    python_log, python_served = replay_policy(stream, source.log, policy, python_upstream, stop_at_oom=stop,
                                              allocator=built)  # fmt: skip
    native = replay_native(stream, source.log, policy.build(c_upstream, device="GPU:0", log=EventLog()), c_upstream,
                           stop_at_oom=stop)  # fmt: skip
    assert native is not None
    c_log, c_served = native
    assert c_served == python_served
    for name in ("time_ns", "kind", "address", "size", "requested"):
        assert c_log[name].tolist() == python_log[name].tolist(), name
