"""Each C extension against its Python twin, on the workload it exists for.

Run by hand:  .venv/bin/python -m benchmarks.bench_native [--repeats 3] [--only NAME ...] [--json PATH]

For every workload in ``benchmarks/native/<layer>.py`` (``WORKLOADS``: extension name -> a
function that prepares the work and returns the callable to time), two fresh interpreters run
it: one as gpuviz is installed, one with ``GPUVIZ_NATIVE_SKIP=<extension>`` (the registry then
treats that extension as not built and gpuviz runs its Python twin), alternating, ``--repeats``
times each; the best of each is reported (seconds). The ratio Python/C is what users gain from the C: where it is
within noise, or only a synthetic worst case gains, the C goes (``docs/architecture.md`` records
each decision).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable

from benchmarks._results import Results, add_json_option

LAYERS = ("log", "capture", "importers", "analysis", "scenarios")

Workload = Callable[[], Callable[[], object]]


def workloads() -> dict[str, tuple[str, Workload]]:
    """extension name -> (what the workload is, its set-up function), over every layer's file."""
    found: dict[str, tuple[str, Workload]] = {}
    for layer in LAYERS:
        module = importlib.import_module(f"benchmarks.native.{layer}")
        for name, (what, setup) in module.WORKLOADS.items():
            found[name] = (what, setup)
    return found


def time_one(name: str) -> float:
    """Wall time (seconds) of one run of ``name``'s workload in this process (its set-up not timed)."""
    _, setup = workloads()[name]
    work = setup()
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def run_child(name: str, *, python_twin: bool) -> float:
    env = dict(os.environ)
    env.pop("GPUVIZ_NATIVE", None)
    if python_twin:
        env["GPUVIZ_NATIVE_SKIP"] = name
    else:
        env.pop("GPUVIZ_NATIVE_SKIP", None)
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "benchmarks.bench_native", "--child", name],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{name} ({'Python' if python_twin else 'C'}) failed:\n{done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None, metavar="NAME", help="extensions to run (default: all)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.child:
        warnings.simplefilter("ignore")
        print(json.dumps({"seconds": time_one(args.child)}))
        return
    results = Results("native", "Each C extension against its Python twin (best of repeats, fresh interpreters)",
                      vars(args))  # fmt: skip
    for name, (what, _) in workloads().items():
        if args.only and name not in args.only and name.rsplit(".", 1)[-1] not in args.only:
            continue
        # C and Python alternate, one fresh interpreter per run, so that a change in the machine's
        # load falls on both alike; the best of each
        c = py = float("inf")
        for _ in range(args.repeats):
            c = min(c, run_child(name, python_twin=False))
            py = min(py, run_child(name, python_twin=True))
        results.add(f"{name}: {what}, C", c, "s")
        results.add(f"{name}: {what}, Python", py, "s")
        results.add(f"{name}: Python / C", py / c if c > 0 else float("inf"), "x")
        print(f"{name}: C {c:.4g} s, Python {py:.4g} s, {py / c:.3g}x", flush=True)
    results.write(args.json)


if __name__ == "__main__":
    main()
