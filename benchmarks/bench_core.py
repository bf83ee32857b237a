"""Core benchmarks: allocator speed with recording on/off, recording rate, replay, timeline.

Run by hand:  .venv/bin/python benchmarks/bench_core.py [--events 10000000]
Targets (issue 12): <= 1.0 us per allocate+free pair with recording on, >= 2.5x faster than
the Python allocator in the same run; recording costs <= 10 % over recording off; replay
>= 20M events/s; timeline series of a 10M-event log <= 0.5 s.

Every timing prints wall-clock seconds and, in brackets, this process's CPU seconds: on a
shared machine the wall clock includes time spent waiting for a core. Allocate+free pairs
also print the recording thread's own CPU time: the process's includes the file writer's
thread (csrc/log/_batchwriter.c) when recording to a file.
"native core, on, to a file" records into a log that also writes itself to a file as it goes
(``EventLog(path)``, as ``gpuviz demo`` and ``%gpuviz start --run-dir`` do).

``--busy`` runs every measurement beside one CPU-burning process per core (a training job
whose data-loader workers keep every core busy): recording must not rely on an idle core.
``--pairs-only`` measures the allocate+free pairs alone (before/after comparisons).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import numpy as np

from benchmarks._results import Results, add_json_option
from gpuviz import EventLog, SimUpstream, replay, timeline_series
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.capture.native import NativeBFCAllocator, native_core_available


def mixed_workload(n_pairs: int, seed: int = 0) -> list[tuple[int, int]]:
    """(size, victim index) per step: sizes log-uniform 64 B..16 MiB, ~1000 live buffers."""
    rng = random.Random(seed)
    ops = []
    for _ in range(n_pairs):
        size = int(2 ** rng.uniform(6, 24))
        ops.append((size, rng.randrange(1000)))
    return ops


def run_pairs(alloc: ReferenceBFCAllocator, ops: list[tuple[int, int]]) -> tuple[float, float, float]:
    """Wall-clock, process CPU and this thread's CPU seconds for len(ops) allocate+free pairs
    against a steady population of 1000 live buffers."""
    live = [alloc.allocate(256) for _ in range(1000)]
    allocate, free = alloc.allocate, alloc.free
    start, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
    for size, victim in ops:
        free(live[victim])
        live[victim] = allocate(size)
    return time.perf_counter() - start, time.process_time() - cpu, time.thread_time() - own


def bench_pairs(n_pairs: int, repeats: int, out: Results | None = None) -> None:
    """Native core and Python allocator, recording off and on.

    Runs are interleaved and repeated; best and median are printed (the machine is shared).
    Ratios compare runs of this one invocation.
    """
    ops = mixed_workload(n_pairs)
    # mode: (allocator class, record, GPUVIZ_NATIVE for the Python allocator's recorder, to a file)
    modes: dict[str, tuple[type[ReferenceBFCAllocator], bool, str, bool]] = {
        "native core, off": (NativeBFCAllocator, False, "1", False),
        "native core, on": (NativeBFCAllocator, True, "1", False),
        "native core, on, to a file": (NativeBFCAllocator, True, "1", True),
        "Python, off": (ReferenceBFCAllocator, False, "1", False),
        "Python, on (Python recorder)": (ReferenceBFCAllocator, True, "0", False),
    }
    if not native_core_available():
        del modes["native core, off"], modes["native core, on"], modes["native core, on, to a file"]
    results: dict[str, list[float]] = {mode: [] for mode in modes}
    cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    thread: dict[str, list[float]] = {mode: [] for mode in modes}
    waits: dict[str, list[tuple[int, float]]] = {mode: [] for mode in modes}  # flushes that waited for the writer, ms
    # the file mode records with EventLog(path)'s defaults (crash bound: 4096 events, 100 ms) to
    # a file where tempfile puts it
    scratch = tempfile.mkdtemp(prefix="gpuviz-bench-")
    for _ in range(repeats):
        for mode, (cls, record, native, to_file) in modes.items():
            os.environ["GPUVIZ_NATIVE"] = native
            # the previous run's allocator and log are garbage in a reference cycle (the allocator's
            # C core holds its bound methods): collected now, not at a random point of this run
            gc.collect()
            log = EventLog(os.path.join(scratch, "pairs.arrow")) if to_file else None
            alloc = cls(SimUpstream("64GiB"), growth=True, record=record, log=log)
            wall, seconds, own = run_pairs(alloc, ops)
            if log is not None:
                writer = log._recorder.writer if log._recorder is not None else None
                assert writer is not None
                waits[mode].append((writer.waits, writer.waited_ns / 1e6))
                log.close()
            results[mode].append(wall / n_pairs * 1e6)
            cpu[mode].append(seconds / n_pairs * 1e6)
            thread[mode].append(own / n_pairs * 1e6)
    os.environ.pop("GPUVIZ_NATIVE")
    shutil.rmtree(scratch)
    best = {mode: min(times) for mode, times in results.items()}
    median = {mode: statistics.median(times) for mode, times in results.items()}
    for mode in modes:
        print(
            f"allocate+free pair, {mode:30s}: {best[mode]:.3f} us (median {median[mode]:.3f})"
            f" [CPU: best {min(cpu[mode]):.3f} us, median {statistics.median(cpu[mode]):.3f};"
            f" recording thread: best {min(thread[mode]):.3f}, median {statistics.median(thread[mode]):.3f}]"
        )
        if out is not None:
            out.add(f"allocate+free pair, {mode} (best of {repeats})", best[mode], "us",
                        note=f"median {median[mode]:.3f} us")  # fmt: skip
    for kind in ("native core", "Python"):
        if f"{kind}, on" in best or f"{kind}, on (C row writer)" in best:
            on = f"{kind}, on" if f"{kind}, on" in best else f"{kind}, on (C row writer)"
            off = f"{kind}, off"
            own = {mode: statistics.median(thread[mode]) for mode in (on, off)}
            total = {mode: statistics.median(cpu[mode]) for mode in (on, off)}
            if out is not None:
                out.add(f"recording overhead, {kind} (best vs best)", (best[on] / best[off] - 1) * 100, "%")
                out.add(f"recording overhead, {kind} (median vs median)", (median[on] / median[off] - 1) * 100, "%")
                out.add(f"recording overhead, {kind}, recording thread's CPU (medians)",
                        (own[on] / own[off] - 1) * 100, "%")  # fmt: skip
            print(
                f"recording overhead, {kind:12s}: {(best[on] / best[off] - 1) * 100:.1f} %"
                f" (median {(median[on] / median[off] - 1) * 100:.1f} %; CPU medians: recording thread"
                f" {(own[on] / own[off] - 1) * 100:.1f} %, process {(total[on] / total[off] - 1) * 100:.1f} %)"
            )
    if "native core, on, to a file" in best:
        on, file = best["native core, on"], best["native core, on, to a file"]
        if out is not None:
            off = "native core, off"
            out.add("recording overhead to a file, native core (best vs best)", (file / best[off] - 1) * 100, "%")
            out.add("recording overhead to a file, native core (median vs median)",
                    (median["native core, on, to a file"] / median[off] - 1) * 100, "%")  # fmt: skip
        print(
            f"recording to a file instead of in memory: +{(file - on) * 1e3:.0f} ns per pair ({file / on:.2f}x);"
            f" recording over off: +{(file / best['native core, off'] - 1) * 100:.1f} %;"
            " flushes that waited for the writer, per run (how many, ms in all):"
            f" {[(count, round(ms, 2)) for count, ms in waits['native core, on, to a file']]}"
        )
    if "native core, on" in best:
        reference = "Python, on (Python recorder)"
        if out is not None:
            out.add("native core vs Python allocator, recording on", best[reference] / best["native core, on"], "x")
        print(
            f"native core vs Python allocator, recording on: {best[reference] / best['native core, on']:.1f}x faster"
            f" (median {median[reference] / median['native core, on']:.1f}x)"
        )


@contextlib.contextmanager
def busy_cores(busy: bool) -> Iterator[int]:
    """With ``busy``: one process per core spinning for the block's duration; yields how many."""
    if not busy:
        yield 0
        return
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.5)  # the burners are spinning before the first measurement
        yield len(burners)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def timed(fn: Callable[[], object]) -> tuple[object, float, float]:
    """``fn()``, its wall-clock seconds and this process's CPU seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def build_log(n_events: int) -> tuple[EventLog, float]:
    log = EventLog()
    cls = NativeBFCAllocator if native_core_available() else ReferenceBFCAllocator
    alloc = cls(SimUpstream("64GiB"), growth=True, log=log)
    ops = mixed_workload(100_000)
    live = [alloc.allocate(256) for _ in range(1000)]
    allocate, free = alloc.allocate, alloc.free
    start = time.perf_counter()
    i = 0
    while len(log) < n_events:
        for _ in range(10_000):
            size, victim = ops[i % len(ops)]
            i += 1
            free(live[victim])
            live[victim] = allocate(size)
    elapsed = time.perf_counter() - start
    log.flush()
    return log, elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=50_000)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--busy", action="store_true", help="one CPU-burning process per core throughout")
    parser.add_argument("--pairs-only", action="store_true", help="the allocate+free pairs only")
    add_json_option(parser)
    args = parser.parse_args()
    what = "Allocator speed with recording on/off" + (" (allocate+free pairs)." if args.pairs_only else
                                                      ", recording rate, replay, timeline.")  # fmt: skip
    if args.busy:
        results = Results("core-busy", f"{what} Beside one CPU-burning process per core.", vars(args))
    else:
        results = Results("core", what, vars(args))
    with busy_cores(args.busy) as burners:
        if burners:
            print(f"beside {burners} CPU-burning processes (one per core)")
        bench_rest(args, results)
    results.write(args.json)


def bench_rest(args: argparse.Namespace, results: Results) -> None:
    bench_pairs(args.pairs, args.repeats, results)
    if args.pairs_only:
        return

    log, elapsed = build_log(args.events)
    n = len(log)
    print(f"events recorded                  : {n} in {elapsed:.2f} s = {n / elapsed / 1e3:.0f}k events/s")
    results.add("recording rate (native core, in memory)", n / elapsed, "events/s", note=f"{n:,} events")

    _, wall, cpu = timed(lambda: log.columns)
    print(f"first read of the log's columns  : {wall:.3f} s [{cpu:.3f} s CPU] (EventLog: staged blocks -> columns)")
    walls = []
    for _ in range(3):
        series, wall, cpu = timed(lambda: timeline_series(log))
        walls.append(wall)
        print(f"timeline series of {n} events: {wall:.3f} s [{cpu:.3f} s CPU] ({len(series)} points)")  # type: ignore[arg-type]
    results.add(f"timeline series of {n:,} events (best of 3)", min(walls), "s")

    rates = []
    for _ in range(3):
        heap = replay(log)
        _, wall, cpu = timed(lambda h=heap: h.state_at(-1))  # first query: one pass over all events, checkpoints
        rates.append(n / wall)
        print(
            f"replay (first pass, checkpoints) : {wall:.3f} s [{cpu:.3f} s CPU] = {n / wall / 1e6:.1f}M events/s"
            f" [{n / cpu / 1e6:.1f}M events/s of CPU]"
        )

    results.add("replay, first pass with checkpoints (best of 3)", max(rates), "events/s")

    rng = np.random.default_rng(0)
    times = []
    for index in rng.integers(0, n, size=50):
        start = time.perf_counter()
        heap.state_at(int(index))
        times.append(time.perf_counter() - start)
    print(
        f"state_at random index            : median {statistics.median(times) * 1e3:.1f} ms,"
        f" max {max(times) * 1e3:.1f} ms over 50 queries"
    )
    results.add("state_at a random index (median of 50)", statistics.median(times) * 1e3, "ms")
    results.add("state_at a random index (max of 50)", max(times) * 1e3, "ms")


if __name__ == "__main__":
    main()
