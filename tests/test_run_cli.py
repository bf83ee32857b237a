"""``gpuviz run``: any Python program, recorded, with its log and report written however it ends.

Programs run in a child process (``python -m gpuviz run ...``), as a user runs them. Those that
need PyTorch, TensorFlow or JAX are skipped where the framework is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gpuviz
from gpuviz.analysis.run import load_run

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env.pop("GPUVIZ_LOG_DIR", None)
    return env


def _gpuviz_run(tmp_path: Path, *words: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuviz", "run", *words], cwd=tmp_path, env=_env(**env),
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def _script(tmp_path: Path, name: str, code: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return path


def _requested(log: gpuviz.EventLog) -> list[int]:
    return [e.requested for e in log.filter(kind="alloc")]


GPUVIZ_ARRAYS = """
    import sys
    import gpuviz
    a = gpuviz.empty(1000)
    b = gpuviz.empty((10, 10))
    print("argv", sys.argv, __name__, flush=True)
"""


def test_a_script_runs_as_python_runs_it_and_its_log_and_report_are_written(tmp_path: Path) -> None:
    _script(tmp_path, "arrays.py", GPUVIZ_ARRAYS)
    done = _gpuviz_run(tmp_path, "arrays.py", "--epochs", "3", "-o", "x")
    assert done.returncode == 0, done.stderr
    assert "argv ['arrays.py', '--epochs', '3', '-o', 'x'] __main__" in done.stdout  # options after it are its own
    log = gpuviz.load(tmp_path / "gpuviz-arrays.arrow")
    assert _requested(log) == [4000, 400]
    assert log.meta["run_end"] == {"how": "exit", "exit_code": 0, "text": "exit code 0"}
    assert log.meta["recorded_by"]["framework"] == "gpuviz"
    assert "gpuviz run: arrays ended: exit code 0" in done.stderr
    assert "recorded: gpuviz's runtime (the program imported none of torch, tensorflow, jax)" in done.stderr
    assert "peak 4.5 KiB in use" in done.stderr and "Empty:float32[1000]" in done.stderr  # the top holders
    assert "gpuviz run: arrays (exit code 0)" in (tmp_path / "gpuviz-arrays.html").read_text()


def test_a_module_runs_with_dash_m_and_outputs_go_where_asked(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    _script(package, "train.py", GPUVIZ_ARRAYS)
    done = _gpuviz_run(tmp_path, "--gpuviz", "-o", "out.arrow", "--report", "out.html", "-m", "pkg.train", "a")
    assert done.returncode == 0, done.stderr
    assert f"argv ['{package / 'train.py'}', 'a'] __main__" in done.stdout  # as python -m sets them
    assert _requested(gpuviz.load(tmp_path / "out.arrow")) == [4000, 400]
    assert (tmp_path / "out.html").is_file()
    assert "recorded: gpuviz's runtime (--gpuviz)" in done.stderr


def test_an_uncaught_exception_keeps_what_was_recorded_and_says_how_it_ended(tmp_path: Path) -> None:
    _script(tmp_path, "fails.py", GPUVIZ_ARRAYS + "    raise ValueError('the loss is NaN')\n")
    done = _gpuviz_run(tmp_path, "fails.py")
    assert done.returncode == 1
    assert 'File "fails.py", line 7, in <module>' in done.stderr and "ValueError: the loss is NaN" in done.stderr
    assert "frontends/run.py" not in done.stderr and "runpy" not in done.stderr  # the program's traceback only
    assert "ended: exception ValueError: the loss is NaN" in done.stderr
    log = gpuviz.load(tmp_path / "gpuviz-fails.arrow")
    assert _requested(log) == [4000, 400]
    assert log.meta["run_end"] == {"how": "exception", "exit_code": 1,
                                   "text": "exception ValueError: the loss is NaN"}  # fmt: skip
    assert "exception ValueError: the loss is NaN" in (tmp_path / "gpuviz-fails.html").read_text()


def test_sys_exit_gives_the_programs_exit_status(tmp_path: Path) -> None:
    _script(tmp_path, "exits.py", GPUVIZ_ARRAYS + "    sys.exit(3)\n")
    done = _gpuviz_run(tmp_path, "exits.py")
    assert done.returncode == 3 and "ended: exit code 3" in done.stderr
    assert gpuviz.load(tmp_path / "gpuviz-exits.arrow").meta["run_end"]["exit_code"] == 3


def _signalled(tmp_path: Path, signum: int) -> tuple[int, str]:
    """(exit status, stderr) of ``gpuviz run`` on a program that says it is ready on stdout and
    then waits, sent ``signum`` once it said so."""
    _script(tmp_path, "waits.py", GPUVIZ_ARRAYS + "    print('ready', flush=True)\n    import threading\n"
                                                  "    threading.Event().wait()\n")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "gpuviz", "run", "waits.py"], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "ready":
            break
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=300)
    return proc.returncode, stderr


def test_ctrl_c_keeps_what_was_recorded(tmp_path: Path) -> None:
    """The program says it is ready on stdout; SIGINT then interrupts it where it waits."""
    returncode, stderr = _signalled(tmp_path, signal.SIGINT)
    assert returncode == 130, stderr
    assert "KeyboardInterrupt" in stderr and "ended: interrupted (KeyboardInterrupt, Ctrl-C)" in stderr
    log = gpuviz.load(tmp_path / "gpuviz-waits.arrow")
    assert _requested(log) == [4000, 400]
    assert log.meta["run_end"]["how"] == "interrupted"


def test_sigterm_keeps_what_was_recorded(tmp_path: Path) -> None:
    returncode, stderr = _signalled(tmp_path, signal.SIGTERM)
    assert returncode == 143 and "ended: terminated by SIGTERM" in stderr
    assert _requested(gpuviz.load(tmp_path / "gpuviz-waits.arrow")) == [4000, 400]


def test_no_program_or_a_missing_script_is_a_clear_error(tmp_path: Path) -> None:
    done = _gpuviz_run(tmp_path)
    assert done.returncode == 2 and "name the program: gpuviz run script.py" in done.stderr
    done = _gpuviz_run(tmp_path, "nowhere.py")
    assert done.returncode == 2 and "gpuviz: error: nowhere.py: no such script" in done.stderr


MULTIPROCESS = """
    import multiprocessing as mp
    import gpuviz

    def work(n):
        keep = gpuviz.empty(n * 1000)
        return keep.nbytes

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=work, args=(i + 1,)) for i in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        print("exit codes", [p.exitcode for p in procs], flush=True)
"""


@pytest.mark.slow
def test_child_processes_record_one_file_each_into_a_run_directory(tmp_path: Path) -> None:
    _script(tmp_path, "pool.py", MULTIPROCESS)
    done = _gpuviz_run(tmp_path, "-o", "pool.arrow", "pool.py")
    assert done.returncode == 0, done.stderr
    assert "exit codes [0, 0]" in done.stdout
    assert "this process recorded no memory events: only its child processes are in the run" in done.stderr
    run = load_run(tmp_path / "pool-run")
    assert [p.name for p in run.paths] == [f"{run.open(0).info.host}-rank{i}.arrow" for i in range(2)]
    requested = sorted(_requested(rank.log)[0] for rank in run)
    assert requested == [4000, 8000]  # one process each, exact
    assert "run: 2 ranks on 1 hosts, 2 devices" in done.stderr
    report = subprocess.run([sys.executable, "-m", "gpuviz", "report", "pool-run"], cwd=tmp_path, env=_env(),
                            capture_output=True, text=True)  # fmt: skip
    assert report.returncode == 0 and (tmp_path / "pool-run.html").is_file(), report.stderr


def _needs(module: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"{module} is not installed")


@pytest.mark.slow
@_needs("torch")
def test_a_pytorch_script_is_recorded_by_pytorchs_profiler(tmp_path: Path) -> None:
    code = "import torch\nkeep = torch.empty(1000)\nalso = torch.ones((64, 64), dtype=torch.float64)\n"
    _script(tmp_path, "t.py", code)
    done = _gpuviz_run(tmp_path, "t.py")
    assert done.returncode == 0, done.stderr
    assert "recorded: PyTorch (the program imported torch)" in done.stderr
    requested = _requested(gpuviz.load(tmp_path / "gpuviz-t.arrow"))
    assert [r for r in requested if r in (4000, 32768)] == [4000, 32768]


TF_SCRIPT = """
    import tensorflow as tf
    a = tf.fill([100000], 1.0)
    b = a * 2
    raise RuntimeError("stopped on purpose")
"""


@pytest.mark.slow
@_needs("tensorflow")
def test_a_tensorflow_script_is_recorded_by_tensorflows_profiler_even_when_it_raises(tmp_path: Path) -> None:
    _script(tmp_path, "tfs.py", TF_SCRIPT)
    done = _gpuviz_run(tmp_path, "tfs.py", CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 1
    assert "recorded: TensorFlow (the program imported tensorflow)" in done.stderr
    assert "ended: exception RuntimeError: stopped on purpose" in done.stderr
    log = gpuviz.load(tmp_path / "gpuviz-tfs.arrow")
    allocs = [(e.requested, e.tag) for e in log.filter(kind="alloc") if e.requested == 400_000]
    assert allocs == [(400_000, "Fill:float32[100000]"), (400_000, "Mul:float32[100000]")]
    assert {e.tag for e in log.filter(kind="placement")} >= {"Fill", "Mul"}


@pytest.mark.slow
@_needs("jax")
def test_a_jax_script_is_recorded_with_jax_flag(tmp_path: Path) -> None:
    _script(tmp_path, "j.py", "import jax.numpy as jnp\nx = jnp.ones((500, 500))\n")
    done = _gpuviz_run(tmp_path, "--jax", "j.py", JAX_PLATFORMS="cpu")
    assert done.returncode == 0, done.stderr
    assert "recorded: JAX (--jax)" in done.stderr
    log = gpuviz.load(tmp_path / "gpuviz-j.arrow")
    assert log.meta["live"]["framework"] == "jax" and log.meta["live"]["mode"] == "cpu"
    assert "JAX on the CPU records no allocator events" in done.stderr  # the difference, said


@pytest.mark.slow
@_needs("torch")
def test_torchrun_workers_record_one_file_per_rank(tmp_path: Path) -> None:
    code = "import os, torch\nrank = int(os.environ['RANK'])\nkeep = torch.empty(1000 * (rank + 1))\n"
    _script(tmp_path, "ddp.py", code)
    done = _gpuviz_run(tmp_path, "-o", "ddp.arrow", "-m", "torch.distributed.run", "--nproc_per_node", "2", "ddp.py")
    assert done.returncode == 0, done.stderr
    ranks = list(load_run(tmp_path / "ddp-run"))
    assert [(r.info.rank, r.info.world_size) for r in ranks] == [(0, 2), (1, 2)]  # the launcher's ranks
    assert [_requested(r.log)[-1] for r in ranks] == [4000, 8000]
    assert "rank0/CPU:0: peak 3.9 KiB" in done.stderr and "rank1/CPU:0: peak 7.8 KiB" in done.stderr  # the CPUs
    assert (tmp_path / "ddp-run.html").is_file()


def test_a_framework_recorder_that_cannot_start_leaves_the_program_running(tmp_path: Path) -> None:
    """A module named jax that is not JAX: its recorder fails inside the program's import, which goes on."""
    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "__init__.py").write_text("")
    _script(tmp_path, "uses.py", "import jax\nprint('still running', flush=True)\n")
    done = _gpuviz_run(tmp_path, "uses.py")
    assert done.returncode == 0 and "still running" in done.stdout
    assert "gpuviz run: JAX's recorder could not start (AttributeError" in done.stderr
    assert "recorded: gpuviz's runtime (JAX's recorder could not start" in done.stderr
