"""What-if replays end to end: the request stream, replays under each policy, the comparison,
its views and front-ends (Python, CLI, magic)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import gpuviz
from gpuviz import SimUpstream, replay
from gpuviz.analysis.requests import request_stream
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.frontends.cli import main
from gpuviz.scenarios import whatif
from gpuviz.views.comparison import comparison_html, comparison_result, comparison_static_html
from gpuviz.views.result import FORMAT, MIME_TYPE

MiB = 1 << 20


def _run() -> ReferenceBFCAllocator:
    """A small recorded run: four allocations, a free, one more."""
    a = ReferenceBFCAllocator(SimUpstream("1GiB"))
    xs = [a.allocate(n, tag=f"t{i}") for i, n in enumerate((1000, 5 * MiB, 3 * MiB, 300))]
    a.free(xs[1])
    a.allocate(7 * MiB, tag="t4")
    return a


def test_request_stream_pairs_frees_with_their_allocations() -> None:
    a = _run()
    s = request_stream(a.log, "GPU:0")
    assert s.is_alloc.tolist() == [True, True, True, True, False, True]
    assert s.requested.tolist() == [1000, 5 * MiB, 3 * MiB, 300, 5 * MiB, 7 * MiB]
    assert s.alloc_of.tolist() == [-1, -1, -1, -1, 1, -1]
    assert s.unmatched_frees == 0
    later = request_stream(a.log, "GPU:0", start=int(s.position[2]))  # begins after the 5 MiB allocation
    assert later.is_alloc.tolist() == [True, True, True] and later.unmatched_frees == 1


def test_replaying_a_bfc_run_under_tf_bfc_reproduces_it_with_the_source_times() -> None:
    a = _run()
    c = whatif(a.log, ["tf-bfc"])
    recorded, replayed = c["recorded"], c["tf-bfc"]
    assert replay(replayed.log).state_at(-1) == a.state()
    assert (replayed.peak_reserved, replayed.peak_in_use) == (recorded.peak_reserved, recorded.peak_in_use)
    source_times = a.log.filter(kind=["alloc", "free"])["time_ns"]
    assert replayed.log.filter(kind=["alloc", "free"])["time_ns"].tolist() == source_times.tolist()
    assert np.all(np.diff(replayed.log["time_ns"]) >= 0)


def test_capacity_stops_a_policy_at_its_first_oom_with_the_cause() -> None:
    a = _run()
    c = whatif(a.log, ["torch", "no-pool"], capacity="20MiB")
    torch = c["torch"]
    # 1000 B takes a 2 MiB small segment; 5 MiB needs a 20 MiB one: 22 MiB > 20 MiB
    assert (torch.served, torch.requests, torch.fits) == (1, 6, False)
    assert torch.oom is not None and (torch.oom.requested, torch.oom.rounded) == (5 * MiB, 5 * MiB)
    assert not torch.oom.fragmentation_cause
    assert c["no-pool"].fits and c["no-pool"].peak_reserved == 1024 + 3 * MiB + 512 + 7 * MiB
    assert c.headline() == (
        "as recorded: reserved at most 18.00MiB; "
        "torch: out of memory on 20.00MiB after 1 of 6 requests (not enough memory: 2.00MiB free in the pool "
        "(largest chunk 2.00MiB), 18.00MiB still reservable from the device); "
        "no-pool: fits on 20.00MiB, reserving at most 10.00MiB (0B of it unused at that moment)."
    )
    going = whatif(a.log, ["torch"], capacity="20MiB", stop_at_oom=False, include_source=False)
    # every large request needs a 20 MiB segment beside the small one: 5, 3 and 7 MiB fail and are
    # skipped (and the free of the 5 MiB one); 1000 B and 300 B are served from the small segment
    assert going["torch"].served == 2


def test_policies_are_validated_before_any_replay() -> None:
    a = _run()
    with pytest.raises(ValueError, match="unknown policy 'tcmalloc'"):
        whatif(a.log, ["torch", "tcmalloc"])
    with pytest.raises(ValueError, match="policies must differ"):
        whatif(a.log, ["torch", "pytorch"])
    with pytest.raises(ValueError, match="no allocations to replay"):
        whatif(gpuviz.EventLog(), ["torch"])


def test_comparison_views_and_display() -> None:
    c = whatif(_run().log, ["torch", "rmm-pool"], capacity="1GiB")
    data = comparison_result(c)
    assert data["format"] == FORMAT and data["summary"][0] == "what if: GPU:0 on 1.00GiB"
    assert [f["name"] for f in data["figures"]] == [
        "whatif:bars", "whatif:timeline", "whatif:map:recorded", "whatif:map:torch", "whatif:map:rmm-pool",
    ]  # fmt: skip
    assert [row[0] for row in data["tables"][0]["rows"]] == ["recorded", "torch", "rmm-pool"]
    bars = data["figures"][0]["figure"]["data"]
    assert [trace["name"] for trace in bars] == ["peak reserved", "peak in use", "peak requested"]
    # GiB: the binary unit of the largest of the peaks and the capacity (1 GiB)
    assert bars[0]["y"] == [18 / 1024, 22 / 1024, c["rmm-pool"].peak_reserved / (1 << 30)]
    assert data["figures"][0]["figure"]["layout"]["yaxis"]["title"]["text"] == "memory (GiB)"
    assert data["figures"][2]["title"] == "recorded: where the most reserved memory sat unused"
    assert data["tables"][0]["rows"][0][1] == "(as run)"
    static = comparison_static_html(c)
    assert "<script" not in static and "rmm-pool" in static
    bundle = c._repr_mimebundle_()
    assert set(bundle) == {MIME_TYPE, "text/html", "text/plain"}
    assert "Plotly.newPlot" in comparison_html(c)


def test_cli_whatif_prints_the_answer_and_writes_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.arrow"
    _run().log.save(path)
    assert main(["whatif", str(path), "--policy", "torch", "--capacity", "20MiB", "-o", str(tmp_path / "w.html")]) == 0
    out = capsys.readouterr().out
    assert "torch: out of memory on 20.00MiB after 1 of 6 requests" in out and "report written to" in out
    assert "Plotly.newPlot" in (tmp_path / "w.html").read_text()
    assert main(["whatif", str(path), "--policy", "no-pool", "-o", str(tmp_path / "w.gpuviz.json")]) == 0
    saved = json.loads((tmp_path / "w.gpuviz.json").read_text())
    assert saved["format"] == FORMAT and saved["tables"][0]["rows"][1][0] == "no-pool"
    assert main(["whatif", str(path), "--policy", "torch:growth=1"]) == 2
    assert "policy 'torch' has no option 'growth'" in capsys.readouterr().err


def test_magic_whatif_replays_the_last_run_or_a_file(tmp_path: Path) -> None:
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    from gpuviz.frontends.magics import GpuvizMagics

    magics = GpuvizMagics(InteractiveShell.instance())
    with pytest.raises(UsageError, match="give a run to replay"):
        magics.gpuviz("whatif --policy torch")
    path = tmp_path / "run.arrow"
    _run().log.save(path)
    c = magics.gpuviz(f"whatif {path} --policy torch --policy tf-bfc --capacity 1GiB")
    assert [o.name for o in c.outcomes] == ["recorded", "torch", "tf-bfc"]
    with pytest.raises(UsageError, match="unknown policy"):
        magics.gpuviz(f"whatif {path} --policy nope")


def test_smallest_capacity_answers_what_would_have_fit() -> None:
    from gpuviz.scenarios import smallest_capacity

    log = _run().log
    # no pool: at most 1024 + 3 MiB + 512 + 7 MiB held at once -> 11 MiB at 1 MiB resolution
    assert smallest_capacity(log, "no-pool", resolution="1MiB") == 11 * MiB
    # PyTorch: a 2 MiB small-pool segment and one 20 MiB segment (5 + 3 MiB, later 7 MiB in its rest)
    assert smallest_capacity(log, "torch", resolution="1MiB") == 22 * MiB
    bfc = smallest_capacity(log, "tf-bfc", resolution="1MiB")
    assert whatif(log, ["tf-bfc"], capacity=bfc)["tf-bfc"].fits
    assert not whatif(log, ["tf-bfc"], capacity=bfc - MiB)["tf-bfc"].fits
    with pytest.raises(ValueError, match="preallocates the whole device: give a capacity"):
        whatif(log, ["tf-bfc:growth=false"])
