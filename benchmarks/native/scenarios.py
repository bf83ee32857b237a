"""Workloads for the C extensions of csrc/scenarios/ (see benchmarks/bench_native.py).

``WORKLOADS``: extension name -> (what the workload is, a set-up function returning the
callable to time). The same code runs the C extension and, with GPUVIZ_NATIVE_SKIP, its Python
twin: it calls gpuviz's public or module-level API, never the extension directly.

    _whatifcore  what-if of 1M requests (a recorded BFC run, bench_whatif's) under each policy:
                 tf-bfc, torch, rmm-pool, no-pool. Measured (2 shared cores, best of 5): 1.08 s C
                 vs 13.7 s Python (12.7x), and with tf-bfc's growth and garbage collection taken
                 from the BFC core (bfc_grow) 0.86 s vs 13.9 s (16.1x): the C stays.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

REQUESTS = 1_000_000
POLICIES = ("tf-bfc", "torch", "rmm-pool", "no-pool")


@cache
def _recorded() -> tuple[Any, Any]:
    from benchmarks.bench_whatif import recorded_run
    from gpuviz.analysis.requests import request_stream

    run = recorded_run(REQUESTS)
    return run.log, request_stream(run.log, "GPU:0")


def whatif() -> Callable[[], object]:
    from gpuviz.capture.upstream import SimUpstream
    from gpuviz.scenarios import parse_policy, replay_policy
    from gpuviz.scenarios.whatif import UNBOUNDED

    log, stream = _recorded()

    def work() -> None:
        for spec in POLICIES:
            replay_policy(stream, log, parse_policy(spec), SimUpstream(UNBOUNDED))

    return work


WORKLOADS: dict[str, tuple[str, Callable[[], Callable[[], object]]]] = {
    "gpuviz.scenarios._whatifcore": (f"what-if of {REQUESTS:,} requests under {', '.join(POLICIES)}", whatif),
}
