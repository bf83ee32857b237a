"""The GPU check script (.ci/gpu-check): its dry run runs every step on the simulated device."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = ["environment", "install", "gpu-tests", "torch-snapshot", "torch-bfc", "cupy-bfc", "cupti-transfers"]


def run_check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    out = tmp_path / "gpu-check.json"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
           os.environ.get("PYTHONPATH")]))}  # fmt: skip
    env.pop("OUT", None)
    done = subprocess.run(["bash", str(ROOT / ".ci" / "gpu-check"), "run", "--dry-run", "--out", str(out), *args],
                          capture_output=True, text=True, env=env, cwd=tmp_path)  # fmt: skip
    assert out.exists(), done.stdout + done.stderr
    return done, json.loads(out.read_text(encoding="utf-8"))


@pytest.mark.slow
def test_the_dry_run_runs_every_step_on_the_simulated_device(tmp_path: Path) -> None:
    done, document = run_check(tmp_path)
    steps = document["steps"]
    assert isinstance(steps, list)
    assert {s["name"]: s["status"] for s in steps} == dict.fromkeys(STEPS, "simulated"), done.stdout + done.stderr
    assert done.returncode == 0
    assert (
        done.stdout.splitlines()[-1] == f"gpu-check: 7 of 7 steps simulated; results in {tmp_path / 'gpu-check.json'}"
    )
    # the results file is in the benchmarks' schema: RESULTS.md's GPU section comes from it
    assert document["benchmark"] == "gpu-check" and document["parameters"] == {"dry_run": True}
    rows = {r["name"]: r for r in document["results"]}  # type: ignore[union-attr]
    assert [rows[f"{name}: status"]["value"] for name in STEPS] == ["simulated"] * 7
    native = set(re.findall(r'"(gpuviz(?:\.\w+)*\._\w+)"', (ROOT / "setup.py").read_text(encoding="utf-8")))
    assert rows["install: native modules loaded"]["value"] == len(native) > 0  # every one setup.py builds
    assert rows["gpu-tests: gpu tests failed"]["value"] == 0
    modules = [p for p in (ROOT / "tests").glob("test_*.py") if "@pytest.mark.gpu" in p.read_text(encoding="utf-8")]
    assert rows["gpu-tests: gpu tests passed"]["value"] == 0
    assert rows["gpu-tests: gpu tests skipped"]["value"] >= len(modules) > 0  # each module ran, its tests skipped
    assert rows["cupti-transfers: transfers"]["value"] == 2
    assert (tmp_path / "gpu-check.log").exists()
    results = tmp_path / "results"
    results.mkdir()
    (results / "gpu-check.json").write_text(json.dumps(document), encoding="utf-8")
    rendered = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "write_results.py"), "--results", str(results),
                               "--out", str(tmp_path / "RESULTS.md")], capture_output=True, text=True)  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    text = (tmp_path / "RESULTS.md").read_text(encoding="utf-8")
    assert "## gpu-check\n" in text
    assert "| torch-bfc: status | simulated |  | library entry points on the simulated device == the Python BFC" in text


def test_one_step_can_be_run_alone_and_a_real_run_needs_the_wheels(tmp_path: Path) -> None:
    done, document = run_check(tmp_path, "--only", "cupti-transfers")
    assert done.returncode == 0
    assert [(s["name"], s["status"]) for s in document["steps"]] == [("cupti-transfers", "simulated")]  # type: ignore[union-attr]
    env = {**os.environ, "PYTHON": sys.executable}
    real = subprocess.run(["bash", str(ROOT / ".ci" / "gpu-check"), "run", "--wheels", str(tmp_path / "none"),
                           "--out", str(tmp_path / "real.json")], capture_output=True, text=True, env=env)  # fmt: skip
    assert real.returncode == 2
    assert real.stderr == (f"gpu-check: no {tmp_path / 'none'}/manifest.json: run `.ci/gpu-check prepare` first"
                           " (with network)\n")  # fmt: skip
    assert not (tmp_path / "real.json").exists()
