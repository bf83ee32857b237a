"""The command line's output hygiene: names read from files never reach the terminal as escape
sequences, and an output path that cannot be written is refused before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpuviz
from gpuviz.frontends.cli import main


def _log_with_device(name: str) -> gpuviz.EventLog:
    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), log=log)
    alloc.allocate(4096)
    log.devices[0] = gpuviz.log.eventlog.DeviceInfo(name, dict(log.devices[0].options))
    return log


def test_summary_escapes_control_characters_in_names_from_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = "GPU:0\x1b]0;pwned\x07\x1b[2J"
    placement = tmp_path / "placement.txt"
    placement.write_text(f"Executing op MatMul{hostile[5:]} in device /job:localhost/replica:0/task:0/device:GPU:0\n")
    _log_with_device(hostile).save(tmp_path / "run.arrow")
    assert main(["summary", str(tmp_path / "run.arrow")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "GPU:0\\x1b]0;pwned\\x07\\x1b[2J" in out
    assert main(["import", str(placement), "-o", str(tmp_path / "p.arrow")]) == 0
    assert "\x1b" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        ("missing/run.html", "the folder {tmp}/missing does not exist"),
        ("folder", "that is a folder, not a file"),
    ],
)
def test_report_and_import_check_the_output_before_the_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str, reason: str
) -> None:
    (tmp_path / "folder").mkdir()
    _log_with_device("GPU:0").save(tmp_path / "run.arrow")
    target = tmp_path / output
    for command in (["report", str(tmp_path / "run.arrow"), "-o", str(target)],
                    ["import", str(tmp_path / "run.arrow"), "-o", str(target)]):  # fmt: skip
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err == f"gpuviz: error: {target}: {reason.format(tmp=tmp_path)}\n"
    (tmp_path / "unreadable.arrow").write_bytes(b"\x00" * 10)  # would fail to load: the output is named first
    assert main(["report", str(tmp_path / "unreadable.arrow"), "-o", str(tmp_path / "missing" / "r.html")]) == 2
    assert "does not exist" in capsys.readouterr().err
