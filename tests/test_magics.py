"""The IPython magics, run in-process on a real InteractiveShell with display capture."""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import gpuviz
from gpuviz.runtime.context import get_runtime


@pytest.fixture
def shell(runtime_log):  # type: ignore[no-untyped-def]
    ip = InteractiveShell.instance()
    if "GpuvizMagics" not in ip.magics_manager.registry:
        ip.run_line_magic("load_ext", "gpuviz")
    magics = ip.magics_manager.registry["GpuvizMagics"]
    magics.last = magics.recording = magics.dashboard = None  # one shell serves every test
    ip.run_cell("import numpy as np, gpuviz")
    yield ip
    ip.run_cell("%reset -f")


def test_cell_magic_profiles_the_cell_and_keeps_its_arrays(shell: InteractiveShell) -> None:
    with capture_output() as captured:
        shell.run_cell_magic("gpuviz", "--no-live", "x = gpuviz.asarray(np.ones((64, 64)))\ny = x @ x")
    assert len(captured.outputs) == 1
    bundle = captured.outputs[0].data
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert "<svg" in bundle["text/html"] and "MatMul" in bundle["text/html"]
    magics = shell.magics_manager.registry["GpuvizMagics"]
    log = magics.last
    assert [e.tag for e in log.filter(kind="mark")] == ["cell", "cell"]
    assert {e.tag for e in log.filter(kind="placement")} == {"Const", "MatMul"}
    assert float(shell.user_ns["y"].sum()) == 64 * 64 * 64  # arrays survive the cell
    assert magics.dashboard.refresh_count >= 1


def test_cell_magic_options_save_report_and_limits(shell: InteractiveShell, tmp_path: Path) -> None:
    save, report = tmp_path / "cell.arrow", tmp_path / "cell.html"
    with capture_output():
        shell.run_cell_magic(
            "gpuviz",
            f"--memory-limit 64MiB --growth --stacks --no-live --save {save} --report {report} --group-by dtype",
            "z = gpuviz.asarray(np.ones(1000, dtype=np.float32)) * 2",
        )
    gpu = get_runtime().devices["GPU:0"].allocator
    assert (gpu.memory_limit, gpu.growth) == (64 << 20, True)
    loaded = gpuviz.load(save)
    assert {e.kind for e in loaded} >= {"segment_alloc", "alloc", "placement", "transfer", "mark"}
    alloc = loaded.filter(kind="alloc", device="GPU:0")[0]
    assert alloc.stack >= 0 and loaded.stacks[alloc.stack][0].filename.startswith("<")
    assert "by dtype" in report.read_text()


def test_cell_magic_with_device_and_an_oom(shell: InteractiveShell) -> None:
    with capture_output() as captured, pytest.raises(gpuviz.OutOfMemoryError):
        shell.run_cell_magic("gpuviz", "--no-live --memory-limit 8MiB --device GPU:0", "big = gpuviz.empty(4 << 20)")
    assert len(captured.outputs) == 1  # the dashboard is shown before the error propagates
    log = shell.magics_manager.registry["GpuvizMagics"].last
    assert [e.kind for e in log.filter(kind="oom")] == ["oom"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--memory-limit lots", "cannot read 'lots' as a byte size"),
        ("--color-by rainbow", "invalid choice: 'rainbow'"),
        ("--bogus", "unrecognized arguments: --bogus"),
        ("--points 0", "points must be >= 1"),
        ("--save 'unterminated", "cannot read the options"),
    ],
)
def test_bad_options_are_usage_errors(shell: InteractiveShell, line: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        shell.run_cell_magic("gpuviz", line, "pass")


def test_line_magics(shell: InteractiveShell, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match="nothing recorded yet"):
        shell.run_line_magic("gpuviz", "show")
    with pytest.raises(UsageError, match="not recording"):
        shell.run_line_magic("gpuviz", "stop")
    with capture_output():
        shell.run_line_magic("gpuviz", "start --no-live")
    with pytest.raises(UsageError, match="already recording"):
        shell.run_line_magic("gpuviz", "start")
    shell.run_cell("a = gpuviz.asarray(np.ones(100))")
    shell.run_cell("b = a + 1")
    shell.run_line_magic("gpuviz", "status")
    assert "gpuviz: recording" in capsys.readouterr().out
    shell.run_line_magic("gpuviz", "stop")
    log = shell.magics_manager.registry["GpuvizMagics"].last
    assert [e.tag for e in log.filter(kind="mark")] == ["gpuviz start", "gpuviz stop"]
    n = len(log)
    shell.run_cell("c = b * 3")
    assert len(log) == n  # nothing lands in the stopped log
    with capture_output() as captured:
        shell.run_line_magic("gpuviz", "show --group-by dtype")
    assert len(captured.outputs) == 1
    shell.run_line_magic("gpuviz", f"report {tmp_path / 'r.html'}")
    assert (tmp_path / "r.html").exists()
    with pytest.raises(UsageError, match="give the HTML file"):
        shell.run_line_magic("gpuviz", "report")
    shell.run_line_magic("gpuviz", "reset")
    assert all(d.upstream.reserved == 0 for d in get_runtime().devices.values())
    with pytest.raises(UsageError, match="invalid choice: 'launch'"):
        shell.run_line_magic("gpuviz", "launch")
