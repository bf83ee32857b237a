"""The code stays ruff- and mypy-clean, and the layering of design.md holds."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = BIN / tool
    if not exe.exists():
        found = shutil.which(tool)
        if found is None:
            pytest.fail(f"{tool} is not installed; install the project with its [test] extra")
        exe = Path(found)
    return subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff() -> None:
    proc = run("ruff", "check", "gpuviz", "tests", "benchmarks", "setup.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy() -> None:
    proc = run("mypy")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_layering_contracts() -> None:
    proc = run("lint-imports")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Contracts: 5 kept, 0 broken" in proc.stdout


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = [line for line in readme.splitlines() if line.startswith("python3 -m venv .venv")]
    assert len(commands) == 2, "the README opens with two commands: the demo and the tests"
    ci = (ROOT / ".ci" / "run").read_text().rstrip().splitlines()
    assert ci[-1] == commands[1]
