"""Write ``benchmarks/RESULTS.md`` from the benchmarks' own JSON output.

    python -m benchmarks.write_results                 # render benchmarks/results/*.json
    python -m benchmarks.write_results --run           # run the quick set first, then render
    python -m benchmarks.write_results --run core whatif
    python -m benchmarks.write_results --results DIR --out PATH

Every ``benchmarks/results/*.json`` (the folder is not committed) becomes one section of
RESULTS.md, in file-name order: any file in the schema of ``benchmarks/_results.py`` counts,
so a new benchmark only has to write one (``--json PATH``). RESULTS.md holds the latest
numbers only: a rerun overwrites its file, and the history is git's.

``--run`` runs benchmarks at the small sizes of ``QUICK`` (a shared machine: each run's load
average is recorded beside its numbers), each writing ``results/<name>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
OUT = HERE / "RESULTS.md"

# name -> (module, arguments): small sizes, minutes in all on a 2-core machine
QUICK: dict[str, tuple[str, list[str]]] = {
    "core": ("benchmarks.bench_core", ["--pairs", "50000", "--events", "200000", "--repeats", "5"]),
    "core-busy": ("benchmarks.bench_core", ["--pairs", "50000", "--repeats", "5", "--pairs-only", "--busy"]),
    "hash": ("benchmarks.bench_hash", []),
    "whatif": ("benchmarks.bench_whatif", ["--requests", "100000"]),
    "runtime": ("benchmarks.bench_runtime", []),
    "logfile": ("benchmarks.bench_logfile", ["--events", "200000", "--repeat", "2"]),
    "views": ("benchmarks.bench_views", ["--events", "10000"]),
    "startup": ("benchmarks.bench_startup", ["--runs", "7"]),
    # on the real traces of GPUVIZ_TEST_TRACES (each fails with a message without it)
    "explain": ("benchmarks.bench_explain", ["--repeats", "1"]),
    "real": ("benchmarks.bench_real", ["--entries", "100000"]),
    # the formats whose inputs are synthetic or real traces that open (see bench_import.py)
    # each C extension against its Python twin (benchmarks/native/<layer>.py)
    "native": ("benchmarks.bench_native", ["--repeats", "3"]),
    "import": (
        "benchmarks.bench_import",
        [
            "pytorch-snapshot",
            "pytorch-memory-timeline",
            "rmm-csv",
            "tf-placement",
            "xplane",
            "xprof-memory-profile",
            "--entries",
            "20000",
            "--repeat",
            "1",
        ],
    ),
}


class ResultsError(ValueError):
    """A results file that is not in the schema (the message names the file and the problem)."""


def run_benchmarks(names: list[str], results: Path) -> list[str]:
    """Run each named benchmark of ``QUICK``; each writes ``results/<name>.json``. The names of
    those that failed (the others still run)."""
    unknown = [name for name in names if name not in QUICK]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(QUICK)}")
    failed: list[str] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for name in names:
        module, arguments = QUICK[name]
        command = [sys.executable, "-m", module, *arguments, "--json", str(results / f"{name}.json")]
        print("$", " ".join(command[1:]), flush=True)
        if subprocess.run(command, cwd=ROOT, env=env).returncode != 0:
            failed.append(name)
    return failed


def read_results(folder: Path) -> list[dict[str, Any]]:
    """Every ``*.json`` in ``folder``, checked against the schema, in file-name order."""
    documents: list[dict[str, Any]] = []
    seen: dict[str, Path] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ResultsError(f"{path}: not JSON: {error}") from None
        _check(path, document)
        name = document["benchmark"]
        if name in seen:
            raise ResultsError(f"{path}: benchmark {name!r} is also in {seen[name]}")
        seen[name] = path
        documents.append(document)
    return documents


def _check(path: Path, document: Any) -> None:
    if not isinstance(document, dict):
        raise ResultsError(f"{path}: expected a JSON object, got {type(document).__name__}")
    for key, kind in (("benchmark", str), ("description", str), ("results", list)):
        if not isinstance(document.get(key), kind):
            raise ResultsError(f"{path}: {key!r} is missing or not a {kind.__name__}")
    for i, row in enumerate(document["results"]):
        if not isinstance(row, dict) or not {"name", "value", "unit"} <= row.keys():
            raise ResultsError(f"{path}: results[{i}] needs 'name', 'value' and 'unit'")
        if isinstance(row["value"], bool) or not isinstance(row["value"], (int, float, str)):
            raise ResultsError(f"{path}: results[{i}] ({row['name']}): value must be a number or a string")


def format_value(value: float | int | str) -> str:
    """A value as the table shows it: integers with thousands separators, 4 significant digits."""
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return f"{value:,}"
    if value != value:  # NaN
        return "nan"
    if abs(value) >= 1e4:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def format_machine(machine: dict[str, Any]) -> str:
    """``cpu, N cores, X GiB memory, Python V, OS`` and then any other facts (a GPU, say)."""
    words = []
    if machine.get("cpu"):
        words.append(str(machine["cpu"]))
    if machine.get("cores"):
        words.append(f"{machine['cores']} cores")
    if machine.get("memory_bytes"):
        words.append(f"{machine['memory_bytes'] / 2**30:.1f} GiB memory")
    if machine.get("python"):
        words.append(f"Python {machine['python']}")
    if machine.get("os"):
        words.append(str(machine["os"]))
    known = {"cpu", "cores", "memory_bytes", "python", "os"}
    words.extend(f"{key} {value}" for key, value in machine.items() if key not in known)
    return ", ".join(words)


def _load(values: Any) -> str:
    return " / ".join(f"{float(x):.2f}" for x in values) if isinstance(values, list) else "not recorded"


def render_section(document: dict[str, Any]) -> str:
    lines = [f"## {document['benchmark']}", "", document["description"].strip(), ""]
    lines.append(f"- Date: {document.get('date', 'not recorded')}")
    machine = document.get("machine")
    lines.append(f"- Machine: {format_machine(machine) if isinstance(machine, dict) else 'not recorded'}")
    load = document.get("load")
    if isinstance(load, dict):
        lines.append(f"- Load average (1 / 5 / 15 min): before {_load(load.get('before'))},"
                     f" after {_load(load.get('after'))}")  # fmt: skip
    else:
        lines.append("- Load average: not recorded")
    parameters = document.get("parameters")
    if parameters:
        lines.append("- Parameters: " + ", ".join(f"`{k}={v}`" for k, v in parameters.items()))
    lines.append("")
    rows = document["results"]
    if not rows:
        lines.append("No results.")
        return "\n".join(lines) + "\n"
    notes = any(row.get("note") for row in rows)
    lines.append("| Measurement | Value | Unit |" + (" Note |" if notes else ""))
    lines.append("| --- | ---: | --- |" + (" --- |" if notes else ""))
    for row in rows:
        cells = [str(row["name"]), format_value(row["value"]), str(row["unit"])]
        if notes:
            cells.append(str(row.get("note", "")))
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def render(documents: list[dict[str, Any]]) -> str:
    """RESULTS.md: a header, then one section per benchmark."""
    head = [
        "# Benchmark results",
        "",
        "Written by `benchmarks/write_results.py` from the JSON each benchmark writes with `--json`"
        " (`benchmarks/results/*.json`); do not edit by hand. Latest numbers only: the history is git's.",
        "Each section states when and where it ran and the machine's load average before and after:"
        " timings on a loaded, shared machine are upper bounds. Units: s seconds, ms milliseconds,"
        " us microseconds, ns nanoseconds; MB = 10^6 bytes, MiB = 2^20 bytes; x a ratio.",
        "",
    ]
    if not documents:
        head.append("No results yet: run `python -m benchmarks.write_results --run`.")
        return "\n".join(head) + "\n"
    if not any(d["benchmark"] == "gpu-check" for d in documents):
        head += ["No GPU section: the GPU checks (`.ci/gpu-check run`, docs/gpu-checks.md) have not run on a GPU"
                 " for these results.", ""]  # fmt: skip
    return "\n".join(head) + "\n" + "\n".join(render_section(d) for d in documents)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", nargs="*", metavar="NAME", help=f"run these first (none named: {' '.join(QUICK)})")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of results JSON (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=OUT, help="the Markdown to write (default: %(default)s)")
    args = parser.parse_args(argv)
    failed: list[str] = []
    if args.run is not None:
        args.results.mkdir(parents=True, exist_ok=True)
        failed = run_benchmarks(args.run or list(QUICK), args.results)
    try:
        documents = read_results(args.results) if args.results.is_dir() else []
    except ResultsError as error:
        raise SystemExit(f"write_results: {error}") from None
    if not documents:  # never overwrite RESULTS.md with nothing
        raise SystemExit(f"write_results: no results JSON in {args.results} (run with --run, or a benchmark's --json)")
    args.out.write_text(render(documents), encoding="utf-8")
    print(f"{args.out}: {len(documents)} benchmark(s)")
    if failed:  # their sections, if any, are from an earlier run (each section has its date)
        raise SystemExit(f"write_results: failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
