"""Workloads for the C extensions of csrc/analysis/ (see benchmarks/bench_native.py).

``WORKLOADS``: extension name -> (what the workload is, a set-up function returning the
callable to time). The same code runs the C extension and, with GPUVIZ_NATIVE_SKIP, its Python
twin: it calls gpuviz's public or module-level API, never the extension directly.

The logs are training-like (``benchmarks.bench_views.build_log``): made once, saved under the
temporary folder (``GPUVIZ_BENCH_CACHE`` names another) and loaded by each run. Sizes:
``GPUVIZ_BENCH_EVENTS`` (default 3,000,000 events) for the replay, and 2,000,000 rows, read
in updates of 200,000 (a busy cell at 10 updates a second), for the live follower.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

EVENTS = int(os.environ.get("GPUVIZ_BENCH_EVENTS", "3000000"))
LIVE_ROWS = 2_000_000
LIVE_STEP = 200_000  # rows a live update reads: ~0.1 s of a busy recording
CACHE = Path(os.environ.get("GPUVIZ_BENCH_CACHE") or Path(tempfile.gettempdir()) / "gpuviz-bench-native")


def cached_log(events: int) -> Any:
    """A training-like log of ``events`` events (bench_views.build_log), saved once and loaded."""
    import gpuviz

    path = CACHE / f"training_{events}.gpuviz"
    if not path.exists():
        from benchmarks.bench_views import build_log

        CACHE.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        build_log(events).save(partial)
        partial.replace(path)
    return gpuviz.load(path, progress=False)


def replay_report() -> Callable[[], object]:
    """Everything a report of a long log computes: profile (replay checkpoints, timeline, tables,
    diagnosis), the heap at each of the 40 scrub frames (in one pass, as the report's scrubber
    takes them: ``columns_at_each``), the timeline resampled for drawing."""
    from gpuviz.analysis.profile import profile
    from gpuviz.analysis.timeline import resample
    from gpuviz.views.report import scrub_positions

    log = cached_log(EVENTS)

    def work() -> object:
        p = profile(log)
        device = p.devices[p.device or ""]
        heaps = device.columns_at_each(scrub_positions(device))
        states = [heaps[k] for k in range(len(heaps))]
        return states, resample(device.series, 2000), device.allocated(len(log) - 1)

    return work


class _Growing:
    """The part of an EventLog a LiveFollower reads, over a finished log whose rows appear
    ``LIVE_STEP`` at a time (``visible``): a recording as a live view sees it."""

    def __init__(self, log: Any) -> None:
        self.device_names = log.device_names
        self.strings = log.strings
        self.packed = log.rows_since(0)
        self.raw = memoryview(self.packed.tobytes())
        self.row = self.packed.dtype.itemsize
        self.visible = 0

    def rows_since(self, start: int) -> np.ndarray:
        rows: np.ndarray = self.packed[start : self.visible]
        return rows

    def row_pieces_since(self, start: int) -> list[bytes | memoryview]:
        return [self.raw[start * self.row : self.visible * self.row]]


def live_updates() -> Callable[[], object]:
    """A live view following a busy recording: ``LiveFollower.update(most=200)`` (the dashboard's
    call) every ``LIVE_STEP`` new rows until ``LIVE_ROWS`` rows, then the heap map's arrays."""
    from gpuviz.analysis.live import LiveFollower

    growing = _Growing(cached_log(LIVE_ROWS))

    def work() -> object:
        growing.visible = 0
        follower = LiveFollower(growing)  # type: ignore[arg-type]
        drawn = []
        while growing.visible < len(growing.packed):
            growing.visible = min(growing.visible + LIVE_STEP, len(growing.packed))
            drawn.append(follower.update(most=200))
        return drawn, follower.arrays("GPU:0")

    return work


WORKLOADS: dict[str, tuple[str, Callable[[], Callable[[], object]]]] = {
    "gpuviz.analysis._replaykernel": (
        f"profile, 40 scrub-frame heaps (one pass) and the drawn timeline of a {EVENTS:,}-event training log",
        replay_report,
    ),
    "gpuviz.analysis._livekernel": (
        f"live updates (most=200) every {LIVE_STEP:,} new rows of a {LIVE_ROWS:,}-row recording",
        live_updates,
    ),
}
