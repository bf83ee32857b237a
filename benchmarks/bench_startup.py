"""Start-up benchmark: ``import gpuviz`` against ``import numpy`` in the same run, ``import
gpuviz.capture`` and ``gpuviz --help``, each in fresh interpreters.

Run by hand:  .venv/bin/python benchmarks/bench_startup.py [--runs 15]
Prints one JSON object on stdout: for each case the median wall time of a fresh interpreter
running it (seconds, ``*_s``), the same less a bare interpreter's start (``*_over_python_s``),
and the import's own time from ``-X importtime`` (``*_import_s``); with the date, the machine
and its load. Target: ``import gpuviz`` <= 0.3 s on a quiet machine, ``gpuviz --help`` as quick.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

CASES = {
    "python": "pass",
    "import_numpy": "import numpy",
    "import_gpuviz": "import gpuviz",
    "import_gpuviz_capture": "import gpuviz.capture",
    "gpuviz_help": "import sys; sys.argv = ['gpuviz', '--help']; from gpuviz.frontends.cli import main; main()",
}
IMPORTED = {"import_numpy": "numpy", "import_gpuviz": "gpuviz", "import_gpuviz_capture": "gpuviz.capture"}


def wall(code: str) -> float:
    """Seconds a fresh interpreter takes to run ``code`` and exit."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def import_time(code: str, module: str) -> float:
    """The cumulative import time of ``module`` (seconds) that ``-X importtime`` reports."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], check=True, capture_output=True, text=True)
    for line in proc.stderr.splitlines():
        parts = [part.strip() for part in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2] == module:
            return int(parts[1]) / 1e6
    raise RuntimeError(f"-X importtime did not report {module}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="fresh interpreters per case (median reported)")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    times: dict[str, list[float]] = {name: [] for name in CASES}
    imports: dict[str, list[float]] = {name: [] for name in IMPORTED}
    for _ in range(args.runs):  # the cases alternate, so that a busy minute weighs on each alike
        for name, code in CASES.items():
            times[name].append(wall(code))
        for name, module in IMPORTED.items():
            imports[name].append(import_time(CASES[name], module))
    medians = {name: statistics.median(values) for name, values in times.items()}
    results: dict[str, object] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()})",
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "runs": args.runs,
    }
    for name, median in medians.items():
        results[f"{name}_s"] = round(median, 4)
        if name != "python":
            results[f"{name}_over_python_s"] = round(median - medians["python"], 4)
    for name, values in imports.items():
        results[f"{name}_import_s"] = round(statistics.median(values), 4)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
