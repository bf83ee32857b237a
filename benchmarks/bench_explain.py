"""The answer in words and the replayed advice on the real traces: their time beside a plain read.

Run by hand:  GPUVIZ_TEST_TRACES=../shared/data/traces .venv/bin/python -m benchmarks.bench_explain [--json PATH]

For each real PyTorch snapshot, profiler trace and XPlane in ``GPUVIZ_TEST_TRACES``, in one
process: ``gpuviz.load`` (the plain read), ``gpuviz.explain`` (call sites, categories and
the sentence, on the loaded log), ``gpuviz.views.text.summary_text`` (what ``gpuviz summary``
prints after the read) and ``gpuviz.advise`` (the whole grid of replays). The best of
``--repeats`` wall-clock seconds each; ``explain`` is timed on a fresh load each time (its
tables are cached per log). ``advise`` is timed twice: on the loaded log (its tables computed,
as inside a report) and as the first thing done after a fresh read (``advise cold``). Target: a
whole advice grid <= 2 s on the largest trace.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

import gpuviz
from benchmarks._results import Results, add_json_option
from gpuviz.views.text import summary_text

PATTERNS = ("pt_snapshot_*.pickle", "pt_profiler_*.json.gz", "*.xplane.pb")


def _best(repeats: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    add_json_option(parser)
    args = parser.parse_args()
    results = Results(
        "explain", "The answer in words and the replayed advice on the real traces, beside a plain read.", vars(args)
    )
    folder = os.environ.get("GPUVIZ_TEST_TRACES")
    if not folder:
        raise SystemExit("set GPUVIZ_TEST_TRACES to the folder of real traces")
    print(f"{'file':58} {'read':>6} {'explain':>8} {'summary':>8} {'advise':>7} {'cold':>6}  events")
    for pattern in PATTERNS:
        for path in sorted(Path(folder).glob(pattern)):
            try:
                log = gpuviz.load(path)
            except gpuviz.LogFormatError as exc:
                print(f"{path.name:58} cannot be read: {str(exc)[:60]}")
                continue
            read = _best(args.repeats, lambda p=path: gpuviz.load(p))  # type: ignore[misc]
            explain = _best(args.repeats, lambda p=path: gpuviz.explain(gpuviz.load(p))) - read  # type: ignore[misc]
            summary = _best(args.repeats, lambda p=path: summary_text(gpuviz.load(p))) - read  # type: ignore[misc]
            results.add(f"{path.name}: read (gpuviz.load)", read, "s", note=f"{len(log):,} events")
            results.add(f"{path.name}: explain after the read", explain, "s")
            results.add(f"{path.name}: summary after the read", summary, "s")
            try:
                advise = _best(args.repeats, lambda lg=log: gpuviz.advise(lg))  # type: ignore[misc]
                cold = _best(args.repeats, lambda p=path: gpuviz.advise(gpuviz.load(p))) - read  # type: ignore[misc]
                advised = f"{advise:7.2f} {cold:6.2f}"
                results.add(f"{path.name}: advise (the whole grid of replays)", advise, "s")
                results.add(f"{path.name}: advise right after a fresh read", cold, "s")
            except ValueError:
                advised = f"{'-':>7} {'-':>6}"
            print(f"{path.name:58} {read:6.2f} {explain:8.2f} {summary:8.2f} {advised}  {len(log)}")
    results.write(args.json)


if __name__ == "__main__":
    main()
