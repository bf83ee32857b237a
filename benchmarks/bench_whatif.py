"""What-if benchmark: replaying a run's request stream under each policy.

Run by hand:  .venv/bin/python -m benchmarks.bench_whatif [--requests 1000000]
Target (issue 13): replaying 1M requests under one policy <= 2 s.

The run is a recorded BFC workload (the mixed workload of bench_core: sizes log-uniform
64 B .. 16 MiB, ~1000 live buffers), so the stream has as many frees as allocations.
"""

from __future__ import annotations

import argparse
import time

from benchmarks._results import Results, add_json_option
from benchmarks.bench_core import mixed_workload
from gpuviz import SimUpstream
from gpuviz.analysis.requests import request_stream
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.capture.upstream import SimUpstream as Upstream
from gpuviz.scenarios import parse_policy, replay_policy
from gpuviz.scenarios.whatif import UNBOUNDED


def recorded_run(requests: int) -> ReferenceBFCAllocator:
    alloc = ReferenceBFCAllocator(SimUpstream("64GiB"))
    live = [alloc.allocate(256) for _ in range(1000)]
    for size, victim in mixed_workload(requests // 2):
        alloc.free(live[victim])
        live[victim] = alloc.allocate(size)
    return alloc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1_000_000)
    add_json_option(parser)
    args = parser.parse_args()
    results = Results("whatif", "What-if: replaying a recorded run's request stream under each policy.", vars(args))
    started = time.perf_counter()
    run = recorded_run(args.requests)
    stream = request_stream(run.log, "GPU:0")
    print(f"recorded run: {len(run.log)} events, {len(stream)} requests ({time.perf_counter() - started:.1f} s)")
    for spec in ("tf-bfc", "torch", "rmm-pool", "no-pool"):
        start, cpu = time.perf_counter(), time.process_time()
        log, served = replay_policy(stream, run.log, parse_policy(spec), Upstream(UNBOUNDED))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        print(f"{spec:9s} {served} requests in {seconds:.2f} s wall [{cpu:.2f} s CPU] "
              f"({served / seconds / 1e6:.2f} M requests/s), {len(log)} events")  # fmt: skip
        results.add(f"replay of {served:,} requests under {spec}", seconds, "s", note=f"{cpu:.2f} s CPU")
    results.write(args.json)


if __name__ == "__main__":
    main()
