"""The command line: ``gpuviz demo``, ``report``, ``summary``, ``info``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpuviz
from gpuviz import load, replay
from gpuviz.capture import native, recorder
from gpuviz.capture.native import allocator_description
from gpuviz.capture.recorder import recorder_description
from gpuviz.frontends.cli import main


@pytest.fixture
def fresh_runtime():  # type: ignore[no-untyped-def]
    gpuviz.reset(configuration=True)
    yield
    gpuviz.reset(configuration=True)


def test_demo_writes_a_log_and_a_report(tmp_path: Path, capsys, fresh_runtime) -> None:  # type: ignore[no-untyped-def]
    log_path, report = tmp_path / "demo.arrow", tmp_path / "demo.html"
    assert main(["demo", "--log", str(log_path), "-o", str(report)]) == 0
    text = capsys.readouterr().out
    assert "GPU:0:" in text and "out-of-memory    1 event(s)" in text
    assert "Cause: fragmentation" in text
    log = load(log_path)
    kinds = {e.kind for e in log}
    assert {"alloc", "free", "split", "merge", "segment_alloc", "segment_free", "oom", "transfer", "placement",
            "mark"} <= kinds  # fmt: skip
    heap = replay(log)
    for device in heap.devices:
        state = heap.state_at(-1, device=device)
        state.check()
        assert state.segments == ()  # the session released everything
    document = report.read_text()
    assert document.startswith("<!DOCTYPE html>") and "Fragmentation map" in document and "Placement" in document


def test_report_of_a_saved_log_and_bad_input(tmp_path: Path, capsys, fresh_runtime) -> None:  # type: ignore[no-untyped-def]
    log_path = tmp_path / "run.arrow"
    main(["demo", "--log", str(log_path), "-o", str(tmp_path / "x.html")])
    capsys.readouterr()
    assert main(["report", str(log_path), "--cdn", "--group-by", "dtype"]) == 0
    assert "report written to" in capsys.readouterr().out
    html = (tmp_path / "run.html").read_text()
    assert "cdn.plot.ly" in html and "by dtype" in html
    assert main(["summary", str(log_path)]) == 0
    assert "peak in use" in capsys.readouterr().out
    bad = tmp_path / "bad.arrow"
    bad.write_text("nope")
    assert main(["report", str(bad)]) == 2
    assert "not a gpuviz event log" in capsys.readouterr().err
    assert main(["report", str(log_path), "--device", "GPU:7"]) == 2
    assert "GPU:7" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", str(log_path), "--color-by", "rainbow"])


def test_python_dash_m_and_info() -> None:
    proc = subprocess.run([sys.executable, "-m", "gpuviz", "info"], capture_output=True, text=True, check=True)
    assert proc.stdout.startswith("gpuviz 0.1.0")
    assert "/physical_device:GPU:0" in proc.stdout
    assert f"event recorder: {recorder_description()}\n" in proc.stdout
    assert recorder_description() == "C row writer" or recorder._RowWriter is None
    assert f"allocator: {allocator_description()}\n" in proc.stdout
    assert allocator_description() == "native core (C)" or native._CoreClass is None
    env = {**os.environ, "GPUVIZ_NATIVE": "0"}
    proc = subprocess.run([sys.executable, "-m", "gpuviz", "info"], capture_output=True, text=True, check=True, env=env)
    assert "event recorder: Python (GPUVIZ_NATIVE=0)\n" in proc.stdout
    assert "allocator: Python (GPUVIZ_NATIVE=0)\n" in proc.stdout or native._CoreClass is None
