"""Live capture from TensorFlow: ``gpuviz.tf.record()`` and ``%%gpuviz --tf``, with TensorFlow's CPU build.

TensorFlow reads ``TF_CPU_ALLOCATOR_USE_BFC`` when it makes its CPU allocator, once per
process, so every recording runs in a fresh Python process (or notebook kernel); the tests
compare what gpuviz imported with the XSpace TensorFlow itself wrote (kept with ``logdir``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import nbformat
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import gpuviz
from gpuviz.analysis.tables import oom_table
from gpuviz.importers import xplane
from gpuviz.importers.source import Source

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
needs_tf = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="TensorFlow is not installed (pip install 'gpuviz[tensorflow]', or tensorflow-cpu)",
)
KERAS_FIT = """
import numpy as np
x = np.random.default_rng(0).random((256, 32), dtype=np.float32)
y = np.random.default_rng(1).random((256, 1), dtype=np.float32)
model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="relu"),
                             tf.keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
model.fit(x, y, batch_size=64, epochs=2, verbose=0)
"""
OOM = """
live = []
try:
    for i in range(100):
        live.append(tf.raw_ops.Empty(shape=[(5 + i % 3) * 1024 * 1024], dtype=tf.uint8))
except tf.errors.ResourceExhaustedError:
    print("ResourceExhaustedError caught", flush=True)
"""
RECORD = """
import json, os, sys
import gpuviz.tf  # before TensorFlow: its CPU allocator becomes its BFC
import tensorflow as tf
out = sys.argv[1]
with gpuviz.tf.record(logdir=out + "/profile") as rec:
    exec(open(out + "/workload.py").read())
rec.log.save(out + "/log.arrow")
json.dump({"mode": rec.mode, "problems": rec.problems, "xplane": str(rec.xplane),
           "bfc": os.environ["TF_CPU_ALLOCATOR_USE_BFC"]}, open(out + "/result.json", "w"))
"""


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="0", **extra)
    env.pop("TF_CPU_ALLOCATOR_USE_BFC", None)  # gpuviz.tf sets it
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


def _record(folder: Path, workload: str, **env: str) -> tuple[gpuviz.EventLog, dict[str, Any], str]:
    folder.mkdir()
    (folder / "workload.py").write_text(workload)
    done = subprocess.run([sys.executable, "-c", RECORD, str(folder)], env=_env(**env), capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((folder / "result.json").read_text())
    return gpuviz.load(folder / "log.arrow"), result, done.stdout + done.stderr


@pytest.fixture(scope="module")
def keras(tmp_path_factory: pytest.TempPathFactory) -> tuple[gpuviz.EventLog, dict[str, Any], str]:
    return _record(tmp_path_factory.mktemp("tf") / "keras", KERAS_FIT)


def _in_use_after_each(log: gpuviz.EventLog, device: str) -> list[tuple[bool, int, int, int]]:
    """(is alloc, address, chunk bytes, bytes in use after) of each alloc/free of ``device``."""
    rows, in_use = [], 0
    for e in log:
        if e.device == device and e.kind in ("alloc", "free"):
            in_use += e.size if e.kind == "alloc" else -e.size
            rows.append((e.kind == "alloc", e.address, e.size, in_use))
    return rows


@pytest.mark.slow
@needs_tf
def test_keras_fit_is_recorded_exactly_as_tensorflows_own_profile(keras: Any) -> None:
    """Every BFC decision of the fit, in TensorFlow's order, with TensorFlow's own bytes in use after each."""
    log, result, _ = keras
    assert result["mode"] == "cpu" and result["problems"] == [] and result["bfc"] == "true"
    _, columns = xplane.decode_memory_records(Source(result["xplane"]).mapped())
    records = columns.sorted_by_time()
    ours = _in_use_after_each(log, "CPU:0")
    assert len(records) > 1000
    seeded = len(ours) - len(records)  # allocations made before the profile started, freed during it
    untracked = log.devices[log.device_index("CPU:0")].options.get("untracked_bytes_in_use", 0)
    for record, (is_alloc, address, size, in_use) in zip(records, ours[seeded:], strict=True):
        assert (is_alloc, address, size) == (record.is_alloc, record.address, record.size)
        assert in_use + untracked == record.bytes_in_use
    assert log.meta["live"]["framework"] == "tensorflow"


@pytest.mark.slow
@needs_tf
def test_keras_fit_placement_is_recorded_on_the_profiles_clock(keras: Any) -> None:
    log, _, output = keras
    placed = list(log.filter(kind="placement"))
    assert {e.tag for e in placed} >= {"MatMul", "Relu", "BiasAdd", "AssignVariableOp"}
    assert {e.device for e in placed} == {"CPU:0"}
    times = log["time_ns"].tolist()
    assert times == sorted(times)
    memory = [e.time_ns for e in log if e.kind == "alloc"]
    assert memory[0] <= placed[-1].time_ns <= memory[-1] + 10**9  # on the profile's clock, not the epoch's
    assert "Executing op" not in output and ": (MatMul): /job:" not in output  # taken from the output, not shown


@pytest.mark.slow
@needs_tf
def test_a_run_into_oom_records_the_refused_request(tmp_path: Path) -> None:
    """The profile has no event for a refused request; TensorFlow's log line becomes an ``oom`` event, exact."""
    log, result, output = _record(tmp_path / "oom", OOM, TF_CPU_BFC_MEM_LIMIT_IN_MB="48")
    assert "ResourceExhaustedError caught" in output and result["problems"] == []
    (oom,) = log.filter(kind="oom")
    assert f"ran out of memory trying to allocate {oom.size // MiB}.00MiB (rounded to {oom.size})" in output  # shown
    assert (oom.device, oom.requested, oom.tag) == ("CPU:0", oom.size, "Empty")
    made = [e.requested for e in log.filter(kind="alloc") if e.tag and e.tag.startswith("Empty:")]
    assert made == [(5 + i % 3) * MiB for i in range(len(made))] and len(made) >= 6
    assert oom.size == (5 + len(made) % 3) * MiB  # the next tensor of the loop is the one refused
    assert all(e.seq < oom.seq for e in log.filter(kind="alloc"))
    table = oom_table(log)
    assert table["rounded"].tolist() == [oom.size]
    assert int(table["pool_bytes"][0]) <= 48 * MiB
    assert "1 out-of-memory events from TensorFlow's log" in " ".join(log.meta["notes"])


@pytest.mark.slow
@needs_tf
def test_too_late_for_the_cpu_bfc_is_said_with_what_to_do(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import warnings
        import tensorflow as tf
        early = tf.fill([10], 1.0)  # TensorFlow's CPU allocator is made now, without its BFC
        from IPython.core.interactiveshell import InteractiveShell
        InteractiveShell.instance().run_line_magic("load_ext", "gpuviz")  # imports gpuviz.tf
        import gpuviz.tf
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with gpuviz.tf.record(placement=False) as rec:
                later = tf.fill([1000], 2.0)
        print("WARNINGS", len(caught))
        print("PROBLEMS", rec.problems)
        print("EVENTS", len(rec.log.filter(kind="alloc")))
    """)
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "EVENTS 0" in done.stdout and "WARNINGS 2" in done.stdout  # at the start, then the empty recording
    assert "TensorFlow was imported before gpuviz.tf set TF_CPU_ALLOCATOR_USE_BFC=true" in done.stdout
    assert "the recording holds no memory events" in done.stdout
    assert "import gpuviz.tf (or run %load_ext gpuviz) before tensorflow" in done.stdout
    assert "%load_ext gpuviz: TensorFlow was imported before gpuviz.tf set TF_CPU_ALLOCATOR_USE_BFC" in done.stderr


@pytest.mark.slow
@needs_tf
def test_tf_cell_in_an_executed_notebook_shows_and_saves_the_fit(tmp_path: Path) -> None:
    from nbclient import NotebookClient

    book = nbformat.v4.new_notebook()
    book.cells = [
        nbformat.v4.new_code_cell("%load_ext gpuviz"),
        nbformat.v4.new_code_cell("import tensorflow as tf"),
        nbformat.v4.new_code_cell("%%gpuviz --tf --save keras.arrow\n" + KERAS_FIT),
        nbformat.v4.new_code_cell("import gpuviz\nlen(gpuviz.load('keras.arrow').filter(kind='placement')) > 0"),
    ]
    client = NotebookClient(book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=_env())
    errors = [o for cell in book.cells for o in cell.outputs if o.output_type == "error"]
    assert errors == []
    shown = [o for o in book.cells[2].outputs if o.output_type == "display_data"]
    assert len(shown) == 1 and "%%gpuviz --tf (cpu)" in json.dumps(shown[0]["data"])
    assert book.cells[3].outputs[0]["data"]["text/plain"] == "True"
    log = gpuviz.load(tmp_path / "keras.arrow")
    assert len(log.filter(kind="alloc")) > 1000 and log.meta["live"]["problems"] == []


def test_a_framework_flag_that_is_not_installed_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    ip = InteractiveShell.instance()
    if "GpuvizMagics" not in ip.magics_manager.registry:
        ip.run_line_magic("load_ext", "gpuviz")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("tensorflow", "jax")
                        else real(name, *a))  # fmt: skip
    with pytest.raises(UsageError, match=r"--tf needs TensorFlow, which is not installed here: pip install "
                       r"'gpuviz\[tensorflow\]'"):  # fmt: skip
        ip.run_cell_magic("gpuviz", "--tf", "x = 1")
    with pytest.raises(UsageError, match=r"--jax needs JAX, which is not installed here: pip install 'gpuviz\[jax\]'"):
        ip.run_cell_magic("gpuviz", "--jax", "x = 1")
    with pytest.raises(UsageError, match="not allowed with argument"):
        ip.run_cell_magic("gpuviz", "--tf --jax", "x = 1")
    assert "x" not in ip.user_ns  # the cell did not run
