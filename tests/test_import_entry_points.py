"""Imported traces through every entry point: ``gpuviz import``, ``report``, ``summary`` and ``%gpuviz show``."""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from traces import trace_path

import gpuviz
from gpuviz.frontends.cli import main

SNAPSHOT_NAME = "pt_snapshot_cs336_ctx128_fullstep_2025.pickle"  # a real trace (GPUVIZ_TEST_TRACES)


@pytest.fixture
def snapshot() -> Path:
    return trace_path(SNAPSHOT_NAME)


def test_import_writes_the_event_log_and_says_what_it_read(
    snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "run.arrow"
    assert main(["import", str(snapshot), "-o", str(output)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(
        "imported pt_snapshot_cs336_ctx128_fullstep_2025.pickle: pytorch-snapshot, written by "
        "torch.cuda.memory._dump_snapshot; 19664 events\n"
        "  GPU:0: 19664 events (segment_alloc 1010, alloc 7095, free 5894, split 3088, merge 2573, mark 4)\n"
        "  inferred: size, largest_free\n  absent: thread, tag\n"
    )
    assert "324 allocations alive before the trace began" in text and text.endswith(f"event log written to {output}\n")
    saved, direct = gpuviz.load(output), gpuviz.load(snapshot)
    assert saved.meta["source"] == direct.meta["source"] and saved.meta["columns"] == direct.meta["columns"]
    for name in ("time_ns", "kind", "address", "size", "requested", "largest_free", "stack", "tag"):
        assert saved[name].tolist() == direct[name].tolist(), name
    assert saved.stacks == direct.stacks and saved.device_names == ["GPU:0"]
    assert gpuviz.replay(saved).state_at(-1) == gpuviz.replay(direct).state_at(-1)


def test_import_defaults_to_the_sources_name_here(snapshot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert main(["import", str(snapshot)]) == 0
    assert (tmp_path / "pt_snapshot_cs336_ctx128_fullstep_2025.arrow").is_file()
    capsys.readouterr()
    unknown = tmp_path / "notes.txt"
    unknown.write_text("hello")
    assert main(["import", str(unknown)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuviz: error: ") and "not a gpuviz event log nor a trace gpuviz can open" in err
    assert "a PyTorch memory snapshot" in err
    log = tmp_path / "pt_snapshot_cs336_ctx128_fullstep_2025.arrow"
    assert main(["import", str(log), "-o", str(log)]) == 2
    assert "is the file being imported" in capsys.readouterr().err


def test_report_and_summary_open_a_snapshot_directly(
    snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["summary", str(snapshot)]) == 0
    text = capsys.readouterr().out
    answer, events = text.splitlines()[:2]  # the answer in words comes first
    assert answer.startswith(
        "GPU:0 at the peak (51.3 GiB in use, 56.9 GiB reserved): "
        "25.4 GiB optimizer state from `optimizers.py:82` and `:84`"
    )
    assert events == "19664 events, devices: GPU:0"
    assert "peak in use      51 GiB at event 19656" in text and "in use at end    51 GiB in 1201 chunks" in text
    report = tmp_path / "snap.html"
    assert main(["report", str(snapshot), "-o", str(report)]) == 0
    html = report.read_text()
    assert "pt_snapshot_cs336_ctx128_fullstep_2025.pickle" in html and "GPU:0" in html


@pytest.fixture
def shell(runtime_log):  # type: ignore[no-untyped-def]
    ip = InteractiveShell.instance()
    if "GpuvizMagics" not in ip.magics_manager.registry:
        ip.run_line_magic("load_ext", "gpuviz")
    magics = ip.magics_manager.registry["GpuvizMagics"]
    magics.last = magics.recording = magics.dashboard = None
    yield ip


def test_show_magic_displays_a_snapshot_file(snapshot: Path, shell: InteractiveShell, tmp_path: Path) -> None:
    with capture_output() as captured:
        shell.run_line_magic("gpuviz", f"show {snapshot}")
    assert len(captured.outputs) == 1
    bundle = captured.outputs[0].data
    assert "application/vnd.jupyter.widget-view+json" in bundle and "<svg" in bundle["text/html"]
    magics = shell.magics_manager.registry["GpuvizMagics"]
    assert magics.dashboard.event_log.meta["source"]["format"] == "pytorch-snapshot"
    assert len(magics.dashboard.event_log) == 19664
    assert magics.last is None  # showing a file leaves the recorded log alone
    with pytest.raises(UsageError, match=r"%gpuviz show: .*missing\.pickle"):
        shell.run_line_magic("gpuviz", f"show {tmp_path / 'missing.pickle'}")
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(snapshot.read_bytes()[:1000])
    with pytest.raises(UsageError, match="pickle is truncated or corrupt"):
        shell.run_line_magic("gpuviz", f"show {bad}")
