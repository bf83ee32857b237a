"""The IPython magics, run in-process on a real InteractiveShell with display capture."""

from __future__ import annotations

import re
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


def test_cell_magic_returns_the_value_of_the_last_expression(shell: InteractiveShell) -> None:
    with capture_output() as captured:
        result = shell.run_cell(
            "%%gpuviz --no-live\nx = gpuviz.asarray(np.arange(4.0))\nfloat(x.sum()) * 2", store_history=True
        )
    assert result.result == 12.0 and shell.user_ns["_"] == 12.0  # displayed and kept as Out, like a plain cell
    assert re.search(r"Out\[\d+\]: 12.0", captured.stdout)
    with capture_output():
        assert shell.run_cell("%%gpuviz --no-live\n7;").result is None  # a trailing ';' hides it, as in a cell
        assert shell.run_cell("%%gpuviz --no-live\ny = 7").result is None  # an assignment has no value


def test_cell_magic_error_shows_the_users_traceback_only(shell: InteractiveShell) -> None:
    shell.run_cell("def helper(n):\n    return [1, 2][n]")
    with capture_output() as captured:
        result = shell.run_cell("%%gpuviz --no-live\nfirst = 1\nhelper(5)\n", store_history=True)
    assert isinstance(result.error_in_exec, IndexError)  # the user's exception, unchanged
    text = re.sub(r"\x1b\[[0-9;]*m", "", captured.stdout)
    frames = re.findall(r"^(Cell In\[\d+\], line \d+|File .*?, in \w+)", text, flags=re.MULTILINE)
    assert [re.sub(r"\[\d+\]", "[n]", f) for f in frames] == ["Cell In[n], line 3", "Cell In[n], line 2"]
    assert "----> 3 helper(5)" in text and "----> 2     return [1, 2][n]" in text  # lines as the notebook numbers them
    assert "gpuviz" not in text.replace("# %%gpuviz --no-live", "") and "IPython" not in text
    assert "IndexError: list index out of range" in text
    assert len(shell.magics_manager.registry["GpuvizMagics"].last.filter(kind="mark")) == 2  # the cell span closed


_STOP_WITH_A_FULL_DISK = """
import resource, signal, sys
import numpy as np
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
import gpuviz

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "gpuviz")
shell.run_line_magic("gpuviz", f"start --no-live --run-dir {sys.argv[1]}")
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))
shell.run_cell("import numpy as np, gpuviz\\nfor _ in range(3000): a = gpuviz.asarray(np.ones(64)) + 1")
try:
    shell.run_line_magic("gpuviz", "stop")
except UsageError as exc:
    print("stop:", exc)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
shell.run_line_magic("gpuviz", "status")
last = shell.magics_manager.registry["GpuvizMagics"].last
print("events:", len(last), [e.tag for e in last.filter(kind="mark")])
shell.run_line_magic("gpuviz", "start --no-live")
shell.run_line_magic("gpuviz", "stop")
print("again: ok")
"""


def test_stop_when_the_run_file_could_not_be_written(tmp_path: Path) -> None:
    """A --run-dir file that stops being writable (a full disk): %gpuviz stop says so in one
    line, the magic is no longer recording, the last log holds every event, and a new
    recording starts."""
    import subprocess
    import sys

    script = [sys.executable, "-c", _STOP_WITH_A_FULL_DISK, str(tmp_path / "run")]
    out = subprocess.run(script, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    stop = next(line for line in lines if line.startswith("stop: "))
    assert stop.startswith("stop: %gpuviz stop: the event log's file was not finished: writing the event log to ")
    assert stop.endswith("; %gpuviz show and report still have every event")
    assert "File too large" in stop
    assert "gpuviz: not recording" in out.stdout
    events = next(line for line in lines if line.startswith("events: "))
    assert events.endswith("['gpuviz start', 'gpuviz stop']") and int(events.split()[1]) > 6000
    assert lines[-1] == "again: ok"
