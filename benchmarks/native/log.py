"""Workloads for the C extensions of csrc/log/ (see benchmarks/bench_native.py).

``WORKLOADS``: extension name -> (what the workload is, a set-up function returning the
callable to time). The same code runs the C extension and, with GPUVIZ_NATIVE_SKIP, its Python
twin: it calls gpuviz's public or module-level API, never the extension directly.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

PAIRS = 500_000  # allocate+free pairs recorded: ~1.1M events
RMM_ROWS = 1_000_000  # rows of the RMM log imported


def _scratch() -> Path:
    path = Path(tempfile.gettempdir()) / "gpuviz-bench-native-log"
    path.mkdir(exist_ok=True)
    return path


def _allocator(log: object) -> Callable[[], object]:
    """``PAIRS`` allocate+free pairs (sizes log-uniform 64 B..16 MiB over ~1000 live buffers, as
    benchmarks/bench_core.py) on the native core recording into ``log``."""
    from gpuviz import SimUpstream
    from gpuviz.capture.native import NativeBFCAllocator

    rng = random.Random(0)
    ops = [(int(2 ** rng.uniform(6, 24)), rng.randrange(1000)) for _ in range(PAIRS)]
    alloc = NativeBFCAllocator(SimUpstream("64GiB"), growth=True, log=log)
    live = [alloc.allocate(256) for _ in range(1000)]

    def work() -> None:
        allocate, free = alloc.allocate, alloc.free
        for size, victim in ops:
            free(live[victim])
            live[victim] = allocate(size)

    return work


def record_in_memory() -> Callable[[], object]:
    """Recording ~1.1M events in memory, then reading the log's columns (what a view does)."""
    from gpuviz import EventLog

    log = EventLog()
    pairs = _allocator(log)

    def work() -> object:
        pairs()
        return log.columns

    return work


def record_to_a_file() -> Callable[[], object]:
    """Recording ~1.1M events to a file (``EventLog(path)``, as ``gpuviz demo`` and
    ``%gpuviz start --run-dir`` do) until the file holds them all (``flush``): what recording
    costs the program while it runs. ``close`` (the same code either way: the file rewritten in
    its random-access form) is left out of the timing; it runs at the next set-up."""
    from gpuviz import EventLog

    _close_open_logs()
    folder = Path(tempfile.mkdtemp(prefix="gpuviz-bench-"))
    log = EventLog(folder / "run.arrow")
    _open_logs.append((log, folder))
    pairs = _allocator(log)

    def work() -> None:
        pairs()
        log.flush()

    return work


_open_logs: list[tuple[Any, Path]] = []  # the logs still recording, closed at the next set-up


@atexit.register
def _close_open_logs() -> None:
    for log, folder in _open_logs:
        log.close()
        shutil.rmtree(folder)
    _open_logs.clear()


def _rmm_log(rows: int) -> Path:
    """An RMM log of ``rows`` allocations and frees over up to 64 live buffers (made once)."""
    path = _scratch() / f"rmm_{rows}.dev0.csv"
    if path.exists():
        return path
    part = path.with_suffix(".part")
    with open(part, "w") as file:
        file.write("Thread,Time,Action,Pointer,Size,Stream\n")
        live: list[tuple[int, int]] = []
        for row in range(rows):
            us = row * 10
            stamp = f"{us // 3_600_000_000 % 24:02d}:{us // 60_000_000 % 60:02d}:{us // 1_000_000 % 60:02d}"
            stamp += f".{us % 1_000_000:06d}"
            address, size = 0x7F0000000000 + (row % 4096) * (1 << 21), 256 * (1 + row % 4096)
            if len(live) < 64 and (row % 3 != 2 or not live) and all(a != address for a, _ in live):
                live.append((address, size))
                file.write(f"140000,{stamp},allocate,{address:#x},{size},0\n")
            else:
                address, size = live.pop(0)
                file.write(f"140000,{stamp},free,{address:#x},{size},0\n")
    os.replace(part, path)
    return path


def import_rmm_log() -> Callable[[], object]:
    """Importing an RMM log of 1M allocations and frees (``gpuviz.load``): ``HeapBuilder``
    rebuilds the heap from every change."""
    import gpuviz

    path = _rmm_log(RMM_ROWS)
    return lambda: gpuviz.load(path)




def import_snapshots() -> Callable[[], object]:
    """Importing the real PyTorch memory snapshots of ``$GPUVIZ_TEST_TRACES`` and a 1M-entry one
    repeating a real one's pattern (``benchmarks/native/importers.py``'s files): ``HeapBuilder``
    rebuilds each device's heap from the snapshot's trace and segments. (On the real snapshots
    alone the heap is a small part of an import: 0.1-0.2 s of 1.9 s.)"""
    from benchmarks.native.importers import _loads, snapshot_files

    return _loads(snapshot_files())


# HeapBuilder's workload: PyTorch snapshots where the real traces are there, else an RMM log
_HEAP_WORKLOAD = (
    ("importing the real PyTorch snapshots and a 1M-entry one (gpuviz.load)", import_snapshots)
    if os.environ.get("GPUVIZ_TEST_TRACES")
    else ("importing an RMM log of 1M allocations and frees (gpuviz.load)", import_rmm_log)
)


WORKLOADS: dict[str, tuple[str, Callable[[], Callable[[], object]]]] = {
    "gpuviz.log._staging": (
        "recording ~1.1M events in memory (native core), then reading the columns",
        record_in_memory,
    ),
    "gpuviz.log._batchwriter": (
        "recording ~1.1M events to a file (native core, EventLog(path)) until the file holds them",
        record_to_a_file,
    ),
    "gpuviz.log._heapcore": _HEAP_WORKLOAD,
}
