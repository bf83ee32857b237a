"""benchmarks/write_results.py renders benchmarks/RESULTS.md from the benchmarks' JSON output."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
WRITER = ROOT / "benchmarks" / "write_results.py"

CORE = {
    "benchmark": "core",
    "description": "Allocator speed with recording on/off.",
    "date": "2026-11-28T02:40:00Z",
    "machine": {
        "cpu": "AMD EPYC",
        "cores": 2,
        "memory_bytes": 25276518400,
        "python": "3.11.7",
        "os": "Linux-6.18-x86_64-with-glibc2.36",
    },
    "load": {"before": [3.34, 2.67, 1.23], "after": [4.5, 2.9, 1.3]},
    "parameters": {"pairs": 5000, "repeats": 3},
    "results": [
        {"name": "allocate+free pair, native core, on", "value": 0.3794, "unit": "us", "note": "median 0.644 us"},
        {"name": "recording rate", "value": 7275000.0, "unit": "events/s"},
        {"name": "events", "value": 69510, "unit": ""},
    ],
}
# the smallest file the schema allows (a benchmark written by someone else, say)
STARTUP = {
    "benchmark": "startup",
    "description": "import gpuviz against import numpy.",
    "results": [{"name": "import gpuviz", "value": 0.25, "unit": "s"}, {"name": "a | b", "value": "ok", "unit": ""}],
}

EXPECTED = """\
# Benchmark results

Written by `benchmarks/write_results.py` from the JSON each benchmark writes with `--json` \
(`benchmarks/results/*.json`); do not edit by hand. Latest numbers only: the history is git's.
Each section states when and where it ran and the machine's load average before and after: \
timings on a loaded, shared machine are upper bounds. Units: s seconds, ms milliseconds, \
us microseconds, ns nanoseconds; MB = 10^6 bytes, MiB = 2^20 bytes; x a ratio.

No GPU section: the GPU checks (`.ci/gpu-check run`, docs/gpu-checks.md) have not run on a GPU \
for these results.

## core

Allocator speed with recording on/off.

- Date: 2026-11-28T02:40:00Z
- Machine: AMD EPYC, 2 cores, 23.5 GiB memory, Python 3.11.7, Linux-6.18-x86_64-with-glibc2.36
- Load average (1 / 5 / 15 min): before 3.34 / 2.67 / 1.23, after 4.50 / 2.90 / 1.30
- Parameters: `pairs=5000`, `repeats=3`

| Measurement | Value | Unit | Note |
| --- | ---: | --- | --- |
| allocate+free pair, native core, on | 0.3794 | us | median 0.644 us |
| recording rate | 7,275,000 | events/s |  |
| events | 69,510 |  |  |

## startup

import gpuviz against import numpy.

- Date: not recorded
- Machine: not recorded
- Load average: not recorded

| Measurement | Value | Unit |
| --- | ---: | --- |
| import gpuviz | 0.25 | s |
| a \\| b | ok |  |
"""


def write(folder: Path, name: str, document: object) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(json.dumps(document), encoding="utf-8")


def run_writer(folder: Path, out: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(WRITER), "--results", str(folder), "--out", str(out)]
    return subprocess.run(command, capture_output=True, text=True, cwd=folder.parent)


def test_the_writer_renders_every_results_file_as_a_section(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    write(folder, "startup.json", STARTUP)
    write(folder, "core.json", CORE)
    out = tmp_path / "RESULTS.md"
    done = run_writer(folder, out)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{out}: 2 benchmark(s)\n"
    assert out.read_text(encoding="utf-8") == EXPECTED


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"description": "d", "results": []}, "'benchmark' is missing or not a str"),
        ({"benchmark": "b", "description": "d", "results": [{"name": "x", "value": 1}]},
         "results[0] needs 'name', 'value' and 'unit'"),
        ({"benchmark": "b", "description": "d", "results": [{"name": "x", "value": [1], "unit": "s"}]},
         "results[0] (x): value must be a number or a string"),
        ([1, 2], "expected a JSON object, got list"),
    ],
)  # fmt: skip
def test_a_file_outside_the_schema_is_named_and_nothing_is_written(
    tmp_path: Path, document: object, problem: str
) -> None:
    folder = tmp_path / "results"
    write(folder, "core.json", CORE)
    write(folder, "bad.json", document)
    out = tmp_path / "RESULTS.md"
    out.write_text("before\n", encoding="utf-8")
    done = run_writer(folder, out)
    assert done.returncode == 1
    assert done.stderr == f"write_results: {folder / 'bad.json'}: {problem}\n"
    assert out.read_text(encoding="utf-8") == "before\n"


def test_two_files_of_one_benchmark_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    write(folder, "a.json", CORE)
    write(folder, "b.json", CORE)
    done = run_writer(folder, tmp_path / "RESULTS.md")
    assert done.returncode == 1
    assert done.stderr == f"write_results: {folder / 'b.json'}: benchmark 'core' is also in {folder / 'a.json'}\n"


def test_an_empty_folder_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    done = run_writer(tmp_path / "results", tmp_path / "RESULTS.md")
    assert done.returncode == 1
    assert "no results JSON in" in done.stderr
    assert not (tmp_path / "RESULTS.md").exists()


def load_helper() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_results", ROOT / "benchmarks" / "_results.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_benchmarks_json_records_date_machine_and_load(tmp_path: Path) -> None:
    helper = load_helper()
    results = helper.Results("demo", "A demonstration.", {"events": 1000, "json": tmp_path / "x.json"})
    results.add("open", 0.123456, "s")
    results.add("events", 1000, "")
    results.write(tmp_path / "results" / "demo.json")
    document = json.loads((tmp_path / "results" / "demo.json").read_text(encoding="utf-8"))
    assert document["benchmark"] == "demo" and document["parameters"] == {"events": 1000}
    assert document["results"] == [{"name": "open", "value": 0.1235, "unit": "s"},
                                   {"name": "events", "value": 1000, "unit": ""}]  # fmt: skip
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", document["date"])
    assert set(document["machine"]) == {"cpu", "cores", "memory_bytes", "python", "os"}
    assert document["machine"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert len(document["load"]["before"]) == len(document["load"]["after"]) == 3
    out = tmp_path / "RESULTS.md"
    assert run_writer(tmp_path / "results", out).returncode == 0
    text = out.read_text(encoding="utf-8")
    assert f"- Date: {document['date']}\n" in text
    assert f", Python {document['machine']['python']}, " in text
    before = " / ".join(f"{x:.2f}" for x in document["load"]["before"])
    assert f"- Load average (1 / 5 / 15 min): before {before}, after " in text
    assert "| open | 0.1235 | s |\n| events | 1,000 |  |\n" in text
