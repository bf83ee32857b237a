"""Core benchmarks: allocator speed with recording on/off, recording rate, replay, timeline.

Run by hand:  .venv/bin/python benchmarks/bench_core.py [--events 1000000]
Targets (issue 2): <= 4 us per allocate+free pair with recording on; recording costs
<= 15% over recording off; replay >= 300k events/s; timeline series of a 1M-event log
<= 0.3 s; state_at on a 1M-event log <= 50 ms.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import numpy as np

from gpuviz import BFCAllocator, EventLog, SimUpstream, replay, timeline_series
from gpuviz.capture.recorder import native_available


def mixed_workload(n_pairs: int, seed: int = 0) -> list[tuple[int, int]]:
    """(size, victim index) per step: sizes log-uniform 64 B..16 MiB, ~1000 live buffers."""
    rng = random.Random(seed)
    ops = []
    for _ in range(n_pairs):
        size = int(2 ** rng.uniform(6, 24))
        ops.append((size, rng.randrange(1000)))
    return ops


def run_pairs(alloc: BFCAllocator, ops: list[tuple[int, int]]) -> float:
    """Seconds for len(ops) allocate+free pairs against a steady population of 1000 live buffers."""
    live = [alloc.allocate(256) for _ in range(1000)]
    allocate, free = alloc.allocate, alloc.free
    start = time.perf_counter()
    for size, victim in ops:
        free(live[victim])
        live[victim] = allocate(size)
    return time.perf_counter() - start


def bench_pairs(n_pairs: int, repeats: int) -> None:
    """Recording off, on with the C row writer (when built), on with the Python recorder.

    Runs are interleaved and repeated; best and median are printed (the machine is shared).
    """
    ops = mixed_workload(n_pairs)
    modes = {"off": (False, "1"), "on": (True, "1"), "on, Python recorder": (True, "0")}
    if not native_available():
        del modes["on"]
    results: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(repeats):
        for mode, (record, native) in modes.items():
            os.environ["GPUVIZ_NATIVE"] = native
            alloc = BFCAllocator(SimUpstream("64GiB"), growth=True, record=record)
            results[mode].append(run_pairs(alloc, ops) / n_pairs * 1e6)
    os.environ.pop("GPUVIZ_NATIVE")
    best_off, median_off = min(results["off"]), statistics.median(results["off"])
    for mode, times in results.items():
        best, median = min(times), statistics.median(times)
        print(f"allocate+free pair, recording {mode:20s}: {best:.2f} us (median {median:.2f})", end="")
        if mode != "off":
            print(f", overhead {(best / best_off - 1) * 100:.1f} % (median {(median / median_off - 1) * 100:.1f} %)")
        else:
            print()


def build_log(n_events: int) -> tuple[EventLog, float]:
    log = EventLog()
    alloc = BFCAllocator(SimUpstream("64GiB"), growth=True, log=log)
    ops = mixed_workload(n_events // 2)
    live = [alloc.allocate(256) for _ in range(1000)]
    start = time.perf_counter()
    i = 0
    while len(log) < n_events:
        size, victim = ops[i % len(ops)]
        i += 1
        alloc.free(live[victim])
        live[victim] = alloc.allocate(size)
    elapsed = time.perf_counter() - start
    log.flush()
    return log, elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=50_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    bench_pairs(args.pairs, args.repeats)

    log, elapsed = build_log(args.events)
    n = len(log)
    print(f"events recorded                  : {n} in {elapsed:.2f} s = {n / elapsed / 1e3:.0f}k events/s")

    start = time.perf_counter()
    series = timeline_series(log)
    print(f"timeline series of {n} events : {time.perf_counter() - start:.3f} s ({len(series)} points)")

    heap = replay(log)
    start = time.perf_counter()
    heap.state_at(-1)  # first query: one pass over all events, building checkpoints
    first = time.perf_counter() - start
    print(f"replay (first pass, checkpoints) : {first:.2f} s = {n / first / 1e3:.0f}k events/s")

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


if __name__ == "__main__":
    main()
