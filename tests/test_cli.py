"""The command line: ``gpuviz demo``, ``info``, ``summary``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpuviz import load, replay
from gpuviz.frontends.cli import main


def test_demo_writes_a_log_that_ends_in_a_fragmentation_oom(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "demo.arrow"
    assert main(["demo", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "GPU:0:" in text and "out-of-memory    1 event(s)" in text
    assert "Cause: fragmentation" in text
    log = load(out)
    assert [e.kind for e in log.filter(kind="oom")] == ["oom"]
    state = replay(log).state_at(-1)
    state.check()
    assert state.bytes_in_use == 8 * 3 * (1 << 20)  # the 8 long-lived 3 MiB buffers


def test_summary_of_a_saved_log_and_bad_files(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "demo.arrow"
    main(["demo", "-o", str(out)])
    capsys.readouterr()
    assert main(["summary", str(out)]) == 0
    assert "peak in use" in capsys.readouterr().out
    bad = tmp_path / "bad.arrow"
    bad.write_text("nope")
    assert main(["summary", str(bad)]) == 2
    assert "not a gpuviz event log" in capsys.readouterr().err


def test_python_dash_m_and_info() -> None:
    proc = subprocess.run([sys.executable, "-m", "gpuviz", "info"], capture_output=True, text=True, check=True)
    assert proc.stdout.startswith("gpuviz 0.1.0")
