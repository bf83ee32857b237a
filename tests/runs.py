"""Constructed distributed runs for the tests: per-rank logs with exact sizes and times."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpuviz import EventLog, SimUpstream
from gpuviz.base.ranks import RankInfo
from gpuviz.base.units import MiB
from gpuviz.capture import ReferenceBFCAllocator


def write_rank(
    folder: Path,
    rank: int,
    *,
    leak: int = 0,
    extra: int = 0,
    run: dict[str, Any] | None = None,
    start_ns: int = 0,
    device: str = "GPU:0",
) -> None:
    """Ten steps of 4 MiB allocated and freed (and ``extra`` bytes beside them), keeping ``leak`` bytes per
    step; events of step k are at time ``start_ns`` + k ms (+ 1 ns per event). ``run``: more
    ``meta["run"]`` entries; ``device``: the allocator's device."""
    log = EventLog(meta={"run": {**RankInfo(rank, rank, 5, "node0").as_meta(), **(run or {})}})
    alloc = ReferenceBFCAllocator(SimUpstream(1 << 30), memory_limit=64 * MiB, growth=False, device=device, log=log)
    bounds = []
    for _ in range(10):
        start = len(log)
        if leak:
            alloc.allocate(leak)
        addresses = [alloc.allocate(4 * MiB)] + ([alloc.allocate(extra)] if extra else [])
        for address in addresses:
            alloc.free(address)
        bounds.append((start, len(log)))
    times = np.full(len(log), start_ns, dtype=np.int64)  # (the preallocated segment: at the start)
    for step, (start, end) in enumerate(bounds):
        times[start:end] = start_ns + step * 1_000_000 + np.arange(end - start)
    log.with_columns(time_ns=times).save(folder / f"node0-rank{rank}.arrow")


def write_leaky_run(folder: Path) -> Path:
    """Five ranks on host node0: rank 2 keeps 1 MiB per step (the outlier), rank 3 allocates
    256 KiB more than the others (6.25 % over the median peak)."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(5):
        write_rank(folder, rank, leak=MiB if rank == 2 else 0, extra=256 * 1024 if rank == 3 else 0)
    return folder
