"""Event-log file benchmarks: writing, opening (memory-mapped, verified) and summarising.

Run by hand:  .venv/bin/python benchmarks/bench_logfile.py [--events 10000000] [--log PATH]
Targets (issue 12): opening a 10M-event log <= 1 s and <= 1.2x the file size in memory;
a summary <= 1.5x.

Each measurement runs in a fresh interpreter that imports gpuviz first; "memory" is the
peak resident set (``VmHWM`` of /proc/self/status) minus the resident set after the
imports, so it counts what opening the log costs (file pages mapped and touched count as
resident), not the interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._results import Results, add_json_option

CHILD = """
import json, sys, time

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)

import gpuviz
from gpuviz.views.text import summary_text
path, what = sys.argv[1], sys.argv[2]
base = status("VmRSS")
start = time.perf_counter()
log = gpuviz.load(path)
opened = time.perf_counter() - start
if what == "summary":
    summary_text(log)
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "open_seconds": opened, "extra_bytes": status("VmHWM") - base,
                  "events": len(log), "truncated": log.truncated}))
"""


def measure(path: Path, what: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), what], capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(out.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--log", type=Path, help="the log file to measure (built there when missing)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement (best is reported)")
    add_json_option(parser)
    args = parser.parse_args()
    results = Results("logfile", "Event-log files: opening (memory-mapped, verified) and summarising.", vars(args))
    folder = tempfile.TemporaryDirectory()
    path: Path = args.log or Path(folder.name) / "bench.arrow"
    if not path.exists():
        from benchmarks.bench_views import build_log

        start = time.perf_counter()
        log = build_log(args.events)
        print(f"built a {len(log):,}-event log in {time.perf_counter() - start:.1f} s")
        start = time.perf_counter()
        log.save(path)
        print(f"save (random-access form, checksummed)  {time.perf_counter() - start:.2f} s")
        del log
    size = os.path.getsize(path)
    print(f"file: {size / 2**20:.0f} MiB")
    results.add("file size", size / 2**20, "MiB")
    for what in ("open", "summary"):
        runs = [measure(path, what) for _ in range(args.repeat)]
        best = min(runs, key=lambda r: r["seconds"])
        memory = min(r["extra_bytes"] for r in runs) / size
        print(
            f"{what:<8} {best['seconds']:.2f} s (open {best['open_seconds']:.2f} s)  "
            f"memory {memory:.2f}x the file  [{int(best['events']):,} events, truncated={best['truncated']}]"
        )
        what_ = "open" if what == "open" else "open and summarise"
        results.add(f"{what_} {int(best['events']):,} events (best of {args.repeat})", best["seconds"], "s")
        results.add(f"{what_}: memory over the file's size", memory, "x")
    folder.cleanup()
    results.write(args.json)


if __name__ == "__main__":
    main()
