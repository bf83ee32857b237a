"""What held the memory: user call sites, categories, the answer in words, leaks, and advice
backed by a replay."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from traces import REASON

import gpuviz
from gpuviz.analysis.callsites import call_sites, is_library
from gpuviz.analysis.categories import categories
from gpuviz.analysis.diagnosis import diagnose
from gpuviz.analysis.explain import explain, join_sites
from gpuviz.analysis.tables import allocation_table
from gpuviz.base.errors import OutOfMemoryError
from gpuviz.base.units import GiB, MiB
from gpuviz.capture.upstream import SimUpstream
from gpuviz.log.eventlog import EventLog, Frame
from gpuviz.scenarios.advise import advise
from gpuviz.scenarios.torch_caching import TorchCachingAllocator

TRACES = os.environ.get("GPUVIZ_TEST_TRACES")
needs_traces = pytest.mark.skipif(not TRACES, reason=REASON)

SITE = "/venv/lib/python3.12/site-packages"
PARAM = (Frame("/u/model.py", 10, "__init__"), Frame("/u/train.py", 5, "<module>"))
FORWARD = (
    Frame("/u/model.py", 20, "forward"),
    Frame(f"{SITE}/torch/nn/modules/module.py", 1750, "_call_impl"),
    Frame("/u/train.py", 8, "<module>"),
)
BACKWARD = (
    Frame(f"{SITE}/torch/autograd/__init__.py", 200, "backward"),
    Frame(f"{SITE}/torch/_tensor.py", 500, "backward"),
    Frame("/u/train.py", 9, "<module>"),
)
STEP = (
    Frame(f"{SITE}/torch/optim/adam.py", 100, "_single_tensor_adam"),
    Frame(f"{SITE}/torch/optim/adam.py", 200, "step"),
    Frame("/u/train.py", 10, "<module>"),
)


def _training_log() -> EventLog:
    """A parameter, an activation, a temporary freed in the forward pass, a gradient, an
    optimizer state and an allocation without a stack, each 2 MiB apart in size."""
    alloc = TorchCachingAllocator(SimUpstream(GiB), device="GPU:0")
    log = alloc.log

    def make(size_mib: int, frames: tuple[Frame, ...] | None) -> int:
        return alloc.allocate(size_mib * MiB, stack=log.intern_stack(frames) if frames else -1)

    make(2, PARAM)
    make(4, FORWARD)
    alloc.free(make(6, FORWARD))
    make(8, BACKWARD)
    make(10, STEP)
    make(12, None)
    return log


def test_user_call_sites_skip_library_frames_and_keep_the_op() -> None:
    log = _training_log()
    sites = call_sites(log)
    ids = [log.intern_stack(s) for s in (PARAM, FORWARD, BACKWARD, STEP)]
    assert sites.sites_of(ids).tolist() == [
        "/u/model.py:10 (__init__)", "/u/model.py:20 (forward)", "/u/train.py:9 (<module>)",
        "/u/train.py:10 (<module>)",
    ]  # fmt: skip
    assert sites.ops_of(ids).tolist() == [
        None, None, "torch/_tensor.py:500 (backward)", "torch/optim/adam.py:200 (step)",
    ]  # fmt: skip
    assert sites.shorts_of([ids[1], -1]).tolist() == ["model.py:20", None]
    # the user's own package, installed in site-packages, named as user code
    assert is_library(f"{SITE}/mylib/layers.py")
    assert not is_library(f"{SITE}/mylib/layers.py", user_code="mylib/")
    assert call_sites(log, user_code="torch/optim").sites_of([ids[3]]).tolist() == [
        f"{SITE}/torch/optim/adam.py:100 (_single_tensor_adam)"
    ]
    with pytest.raises(ValueError, match="not a regular expression"):
        call_sites(log, user_code="(")


def test_categories_of_a_hand_made_training_step() -> None:
    log = _training_log()
    table = allocation_table(log, "GPU:0")
    cats = categories(log, table)
    assert table["requested"].tolist() == [n * MiB for n in (2, 4, 6, 8, 10, 12)]
    assert cats["category"].tolist() == [
        "parameter", "activation", "temporary", "gradient", "optimizer state", "unknown",
    ]  # fmt: skip
    assert cats["inferred"].tolist() == [True] * 6
    assert cats["basis"].tolist() == ["stack"] * 5 + ["none"]


def test_the_answer_names_categories_and_call_sites() -> None:
    log = _training_log()
    (answer,) = explain(log)
    assert answer.moment == "peak"
    assert [(h.category, h.bytes) for h in answer.holders] == [
        ("unknown", 12 * MiB), ("optimizer state", 10 * MiB), ("gradient", 8 * MiB), ("activation", 4 * MiB),
        ("parameter", 2 * MiB),
    ]  # fmt: skip
    assert answer.holders[1].sites == (("train.py:10", 10 * MiB),)
    assert answer.text.startswith("GPU:0 at the peak (36 MiB in use, ")
    assert "10 MiB optimizer state from `train.py:10`" in answer.text
    assert join_sites(["optimizers.py:82", "optimizers.py:84", "model.py:3"]) == (
        "`optimizers.py:82`, `:84` and `model.py:3`"
    )
    d = diagnose(log)
    (device,) = d.devices
    assert device.group_by == "call site"  # no tags: grouped by the user's lines
    assert device.answer is not None and device.answer.text == answer.text
    # parameters and optimizer state are never "possible leaks"
    assert sorted(device.leaks["requested"].tolist()) == [4 * MiB, 12 * MiB]


def _fragmenting_run() -> EventLog:
    """Five 200 MiB segments each keep 150 MiB: the 50 MiB holes cannot take 100 MiB and
    nothing is left to reserve on a 1 GiB device; growing one segment serves it."""
    alloc = TorchCachingAllocator(SimUpstream(GiB), device="GPU:0")
    for _ in range(5):
        alloc.free(alloc.allocate(200 * MiB))
        alloc.allocate(150 * MiB)
    with pytest.raises(OutOfMemoryError):
        alloc.allocate(100 * MiB)
    return alloc.log


def test_advice_a_run_that_fragments_fixed_segments_fits_with_expandable_segments() -> None:
    advice = advise(_fragmenting_run())
    assert (advice.family, advice.device, advice.capacity, advice.hit_oom) == ("pytorch", "GPU:0", GiB, True)
    assert not advice.recorded.finished
    assert advice.recorded.served == 15 and advice.recorded.requests == 16
    expandable = next(t for t in advice.trials if t.setting == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert (expandable.finished, expandable.peak_reserved) == (True, 860 * MiB)
    # emptying the cache where the 50 MiB holes sat idle gives each 150 MiB block its own segment
    best = advice.best
    assert best is not None and best.policy == "torch+empty_cache@unused"
    assert (best.finished, best.peak_reserved) == (True, 850 * MiB)
    assert advice.headline.startswith(
        "GPU:0: the run ran out of memory; on a GPU of 1.0 GiB (the log) it would have finished with "
        "`torch.cuda.empty_cache() at the 8 moments the run held the most reserved but unused memory (after events "
        "2, 7, 12, ...)` (peak reserved 850 MiB), `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (peak reserved "
        "860 MiB)"
    )
    assert not any("TF_FORCE_GPU_ALLOW_GROWTH" in line or "XLA_" in line for line in advice.lines)


def test_report_opens_with_the_answer_and_has_the_advice(tmp_path: Path) -> None:
    from gpuviz.frontends.options import write_report

    text = write_report(_fragmenting_run(), tmp_path / "run.html").read_text(encoding="utf-8")
    assert '<p class="answer"><b>GPU:0 at the out-of-memory error (100 MiB requested; 750 MiB in use' in text
    assert "<h2>Advice (replayed)</h2>" in text
    assert "<code>PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True</code> (peak reserved 860 MiB)" in text
    without = write_report(_fragmenting_run(), tmp_path / "plain.html", advise=False).read_text(encoding="utf-8")
    assert "Advice (replayed)" not in without


def _trace(name: str) -> Path:
    assert TRACES is not None
    path = Path(TRACES) / name
    assert path.is_file(), f"{path} is missing from GPUVIZ_TEST_TRACES"
    return path


@needs_traces
def test_cs336_full_step_peak_is_optimizer_state_from_two_lines() -> None:
    from gpuviz.importers import load

    log = load(_trace("pt_snapshot_cs336_ctx128_fullstep_2025.pickle"))
    (answer,) = explain(log)
    assert (answer.moment, answer.in_use, answer.segments) == ("peak", 55_079_000_576, 1010)
    top = answer.by_site.head(4)
    assert top["site"].tolist()[2:] == [
        "/home/c-kaitwang/assignment1/cs336_basics/optimizers.py:82 (step)",
        "/home/c-kaitwang/assignment1/cs336_basics/optimizers.py:84 (step)",
    ]
    assert top["bytes"].tolist()[2:] == [13_630_744_576, 13_629_696_000]
    state = next(h for h in answer.holders if h.category == "optimizer state")
    assert state.sites[:2] == (("optimizers.py:82", 13_630_744_576), ("optimizers.py:84", 13_629_696_000))
    assert "25.4 GiB optimizer state from `optimizers.py:82` and `:84`" in answer.text
    assert answer.text.endswith(
        "5.6 GiB reserved but unused in 1,010 segments (categories inferred from stacks and op names)"
    )
    advice = advise(log)
    assert advice.family == "pytorch" and not advice.hit_oom
    assert all(t.finished for t in advice.trials if t.setting == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


def test_profiler_allocations_are_named_by_the_op_running_on_their_thread() -> None:
    """A CPU profiler trace made by tests/fixtures/torch_profiler_ops/generate.py: zeros, ones,
    then a matmul inside record_function("my_block")."""
    from gpuviz.importers import load

    log = load(Path(__file__).parent / "fixtures" / "torch_profiler_ops" / "trace.json.gz")
    allocs = [e for e in log if e.kind == "alloc"]
    assert [(e.size, e.tag, [f.function for f in log.stacks[e.stack]]) for e in allocs] == [
        (4_000_000, "aten::empty", ["aten::empty", "aten::zeros"]),
        (360_000, "aten::empty", ["aten::empty", "aten::ones"]),
        (4_000_000, "aten::mm", ["aten::mm", "aten::matmul", "my_block"]),
    ]
    assert {f.filename for e in allocs for f in log.stacks[e.stack]} == {"<op>"}
    assert log.meta["columns"]["tag"] == "inferred"
    (answer,) = explain(log)
    assert answer.by_site[["site", "bytes", "count"]].values.tolist() == [
        ["aten::empty", 4_360_000, 2],
        ["aten::mm", 4_000_000, 1],
    ]
    assert "from `aten::empty` and `aten::mm`" in answer.text


def test_cli_summary_user_code_and_advise(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuviz.frontends.cli import main

    path = tmp_path / "step.arrow"
    _training_log().save(path)
    assert main(["summary", str(path), "--user-code", "torch/optim"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "10 MiB optimizer state from `adam.py:100`" in first  # the optimizer's own line, named as user code
    run = tmp_path / "oom.arrow"
    _fragmenting_run().save(run)
    assert main(["advise", str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("GPU:0: the run ran out of memory; on a GPU of 1.0 GiB (the log) it would have finished")
    assert (
        "  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: finishes, peak reserved 860 MiB, fits an 8 GiB GPU" in out
    )
    assert main(["summary", str(path), "--user-code", "("]) == 2
    assert "not a regular expression" in capsys.readouterr().err


def test_dashboard_opens_with_the_answer_and_shows_the_advisors_advice() -> None:
    from gpuviz.frontends.options import advice_or_none
    from gpuviz.widgets.dashboard import Dashboard

    log = _fragmenting_run()
    with_advice = Dashboard(log, advisor=advice_or_none).summary_html
    assert '<p class="answer"><b>GPU:0 at the out-of-memory error (100 MiB requested;' in with_advice
    assert "<h4>Advice (replayed)</h4>" in with_advice
    assert "<code>PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True</code> (peak reserved 860 MiB)" in with_advice
    assert "Advice (replayed)" not in Dashboard(log).summary_html  # no advisor: no replays in the widget


def test_leaks_are_what_grows_step_over_step() -> None:
    """Three steps: each keeps a 4 MiB activation (a history list that grows); the optimizer's
    state is made in the first step only; each step also makes a temporary in the optimizer."""
    alloc = TorchCachingAllocator(SimUpstream(GiB), device="GPU:0")
    log = alloc.log
    forward, step = log.intern_stack(FORWARD), log.intern_stack(STEP)
    for number in range(3):
        alloc.allocate(4 * MiB + number * 512, stack=forward)
        if number == 0:
            alloc.allocate(10 * MiB, stack=step)
        alloc.free(alloc.allocate(1 * MiB, stack=step))
    (device,) = diagnose(log).devices
    # the first step's activation and the optimizer state live from the first step on: not leaks
    assert device.leaks["requested"].tolist() == [4 * MiB + 512, 4 * MiB + 1024]


def test_call_sites_of_a_growing_log_cover_its_new_stacks() -> None:
    log = EventLog()
    first = log.intern_stack(PARAM)
    assert call_sites(log).sites_of([first]).tolist() == ["/u/model.py:10 (__init__)"]
    second = log.intern_stack(STEP)
    grown = call_sites(log)
    assert grown.sites_of([first, second]).tolist() == ["/u/model.py:10 (__init__)", "/u/train.py:10 (<module>)"]
    assert grown.ops_of([first, second]).tolist() == [None, "torch/optim/adam.py:200 (step)"]
    assert call_sites(log) is grown  # computed once per stack count


def test_the_active_memory_view_groups_by_category() -> None:
    from gpuviz.analysis.profile import profile
    from gpuviz.views.active import active_series

    log = _training_log()
    data = active_series(profile(log), "GPU:0", group_by="category")
    categories_made = {"parameter", "activation", "temporary", "gradient", "optimizer state", "unknown"}
    assert set(data.groups) == categories_made  # six groups: under the top ten, no "other"
    by_group = dict(zip(data.groups, data.bytes.max(axis=1).tolist(), strict=True))
    assert by_group["optimizer state"] == 10 * MiB and by_group["parameter"] == 2 * MiB


def test_devices_are_answered_gpus_first_by_peak() -> None:
    """The device that held the most comes first (a 4 MiB GPU:0 after a 12 MiB GPU:1), in the
    answer and in the diagnosis that every summary and report opens with; the CPU last."""
    log = gpuviz.EventLog()
    for device, size in (("GPU:0", 4 << 20), ("GPU:1", 12 << 20), ("CPU:0", 64 << 20)):
        alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), growth=True, device=device, log=log)
        alloc.allocate(size, tag=device)
    assert [a.device for a in explain(log)] == ["GPU:1", "GPU:0", "CPU:0"]
    assert [d.device for d in diagnose(log).devices] == ["GPU:1", "GPU:0", "CPU:0"]
