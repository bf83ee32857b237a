"""Core benchmarks: allocator speed with recording on/off, recording rate, replay, timeline.

Run by hand:  .venv/bin/python benchmarks/bench_core.py [--events 1000000]
Targets (issue 2): <= 4 us per allocate+free pair with recording on; recording costs
<= 15% over recording off; replay >= 300k events/s; timeline series of a 1M-event log
<= 0.3 s; state_at on a 1M-event log <= 50 ms.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np

from gpuviz import BFCAllocator, EventLog, SimUpstream, replay, timeline_series


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
    ops = mixed_workload(n_pairs)
    on, off = [], []
    for _ in range(repeats):
        for record, sink in ((True, on), (False, off)):
            alloc = BFCAllocator(SimUpstream("64GiB"), growth=True, record=record)
            sink.append(run_pairs(alloc, ops) / n_pairs * 1e6)
    best_on, best_off = min(on), min(off)
    print(f"allocate+free pair, recording on : {best_on:.2f} us (median {statistics.median(on):.2f})")
    print(f"allocate+free pair, recording off: {best_off:.2f} us (median {statistics.median(off):.2f})")
    print(f"recording overhead               : {(best_on / best_off - 1) * 100:.1f} %")


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
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
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
