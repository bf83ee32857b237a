"""PyTorch's caching allocator with ``expandable_segments=True``, on hand-computed cases: exact
virtual addresses (the model reserves from ``VIRTUAL_BASE``), mapped ranges, reserved bytes,
and an allocation that fits with expandable segments and not without."""

from __future__ import annotations

import pytest

import gpuviz
from gpuviz import EventLog, OutOfMemoryError, SimUpstream, replay
from gpuviz.base.torch_rules import CachingRules
from gpuviz.log.schema import Kind
from gpuviz.scenarios import parse_policy
from gpuviz.scenarios.torch_caching import TorchCachingAllocator
from gpuviz.scenarios.torch_expandable import VIRTUAL_BASE, VIRTUAL_STRIDE, reservation_size

V = VIRTUAL_BASE
MiB = 1 << 20
_GROWING = ("segment_map", "segment_unmap", "segment_alloc", "segment_free")


def _model(capacity: int = 64 * MiB, **settings: object) -> TorchCachingAllocator:
    rules = CachingRules.from_settings({"expandable_segments": True, **settings})
    return TorchCachingAllocator(SimUpstream(capacity), rules=rules)


def _segment_events(log: EventLog) -> list[tuple[str, int, int]]:
    return [(e.kind, (e.address - V) // MiB, e.size // MiB) for e in log if e.kind in _GROWING]


def _segments(alloc: TorchCachingAllocator) -> dict[int, int]:
    return {(base - V) // MiB: size // MiB for base, size in alloc.heap.segments.items()}


def test_the_reservation_covers_one_and_an_eighth_of_the_device_in_granules() -> None:
    assert reservation_size(64 * MiB, 20 * MiB) == 80 * MiB  # 72 MiB -> 4 granules of 20 MiB
    assert reservation_size(64 * MiB, 2 * MiB) == 72 * MiB


def test_ten_blocks_of_6_mib_fit_in_three_mapped_granules_but_not_in_three_segments() -> None:
    fixed = TorchCachingAllocator(SimUpstream(64 * MiB))
    for _ in range(9):  # 3 blocks of 6 MiB per 20 MiB segment, 2 MiB left in each
        fixed.allocate(6 * MiB)
    with pytest.raises(OutOfMemoryError):
        fixed.allocate(6 * MiB)  # a 4th segment of 20 MiB would pass 64 MiB
    assert fixed.reserved == 60 * MiB and fixed.in_use == 54 * MiB

    alloc = _model()
    ptrs = [alloc.allocate(6 * MiB) for _ in range(10)]
    alloc.check()
    assert [(p - V) // MiB for p in ptrs] == [0, 6, 12, 18, 24, 30, 36, 42, 48, 54]  # back to back
    assert _segment_events(alloc.log) == [("segment_map", 0, 20), ("segment_map", 20, 20), ("segment_map", 40, 20)]
    assert _segments(alloc) == {0: 60} and alloc.reserved == alloc.in_use == 60 * MiB
    with pytest.raises(OutOfMemoryError):  # a 4th granule passes the device: unmapping frees nothing
        alloc.allocate(6 * MiB)
    assert alloc.log.columns["kind"][-1] == Kind.OOM and alloc.reserved == 60 * MiB
    alloc.check()


def test_mapping_continues_from_the_free_block_before_the_unmapped_range() -> None:
    alloc = _model()
    first = alloc.allocate(18 * MiB)  # maps [0, 20), leaves [18, 20) free
    second = alloc.allocate(6 * MiB)  # the free 2 MiB + a mapped granule: from offset 18
    assert (first - V, second - V) == (0, 18 * MiB)
    assert [(e.kind, (e.address - V) // MiB, e.size // MiB) for e in alloc.log][-4:] == [
        ("segment_map", 20, 20),
        ("merge", 18, 22),  # the free tail [18, 20) joins the new granule
        ("split", 18, 6),
        ("alloc", 18, 6),
    ]
    assert _segments(alloc) == {0: 40} and alloc.reserved == 40 * MiB
    alloc.check()


def test_empty_cache_unmaps_whole_granules_of_free_blocks_and_mapping_fills_the_hole() -> None:
    alloc = _model()
    ptrs = [alloc.allocate(6 * MiB) for _ in range(10)]
    for p in ptrs[3:7]:  # offsets 18..42 MiB free
        alloc.free(p)
    assert alloc.empty_cache() == 20 * MiB  # only the granule [20, 40) lies wholly inside [18, 42)
    assert _segment_events(alloc.log)[-1] == ("segment_unmap", 20, 20)
    assert _segments(alloc) == {0: 20, 40: 20} and alloc.reserved == 40 * MiB
    alloc.check()
    # 20 MiB: the free [18, 20) + the unmapped granule + the free [40, 42) -> mapped back, one segment
    big = alloc.allocate(20 * MiB)
    assert big - V == 18 * MiB
    assert [(e.kind, (e.address - V) // MiB, e.size // MiB) for e in alloc.log][-5:] == [
        ("segment_map", 20, 20),
        ("merge", 20, 22),
        ("merge", 18, 24),
        ("split", 18, 20),
        ("alloc", 18, 20),
    ]
    assert _segments(alloc) == {0: 60} and alloc.reserved == 60 * MiB
    assert replay(alloc.log).state_at(-1) == alloc.state()
    alloc.check()


def test_an_allocation_that_needs_unmapped_memory_releases_cached_granules_first() -> None:
    alloc = _model()
    small = alloc.allocate(1 * MiB)  # small pool: its own range, a 2 MiB granule
    ptrs = [alloc.allocate(20 * MiB) for _ in range(3)]  # large pool: 60 MiB mapped, 62 MiB reserved
    assert (small - V, [(p - V - VIRTUAL_STRIDE) // MiB for p in ptrs]) == (0, [0, 20, 40])
    alloc.free(ptrs[0])
    alloc.free(ptrs[1])
    with pytest.raises(OutOfMemoryError):
        alloc.allocate(50 * MiB)  # 40 MiB free + 2 MiB of the device: not enough even after unmapping
    alloc.check()
    assert alloc.reserved == 22 * MiB  # the free granules were unmapped before giving up
    fits = alloc.allocate(40 * MiB)  # maps [0, 40) of the large range again, next to the live block
    assert fits - V - VIRTUAL_STRIDE == 0 and alloc.reserved == 62 * MiB
    assert _segments(alloc) == {0: 2, VIRTUAL_STRIDE // MiB: 60}
    assert replay(alloc.log).state_at(-1) == alloc.state()
    alloc.check()


def test_a_range_with_nothing_mapped_is_given_back_and_a_new_one_reserved_after_it() -> None:
    alloc = _model()
    p = alloc.allocate(6 * MiB)
    alloc.free(p)
    assert alloc.empty_cache() == 20 * MiB and alloc.heap.segments == {}
    q = alloc.allocate(6 * MiB)  # a fresh reservation, one stride up (addresses are not reused)
    assert q - V == VIRTUAL_STRIDE
    alloc.check()


def test_expandable_segments_with_max_split_size_are_refused() -> None:
    with pytest.raises(ValueError, match="expandable segments with max_split_size are not modelled"):
        _model(max_split_size=64 * MiB)


def test_policy_option_and_whatif_comparison() -> None:
    assert parse_policy("torch:expandable_segments=True").options == {"expandable_segments": True}
    source = _model()
    for _ in range(10):
        source.allocate(6 * MiB)
    comparison = gpuviz.whatif(source.log, ["torch", "torch:expandable_segments=true"], capacity=64 * MiB)
    fixed, grown = comparison["torch"], comparison["torch:expandable_segments=true"]
    assert fixed.oom is not None and fixed.served == 9
    assert grown.oom is None and grown.served == 10 and grown.peak_reserved == 60 * MiB
    assert replay(grown.log).state_at(-1).segments[0].size == 60 * MiB


def test_the_segment_table_and_timeline_show_mapped_ranges() -> None:
    from gpuviz.analysis.tables import segment_table
    from gpuviz.analysis.timeline import timeline_series
    from gpuviz.views.timeline import timeline

    alloc = _model()
    ptrs = [alloc.allocate(6 * MiB) for _ in range(4)]
    for p in ptrs[1:]:
        alloc.free(p)
    alloc.empty_cache()
    table = segment_table(alloc.log)
    assert list(zip(table["kind"], (table["address"] - V) // MiB, table["size"] // MiB, strict=True)) == [
        ("segment_map", 0, 20), ("segment_map", 20, 20), ("segment_unmap", 20, 20)
    ]  # fmt: skip
    figure = timeline(timeline_series(alloc.log), segments=table)
    markers = next(t for t in figure.data if t.name == "segment reserved")
    assert list(markers.hovertext) == ["20 MiB mapped into a growing segment"] * 2


def test_reproduce_refuses_a_run_with_expandable_segments() -> None:
    from pathlib import Path

    from gpuviz.scenarios.reproduce import reproduce

    log = gpuviz.load(Path(__file__).parent / "fixtures" / "pt_snapshot_expandable.json")
    with pytest.raises(ValueError, match="reproduce does not check runs with expandable segments"):
        reproduce(log)


def test_cli_whatif_compares_fixed_and_expandable_segments(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from gpuviz.frontends.cli import main

    source = _model()
    for _ in range(10):
        source.allocate(6 * MiB)
    source.log.save(tmp_path / "run.arrow")
    args = ["whatif", str(tmp_path / "run.arrow"), "--policy", "torch", "--policy", "torch:expandable_segments=true"]
    assert main([*args, "--capacity", "64MiB", "-o", str(tmp_path / "w.html")]) == 0
    out = capsys.readouterr().out
    assert "torch: out of memory on 64.00MiB after 9 of 10 requests" in out
    assert "torch:expandable_segments=true: fits on 64.00MiB, reserving at most 60.00MiB" in out


def test_a_run_exported_to_pytorchs_format_imports_back_exactly() -> None:
    from gpuviz.exporters.torch_snapshot import to_torch_snapshot
    from gpuviz.importers.torch_snapshot import from_snapshot

    alloc = _model()
    ptrs = [alloc.allocate(6 * MiB) for _ in range(10)]
    for p in ptrs[3:7]:
        alloc.free(p)
    alloc.empty_cache()
    alloc.allocate(20 * MiB)
    alloc.allocate(512)  # the small pool's range
    snapshot = to_torch_snapshot(alloc.log)
    assert [s["is_expandable"] for s in snapshot["segments"]] == [True, True]
    back = from_snapshot(snapshot)
    assert not back.meta.get("conflicts")
    assert replay(back).state_at(-1).segments == alloc.state().segments
