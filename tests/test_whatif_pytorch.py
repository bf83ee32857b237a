"""The PyTorch caching-allocator model against PyTorch itself: five real snapshots (GPUVIZ_TEST_TRACES)
record PyTorch's own decisions; the model must make the same ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from traces import trace_files

import gpuviz
from gpuviz.scenarios import whatif
from gpuviz.scenarios.reproduce import reproduce

# file -> (allocations in the trace, segments the trace reserved, peak reserved as recorded,
#          peak reserved by the model started from an empty allocator) — bytes
EXPECTED = {
    "pt_snapshot_assignment2_2026a.pickle": (2162, 0, 4_238_344_192, 4_169_138_176),
    "pt_snapshot_assignment2_2026b.pickle": (1721, 0, 14_180_941_824, 14_088_667_136),
    "pt_snapshot_cs336_ctx128_forward_mixed_2025.pickle": (2703, 461, 24_245_174_272, 24_245_174_272),
    "pt_snapshot_cs336_ctx128_fullstep_2025.pickle": (6771, 783, 61_111_009_280, 61_111_009_280),
    "pt_snapshot_ftcourse_2024.pickle": (3505, 152, 6_471_811_072, 6_492_782_592),
}


@pytest.fixture(scope="module", params=trace_files(EXPECTED))
def snapshot(request: pytest.FixtureRequest) -> tuple[str, gpuviz.EventLog]:
    path: Path = request.param
    return path.name, gpuviz.load(path)


def test_the_model_places_every_allocation_where_pytorch_did(snapshot: tuple[str, gpuviz.EventLog]) -> None:
    name, log = snapshot
    allocations, segments, peak, _ = EXPECTED[name]
    a = reproduce(log)  # seeded with the heap at the trace's start, cudaMalloc's own addresses
    assert (a.allocations, a.same_addresses, a.first_difference) == (allocations, allocations, None)
    assert len(a.segments_source) == segments and a.segments_model == a.segments_source
    assert a.final_same  # the same final blocks as the snapshot's segments
    assert (a.peak_reserved_source, a.peak_reserved_model) == (peak, peak)
    assert a.exact


def test_with_other_addresses_the_segments_and_peak_are_still_exact(snapshot: tuple[str, gpuviz.EventLog]) -> None:
    name, log = snapshot
    _, segments, peak, _ = EXPECTED[name]
    a = reproduce(log, addresses="simulated")
    assert a.segments_model == a.segments_source and len(a.segments_source) == segments
    assert (a.peak_reserved_source, a.peak_reserved_model) == (peak, peak)


def test_from_an_empty_allocator_the_peak_is_close(snapshot: tuple[str, gpuviz.EventLog]) -> None:
    """What a user's what-if does: every request from the start, nothing seeded. The trace began
    mid-run, so allocations alive then become requests at its start: the peak may differ a little."""
    name, log = snapshot
    _, _, recorded, model = EXPECTED[name]
    c = whatif(log, ["torch"])
    assert (c["recorded"].peak_reserved, c["torch"].peak_reserved) == (recorded, model)
    assert abs(model - recorded) / recorded < 0.017
