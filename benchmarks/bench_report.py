"""The profile and the HTML report of saved logs, each timed in fresh processes (issue 12's
targets: the whole profile and the report of a 10M-event log <= 3 s each, of a 1M-event log
<= 0.5 s each).

    python benchmarks/bench_report.py LOG.arrow [LOG.arrow ...] [--runs 3]

Each run is a new Python process that loads the log (memory-mapped), computes ``profile`` and
then ``report_html`` of it, so the report's time includes what a fresh ``gpuviz report`` pays
on first use (plotly's validators and template). Prints wall-clock and CPU seconds per run and
the best of the runs, with the load average: this machine's 2 cores are shared. The logs:
``benchmarks/bench_core.py``'s ``build_log`` (or ``bench_views.py``'s), saved with ``log.save``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

_RUN = """
import json, sys, time
import gpuviz
from gpuviz.analysis.profile import profile
from gpuviz.views.report import report_html
log = gpuviz.load(sys.argv[1], progress=False)
wall, cpu = time.perf_counter(), time.process_time()
p = profile(log)
profiled = time.perf_counter() - wall, time.process_time() - cpu
wall, cpu = time.perf_counter(), time.process_time()
document = report_html(p)
reported = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({"events": len(log), "profile": profiled, "report": reported, "bytes": len(document.encode())}))
"""


def run_once(path: Path) -> dict[str, object]:
    """One fresh process's times for ``path``."""
    done = subprocess.run([sys.executable, "-c", _RUN, str(path)], capture_output=True, text=True, check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script too
    from benchmarks._results import Results, add_json_option

    parser = argparse.ArgumentParser()
    parser.add_argument("logs", type=Path, nargs="+", help="saved event logs (.arrow)")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per log")
    add_json_option(parser)
    args = parser.parse_args()
    results = Results("report", "The profile and the HTML report of saved logs, each in a fresh process.", vars(args))
    for path in args.logs:
        best: dict[str, float] = {}
        for attempt in range(args.runs):
            r = run_once(path)
            words = []
            for what in ("profile", "report"):
                wall, cpu = r[what]  # type: ignore[misc]
                best[what] = min(best.get(what, float("inf")), wall)
                words.append(f"{what} {wall:.3f} s [{cpu:.3f} s CPU]")
            size = int(r["bytes"]) / 1e6  # type: ignore[call-overload]
            print(f"{path.name} ({r['events']:,} events) #{attempt + 1}: {', '.join(words)}, report {size:.2f} MB;"
                  f" load average {os.getloadavg()[0]:.2f}")  # fmt: skip
        print(f"{path.name}: best of {args.runs}: profile {best['profile']:.3f} s, report {best['report']:.3f} s")
        events = f"{r['events']:,} events"
        results.add(f"{path.name} ({events}): profile, best of {args.runs}", best["profile"], "s")
        results.add(f"{path.name} ({events}): report HTML, best of {args.runs}", best["report"], "s")
    results.write(args.json)


if __name__ == "__main__":
    main()
