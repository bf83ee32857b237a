"""Who held the memory at the peak: the allocations live then, grouped by what held them, call
site and size, with the allocations themselves one by one behind an expander."""

from __future__ import annotations

from pathlib import Path

import pytest
from traces import trace_files, trace_path

from gpuviz.analysis.diagnosis import diagnose
from gpuviz.analysis.livegroups import LIVE_GROUP_COLUMNS, PREEXISTING_LABEL, live_groups
from gpuviz.analysis.tables import allocation_table
from gpuviz.base.units import GiB, MiB
from gpuviz.capture.upstream import SimUpstream
from gpuviz.log.eventlog import EventLog, Frame
from gpuviz.scenarios.torch_caching import TorchCachingAllocator
from gpuviz.views.tables import summary_html

SITE = "/venv/lib/python3.12/site-packages"
PARAM = (Frame("/u/model.py", 10, "__init__"), Frame("/u/train.py", 5, "<module>"))
STEP = (
    Frame(f"{SITE}/torch/optim/adam.py", 100, "_single_tensor_adam"),
    Frame(f"{SITE}/torch/optim/adam.py", 200, "step"),
    Frame("/u/train.py", 10, "<module>"),
)


def _model_log() -> EventLog:
    """Three 4 MiB parameters, two 4 MiB and one 8 MiB optimizer slots, one 1 MiB untagged
    allocation without a stack and one tagged ``kv cache``."""
    alloc = TorchCachingAllocator(SimUpstream(GiB), device="GPU:0")
    log = alloc.log
    for _ in range(3):
        alloc.allocate(4 * MiB, stack=log.intern_stack(PARAM))
    for size in (4, 4, 8):
        alloc.allocate(size * MiB, stack=log.intern_stack(STEP))
    alloc.allocate(MiB)
    alloc.allocate(MiB, tag=log.intern_string("kv cache"))
    return log


def test_live_allocations_grouped_by_what_call_site_and_size() -> None:
    log = _model_log()
    table = allocation_table(log, "GPU:0")
    groups = live_groups(log, table, len(log) - 1)
    assert list(groups.columns) == LIVE_GROUP_COLUMNS
    assert groups[["what", "call_site", "size", "count", "bytes"]].values.tolist() == [
        ["parameter (inferred)", "/u/model.py:10 (__init__)", 4 * MiB, 3, 12 * MiB],
        ["optimizer state (inferred)", "/u/train.py:10 (<module>)", 4 * MiB, 2, 8 * MiB],
        ["optimizer state (inferred)", "/u/train.py:10 (<module>)", 8 * MiB, 1, 8 * MiB],
        ["unknown", None, MiB, 1, MiB],
        ["kv cache", None, MiB, 1, MiB],
    ]
    assert groups["inferred"].tolist() == [True, True, True, False, False]
    assert groups["share"].tolist() == [12 / 30, 8 / 30, 8 / 30, 1 / 30, 1 / 30]
    assert live_groups(log, table, -1).empty
    # right after the second parameter: two of them
    assert live_groups(log, table, int(table["alloc_index"].iloc[1]))[["what", "count"]].values.tolist() == [
        ["parameter (inferred)", 2]
    ]


def test_summary_shows_the_groups_first_and_every_allocation_behind_an_expander() -> None:
    d = diagnose(_model_log())
    (device,) = d.devices
    assert len(device.live) == 8 and len(device.live_groups) == 5
    html = summary_html(d)
    groups_at = html.index('class="gpuviz-sortable gpuviz-live-groups"')
    detail_at = html.index('<details class="gpuviz-live-detail"><summary>All 8 allocations live at the peak')
    assert groups_at < detail_at < html.index('gpuviz-live"', detail_at)
    assert '<td data-value="12582912">3 &times; 4.0 MiB</td><td class="text">parameter (inferred)</td>' in html
    assert html.count("<tr><td data-value=") >= 5


def test_allocations_all_different_are_listed_as_they_are() -> None:
    alloc = TorchCachingAllocator(SimUpstream(GiB), device="GPU:0")
    alloc.allocate(MiB)
    alloc.allocate(2 * MiB)
    html = summary_html(diagnose(alloc.log))
    assert "gpuviz-live-groups" not in html and "<details" not in html
    assert 'class="gpuviz-sortable gpuviz-live"' in html


def test_cs336_peak_groups_with_exact_counts_and_bytes() -> None:
    from gpuviz.importers import load

    log = load(trace_path("pt_snapshot_cs336_ctx128_fullstep_2025.pickle"))
    (device,) = diagnose(log).devices
    groups = device.live_groups
    assert (len(device.live), len(groups), int(groups["bytes"].sum())) == (1204, 30, int(device.live["size"].sum()))
    opt = "/home/c-kaitwang/assignment1/cs336_basics/optimizers.py"
    assert groups.head(8)[["count", "size", "what", "call_site"]].values.tolist() == [
        [96, 100 * MiB, PREEXISTING_LABEL, None],
        [96, 100 * MiB, "gradient (inferred)", None],
        [96, 100 * MiB, "optimizer state (inferred)", f"{opt}:82 (step)"],
        [96, 100 * MiB, "optimizer state (inferred)", f"{opt}:84 (step)"],
        [128, 26 * MiB, PREEXISTING_LABEL, None],
        [128, 26 * MiB, "gradient (inferred)", None],
        [126, 25 * MiB, "optimizer state (inferred)", f"{opt}:84 (step)"],
        [125, 25 * MiB, "optimizer state (inferred)", f"{opt}:82 (step)"],
    ]
    preexisting = groups[groups["what"] == PREEXISTING_LABEL]
    assert (int(preexisting["count"].sum()), int(preexisting["bytes"].sum())) == (324, 13_763_491_840)
    html = summary_html(diagnose(log))
    assert (
        '<td data-value="10066329600">96 &times; 100 MiB</td><td class="text">preexisting (alive before the trace)'
        in html
    )
    assert "All 1,204 allocations live at the peak" in html


# per real trace: the first device (GPUs first, by peak), allocations live at its moment, groups, the first
# group's bytes and what
REAL = {
    "pt_snapshot_assignment2_2026a.pickle": ("GPU:0", 455, 14, 1_340_080_128, PREEXISTING_LABEL),
    "pt_snapshot_assignment2_2026b.pickle": ("GPU:0", 504, 32, 2_415_919_104, "activation (inferred)"),
    "pt_snapshot_codelocation_3gpu_expandable_oom.pickle": ("GPU:1", 111, 35, 31_852_167_168, "activation (inferred)"),
    "pt_snapshot_cs336_ctx128_forward_mixed_2025.pickle": ("GPU:0", 1614, 34, 10_066_329_600, PREEXISTING_LABEL),
    "pt_snapshot_cs336_ctx128_fullstep_2025.pickle": ("GPU:0", 1204, 30, 10_066_329_600, PREEXISTING_LABEL),
    "pt_snapshot_ftcourse_2024.pickle": ("GPU:0", 1181, 31, 1_998_848_000, "activation (inferred)"),
    "pt_profiler_cuda_v100_hta_df_index_resolver.json.gz": ("GPU:1", 726, 121, 4_096_614_400, PREEXISTING_LABEL),
    "pt_profiler_cuda_v100_kineto_resnet50_2021_oldschema.json.gz": ("GPU:0", 208, 18, 924_844_032, "unknown"),
    "pt_profiler_h100_owlv2_tracelens.json.gz": ("GPU:0", 13, 7, 917_445_120, PREEXISTING_LABEL),
    "tb_xplane_gpu_multiworker.xplane.pb": ("GPU:6", 554, 26, 924_844_032, "activation (inferred)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("path", trace_files(REAL))
def test_real_traces_group_every_live_allocation(path: Path) -> None:
    from gpuviz.importers import load

    (device, live, count, top_bytes, top_what) = REAL[path.name]
    first = diagnose(load(path)).devices[0]
    groups = first.live_groups
    assert (first.device, len(first.live), len(groups)) == (device, live, count)
    assert (int(groups["bytes"].iloc[0]), groups["what"].iloc[0]) == (top_bytes, top_what)
    # every live allocation is in exactly one group
    assert int(groups["count"].sum()) == len(first.live)
    assert int(groups["bytes"].sum()) == int(first.live["size"].sum())
