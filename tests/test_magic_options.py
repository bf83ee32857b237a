"""``%%gpuviz`` checks every option before it touches the runtime or runs the cell."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from test_magics import shell  # noqa: F401 - the shared IPython shell fixture

from gpuviz.runtime.context import get_runtime

KEEP = "keep = gpuviz.asarray(np.arange(10.0)); ran = False"
CELL = "ran = True"


def _refused(shell: InteractiveShell, line: str, message: str) -> None:  # noqa: F811
    """Run ``%%gpuviz line`` over CELL: it must raise ``message`` with nothing changed."""
    shell.run_cell(KEEP)
    runtime = get_runtime()
    log, n = runtime.log, len(runtime.log)
    states = {name: d.allocator.state() for name, d in runtime.devices.items()}
    with pytest.raises(UsageError) as info:
        shell.run_cell_magic("gpuviz", line, CELL)
    assert str(info.value) == message
    assert shell.user_ns["ran"] is False  # the cell did not run
    assert get_runtime() is runtime and runtime.log is log and len(log) == n
    assert {name: d.allocator.state() for name, d in runtime.devices.items()} == states
    assert float(shell.user_ns["keep"].sum()) == 45.0  # the user's array was not released


@pytest.mark.parametrize(
    ("limit", "reason"),
    [
        ("banana", "memory limit: cannot read 'banana' as a byte size (expected e.g. '4GiB' or '512MiB')"),
        ("5XB", "memory limit: unknown unit 'XB' in '5XB' (use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB)"),
        ("999TiB", f"memory limit must be between 1 MiB and the GPU's {16 << 30} bytes, got {999 << 40}"),
        ("0", f"memory limit must be between 1 MiB and the GPU's {16 << 30} bytes, got 0"),
    ],
)
def test_a_bad_memory_limit_releases_nothing(shell: InteractiveShell, limit: str, reason: str) -> None:  # noqa: F811
    _refused(shell, f"--no-live --memory-limit {limit}", f"%%gpuviz: {reason}")


def test_growth_on_a_gpu_with_logical_devices_releases_nothing(shell: InteractiveShell) -> None:  # noqa: F811
    shell.run_cell("gpuviz.reset(configuration=True); gpuviz.config.set_logical_device_configuration('GPU:0', [64])")
    _refused(
        shell, "--no-live --growth", "%%gpuviz: Cannot set memory growth on device when virtual devices configured"
    )


def test_an_unknown_device_names_the_existing_ones(shell: InteractiveShell) -> None:  # noqa: F811
    _refused(shell, "--no-live --device GPU:9", "%%gpuviz --device GPU:9: no such device; the devices are CPU:0, GPU:0")
    _refused(
        shell,
        "--no-live --device /job:localhost/replica:0/task:0/device:GPU:1",
        "%%gpuviz --device /job:localhost/replica:0/task:0/device:GPU:1: no such device; the devices are CPU:0, GPU:0",
    )


def test_an_unknown_device_is_refused_before_the_runtime_starts(shell: InteractiveShell) -> None:  # noqa: F811
    shell.run_cell("gpuviz.reset(configuration=True); gpuviz.config.set_simulated_gpus(2, '1GiB'); ran = False")
    with pytest.raises(UsageError, match=r"the devices are CPU:0, GPU:0, GPU:1$"):
        shell.run_cell_magic("gpuviz", "--no-live --device GPU:2", CELL)
    assert shell.user_ns["ran"] is False
    from gpuviz.runtime import config

    assert config.current().initialized is False


def test_outputs_are_checked_before_the_cell_runs(shell: InteractiveShell, tmp_path: Path) -> None:  # noqa: F811
    missing = tmp_path / "no such folder" / "run.arrow"
    _refused(
        shell,
        f"--no-live --save '{missing}'",
        f"%gpuviz --save {missing}: the folder {missing.parent} does not exist",
    )
    _refused(shell, f"--no-live --report {tmp_path}", f"%gpuviz --report {tmp_path}: that is a folder, not a file")
    if os.geteuid() == 0:  # root writes through file modes; a read-only file system refuses it too
        locked = Path("/sys")
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
    _refused(
        shell,
        f"--no-live --report {locked / 'r.html'}",
        f"%gpuviz --report {locked / 'r.html'}: cannot write in {locked} (Permission denied)",
    )
    assert list(tmp_path.iterdir()) == ([locked] if locked.parent == tmp_path else [])  # nothing left behind


def test_line_report_into_a_missing_folder(shell: InteractiveShell, tmp_path: Path) -> None:  # noqa: F811
    shell.run_cell_magic("gpuviz", "--no-live", "x = gpuviz.asarray(np.ones(3))")
    target = tmp_path / "missing" / "r.html"
    with pytest.raises(UsageError, match=f"the folder {tmp_path / 'missing'} does not exist"):
        shell.run_line_magic("gpuviz", f"report {target}")


def test_growth_applies_to_every_gpu(shell: InteractiveShell) -> None:  # noqa: F811
    shell.run_cell("gpuviz.reset(configuration=True); gpuviz.config.set_simulated_gpus(2, '1GiB')")
    shell.run_cell_magic("gpuviz", "--no-live --growth", "x = gpuviz.asarray(np.ones(3))")
    runtime = get_runtime()
    assert [runtime.devices[n].allocator.growth for n in ("GPU:0", "GPU:1")] == [True, True]
    assert runtime.devices["GPU:1"].allocator.stats().pool_bytes == 0  # growth: nothing reserved yet
    shell.run_cell_magic("gpuviz", "--no-live --no-growth", "y = gpuviz.asarray(np.ones(3))")
    runtime = get_runtime()
    pools = [runtime.devices[n].allocator.stats().pool_bytes for n in ("GPU:0", "GPU:1")]
    assert pools == [(1 << 30) - (225 << 20)] * 2  # both preallocated again
