"""Workloads for the C extensions of csrc/capture/ (see benchmarks/bench_native.py).

``WORKLOADS``: extension name -> (what the workload is, a set-up function returning the
callable to time). The same code runs the C extension and, with GPUVIZ_NATIVE_SKIP, its Python
twin: it calls gpuviz's public or module-level API, never the extension directly.

    _bfcnative   200,000 allocate+free pairs of ``gpuviz.BFCAllocator`` (the native allocator,
                 or the Python reference where it is skipped), recording into an EventLog,
                 against ~1000 live buffers (bench_core's mixed workload: 64 B .. 16 MiB).
                 Measured (2 shared cores, best of 5): 0.045 s C vs 0.391 s Python (8.7x; the
                 Python twin's rows then written by the C row writer), and after the rules were
                 written once and the row writer removed 0.053 s vs 0.575 s (10.8x): the C stays.

Removed after measuring: ``_rowwriter``, the C row writer of the Python reference allocator's
recorder. Its workload (``reference_pairs``: the same pairs on ``ReferenceBFCAllocator``, the one
allocator whose rows it wrote) measured 0.403 s C vs 0.516 s Python (1.28x; 1.73x in a run on
a loaded machine). Users never gained from it: wherever it was built, the native allocator was
built too and runs instead of the reference (both are switched off together by
``GPUVIZ_NATIVE=0``). ``reference_pairs`` stays, to time the Python reference.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.bench_core import mixed_workload

PAIRS = 200_000


def _pairs(make: Callable[[], object]) -> Callable[[], object]:
    ops = mixed_workload(PAIRS)
    alloc = make()
    allocate, free = alloc.allocate, alloc.free  # type: ignore[attr-defined]
    live = [allocate(256) for _ in range(1000)]

    def work() -> None:
        for size, victim in ops:
            free(live[victim])
            live[victim] = allocate(size)

    return work


def bfcnative() -> Callable[[], object]:
    from gpuviz import BFCAllocator, EventLog, SimUpstream

    return _pairs(lambda: BFCAllocator(SimUpstream("64GiB"), log=EventLog()))


def reference_pairs() -> Callable[[], object]:
    from gpuviz import EventLog, SimUpstream
    from gpuviz.capture import ReferenceBFCAllocator

    return _pairs(lambda: ReferenceBFCAllocator(SimUpstream("64GiB"), log=EventLog()))


WORKLOADS: dict[str, tuple[str, Callable[[], Callable[[], object]]]] = {
    "gpuviz.capture._bfcnative": (f"{PAIRS:,} allocate+free pairs, recording", bfcnative),
}
