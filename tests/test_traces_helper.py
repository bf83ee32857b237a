"""tests/traces.py, the one way tests reach the real third-party traces, in a pytest run of its own:
unset, every such test is skipped with the one reason and nothing fails to collect; set, the
expected files pass, a missing one and one the test does not list fail, naming file and folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from traces import REASON

TESTS = Path(__file__).resolve().parent
MODULE = """
from traces import needs_traces, trace_files, trace_path
import pytest

@pytest.mark.parametrize("path", trace_files(["a.txt", "b.txt"], pattern="*.txt"))
def test_each(path):
    assert path.read_text() == "real"

@pytest.mark.parametrize("path", trace_files(["a.txt"]))
def test_listed_only(path):
    assert path.name == "a.txt"

def test_one():
    assert trace_path("a.txt").read_text() == "real"

def test_missing():
    trace_path("c.txt")

@needs_traces
def test_marked():
    pass
"""


def _run(tmp_path: Path, traces: Path | None) -> str:
    (tmp_path / "test_real.py").write_text(MODULE)
    env = {k: v for k, v in os.environ.items() if k != "GPUVIZ_TEST_TRACES"}
    if traces is not None:
        env["GPUVIZ_TEST_TRACES"] = str(traces)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "traces", "-rA", "-q", "-p", "no:cacheprovider", "test_real.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return done.stdout


def test_unset_every_test_of_the_real_traces_is_skipped_with_one_reason(tmp_path: Path) -> None:
    out = _run(tmp_path, None)
    assert "5 skipped" in out and "error" not in out and "passed" not in out, out
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED [")]
    assert all(line.endswith(f": {REASON}") for line in skips), out  # one reason, for all five
    assert sum(int(line.split("[")[1].split("]")[0]) for line in skips) == 5


def test_set_a_missing_or_unlisted_file_fails_naming_it_and_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "real"
    folder.mkdir()
    for name in ("a.txt", "d.txt"):  # b.txt missing, d.txt not listed
        (folder / name).write_text("real")
    out = _run(tmp_path, folder)
    assert "PASSED test_real.py::test_each[a.txt]" in out, out
    assert f"b.txt is not in {folder} (the folder GPUVIZ_TEST_TRACES names)" in out
    assert f"d.txt in {folder} matches '*.txt' but is not in the test's list of expected files: add it" in out
    assert "PASSED test_real.py::test_listed_only[a.txt]" in out  # no pattern: other files are no concern
    assert "PASSED test_real.py::test_one" in out and "PASSED test_real.py::test_marked" in out
    assert f"c.txt is not in {folder}" in out
    assert "4 passed" in out and "skipped" not in out, out
    assert out.count("FAILED") + out.count("ERROR") == 2 * 3, out  # each failure: in the summary and the short list


def test_an_empty_expected_list_is_refused() -> None:
    from traces import trace_files

    with pytest.raises(ValueError, match="the list of files the test expects"):
        trace_files([])
