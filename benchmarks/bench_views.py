"""View benchmarks: time to build each view, report size, and Chromium load time.

Run by hand:  .venv/bin/python benchmarks/bench_views.py [--events 10000 1000000 10000000]
Targets (issue 5): views of a 1M-event log in <= 1 s each; the report of a 1M-event log
<= 10 MB, loaded and drawn by Chromium in <= 3 s.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

from benchmarks._results import Results, add_json_option
from gpuviz import EventLog, SimUpstream
from gpuviz.analysis.diagnosis import diagnose
from gpuviz.analysis.profile import profile
from gpuviz.analysis.tables import placement_table
from gpuviz.analysis.timeline import timeline_series
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.capture.events import record_placement, record_transfer
from gpuviz.log.schema import Direction
from gpuviz.views.fragmentation import fragmentation_map
from gpuviz.views.report import report_html
from gpuviz.views.result import result_json
from gpuviz.views.tables import placement_html, summary_html
from gpuviz.views.timeline import timeline


def build_log(n_events: int, seed: int = 0) -> EventLog:
    """A training-like log: ~1000 live buffers, mixed sizes, an op and a copy every few steps."""
    rng = random.Random(seed)
    log = EventLog()
    alloc = ReferenceBFCAllocator(SimUpstream("64GiB"), growth=True, log=log)
    cpu = log.add_device("CPU:0")
    live = [alloc.allocate(256, tag="init") for _ in range(1000)]
    tags = [f"layer{i}:float32[{1 << i}]" for i in range(12)]
    step = 0
    while len(log) < n_events:
        victim = rng.randrange(len(live))
        alloc.free(live[victim])
        live[victim] = alloc.allocate(int(2 ** rng.uniform(6, 24)), tag=tags[step % len(tags)])
        step += 1
        if step % 8 == 0:
            now = time.perf_counter_ns()
            op = f"Op{step % 5}"
            record_placement(log, op=op, device=0, requested=-1, soft=False, start_ns=now, duration_ns=1000)
        if step % 16 == 0:
            now = time.perf_counter_ns()
            record_transfer(log, direction=Direction.H2D, source=cpu, destination=0, nbytes=1 << 20, start_ns=now,
                            duration_ns=50_000, tag=f"Op{step % 5}")  # fmt: skip
        if step % 5000 == 0:
            log.mark(f"step {step // 5000}")
    log.flush()
    return log


TIMES: list[tuple[str, float]] = []  # (label, seconds) of every timed() call, in order


def timed(label: str, func, *args, **kwargs):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = func(*args, **kwargs)
    seconds = time.perf_counter() - start
    TIMES.append((label, seconds))
    print(f"  {label:<40} {seconds:8.3f} s")
    return result


def chromium_load(path: Path) -> float | None:
    if not os.path.exists("/usr/bin/chromium"):
        return None
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        start = time.perf_counter()
        page.goto(path.as_uri())
        page.wait_for_selector("#map0 .main-svg")
        page.wait_for_selector("#timeline0 .main-svg")
        elapsed = time.perf_counter() - start
        browser.close()
        return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, nargs="+", default=[10_000, 1_000_000])
    add_json_option(parser)
    args = parser.parse_args()
    results = Results("views", "Views: time to build each view of a log, report size, Chromium load time.", vars(args))
    for n in args.events:
        print(f"log of {n} events")
        TIMES.clear()
        log = timed("record the log", build_log, n)
        series = timed("timeline series", timeline_series, log, "GPU:0")
        timed("timeline figure (2000 points)", timeline, series)
        from gpuviz.analysis.replay import replay

        heap = replay(log)
        state = timed("replay to the last event (first query)", heap.state_at, -1, device="GPU:0")
        timed("fragmentation map figure", fragmentation_map, state)
        table = timed("placement table", placement_table, log)
        timed("placement HTML", placement_html, table)
        diagnosis = timed("diagnosis (summary)", diagnose, log)
        timed("summary HTML", summary_html, diagnosis)
        p = timed("profile (all of the above, shared)", profile, log)
        document = timed("report HTML (40 scrub frames)", report_html, p)
        text = timed("result JSON (.gpuviz.json, notebook output)", result_json, p)
        print(f"  {'result size':<40} {len(text) / 1e6:8.2f} MB")
        for label, seconds in TIMES:
            results.add(f"{n:,} events: {label}", seconds, "s")
        results.add(f"{n:,} events: result JSON size", len(text) / 1e6, "MB")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "report.html"
            path.write_text(document, encoding="utf-8")
            print(f"  {'report size':<40} {path.stat().st_size / 1e6:8.2f} MB")
            results.add(f"{n:,} events: report size", path.stat().st_size / 1e6, "MB")
            seconds = chromium_load(path)
            if seconds is not None:
                print(f"  {'Chromium: load and draw the report':<40} {seconds:8.3f} s")
                results.add(f"{n:,} events: Chromium loads and draws the report", seconds, "s")
    results.write(args.json)


if __name__ == "__main__":
    main()
