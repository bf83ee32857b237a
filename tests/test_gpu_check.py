"""The GPU check script (.ci/gpu-check): its dry run runs every step on the simulated device."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement

from gpuviz.base.native import MODULES

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

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
    sources = (p.read_text(encoding="utf-8") for p in (ROOT / "csrc").glob("*/*.c"))
    native = sum(len(re.findall(r"PyMODINIT_FUNC\s+PyInit_", text)) for text in sources)
    assert rows["install: native modules loaded"]["value"] == native == len(MODULES)  # every C module gpuviz has
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


def load_gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / ".ci" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_wheel(folder: Path, name: str, requires: list[str], size: int = 0) -> None:
    stem = f"{name.replace('-', '_')}-1.0"
    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as archive:
        metadata = "".join(f"Requires-Dist: {r}\n" for r in requires)
        archive.writestr(f"{stem}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\n{metadata}")
        archive.writestr("padding", os.urandom(size))


def test_prepare_follows_requirements_the_gpu_machine_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check = load_gpu_check()
    # a fake index: what each downloaded wheel requires (anything else requires nothing)
    index = {
        "plotly": ["narwhals>=1.15.1", "packaging", "kaleido>=1; extra == 'kaleido'"],
        "ipython": [
            "jedi>=0.18",
            "colorama; sys_platform == 'win32'",
            "typing-extensions>=4.6; python_version < '3.12'",
        ],
        "jedi": ["parso<0.9,>=0.8", "psutil>=7"],
        "cupti-python": ["nvidia-cuda-cupti~=13.0", "pyelftools", "never-followed"],
    }
    asked: list[list[str]] = []

    def download(requirements: list[str], folder: Path) -> None:
        asked.append(requirements)
        for text in requirements:
            name = check._normal(Requirement(text).name)
            fake_wheel(folder, name, index.get(name, []))

    monkeypatch.setattr(check, "_download", download)
    monkeypatch.setattr(check, "tree_bytes", lambda: 1000)
    check.prepare(tmp_path / "wheels")
    fetched = {check._normal(Requirement(text).name) for level in asked for text in level}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    direct = {check._normal(Requirement(t).name) for t in project["project"]["dependencies"]} - check.PRESENT
    assert {"jedi", "parso", "pyelftools", "cupti-python", "setuptools"} | direct <= fetched
    # not fetched: what the image has (unless as a fallback), other platforms' and extras' needs,
    # and what CUPTI's bindings need (installed without dependencies)
    assert not fetched & {"packaging", "colorama", "kaleido", "never-followed", "nvidia-cuda-cupti"}
    manifest = json.loads((tmp_path / "wheels" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["fallbacks"] == ["narwhals>=1.15.1", "psutil>=7"]  # newer wheels of image packages, just in case
    assert manifest["check_wheels"] == ["cupti-python", "pyelftools"]
    assert manifest["tree_bytes"] == 1000
    assert sorted(manifest["wheels"]) == sorted(p.name for p in (tmp_path / "wheels").glob("*.whl"))


def test_prepare_refuses_more_than_a_lease_carries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check = load_gpu_check()
    monkeypatch.setattr(check, "_download", lambda reqs, folder: [fake_wheel(folder, check._normal(Requirement(t).name),
                                                                             [], 1 << 20) for t in reqs])  # fmt: skip
    monkeypatch.setattr(check, "tree_bytes", lambda: 60 << 20)
    with pytest.raises(SystemExit, match=r"gpu-check prepare: \d+\.\d MiB is over the 64 MiB limit"):
        check.prepare(tmp_path / "wheels")
