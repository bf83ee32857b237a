"""Start-up benchmark: ``import gpuviz`` against ``import numpy`` in the same run, ``import
gpuviz.capture`` and ``gpuviz --help``, each in fresh interpreters.

Run by hand:  .venv/bin/python -m benchmarks.bench_startup [--runs 15] [--json PATH]
Prints one JSON object (``benchmarks/_results.py``'s schema) on stdout: for each case the median
wall time of a fresh interpreter running it (seconds), the same less a bare interpreter's start,
and the import's own time from ``-X importtime``; with the date, the machine and its load.
Target: ``import gpuviz`` <= 0.3 s on a quiet machine, ``gpuviz --help`` as quick.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from benchmarks._results import Results, add_json_option

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
    add_json_option(parser)
    args = parser.parse_args()
    results = Results(
        "startup", "Start-up: a fresh interpreter importing gpuviz, beside numpy; gpuviz --help.", vars(args)
    )
    times: dict[str, list[float]] = {name: [] for name in CASES}
    imports: dict[str, list[float]] = {name: [] for name in IMPORTED}
    for _ in range(args.runs):  # the cases alternate, so that a busy minute weighs on each alike
        for name, code in CASES.items():
            times[name].append(wall(code))
        for name, module in IMPORTED.items():
            imports[name].append(import_time(CASES[name], module))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, median in medians.items():
        results.add(f"{name}: wall time of a fresh interpreter (median of {args.runs})", median, "s")
        if name != "python":
            results.add(f"{name}: over a bare interpreter", median - medians["python"], "s")
    for name, values in imports.items():
        results.add(f"{name}: import time (-X importtime, median)", statistics.median(values), "s")
    print(json.dumps(results.as_dict(), indent=1))
    results.write(args.json)


if __name__ == "__main__":
    main()
