"""Workloads for the C extensions of csrc/importers/ (see benchmarks/bench_native.py).

``WORKLOADS``: extension name -> (what the workload is, a set-up function returning the
callable to time). The same code runs the C extension and, with GPUVIZ_NATIVE_SKIP, its Python
twin: it calls gpuviz's public or module-level API, never the extension directly.

Each workload is ``gpuviz.load`` of the files a user opens: every real trace of its format in
``GPUVIZ_TEST_TRACES`` (real third-party files; none here without it) and a synthetic file of
``GPUVIZ_BENCH_ENTRIES`` entries (default 1,000,000) made by ``benchmarks/bench_import.py``'s
generators, cached under the temporary folder (``GPUVIZ_BENCH_CACHE`` names another).
Peak memory of the same loads: ``bench_import.py`` run with and without GPUVIZ_NATIVE_SKIP.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path

ENTRIES = int(os.environ.get("GPUVIZ_BENCH_ENTRIES", "1000000"))
CACHE = Path(os.environ.get("GPUVIZ_BENCH_CACHE") or Path(tempfile.gettempdir()) / "gpuviz-bench-native")
_TRACES = os.environ.get("GPUVIZ_TEST_TRACES")
TRACES = Path(_TRACES) if _TRACES else None
SNAPSHOT_PATTERN = "pt_snapshot_cs336_ctx128_fullstep_2025.pickle"  # the real snapshot the synthetic one repeats


def _real(pattern: str) -> list[Path]:
    return sorted(TRACES.glob(pattern)) if TRACES is not None else []


def _cached(name: str, make: Callable[[Path], None]) -> Path:
    path = CACHE / name
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        make(partial)
        partial.replace(path)
    return path


def _loads(paths: list[Path]) -> Callable[[], object]:
    import gpuviz

    gpuviz.load(paths[-1], progress=False)  # the format's modules imported before timing

    def work() -> object:
        return [len(gpuviz.load(path, progress=False)) for path in paths]

    return work


def snapshot_files() -> list[Path]:
    """The real snapshots, then a synthetic one of ENTRIES entries repeating a real one's pattern."""
    if TRACES is None:
        raise SystemExit("the snapshot workload repeats a real snapshot: set GPUVIZ_TEST_TRACES")
    from benchmarks.bench_import import repeated_snapshot

    traces = TRACES

    def make(path: Path) -> None:
        with open(path, "wb") as file:
            pickle.dump(repeated_snapshot(traces / SNAPSHOT_PATTERN, ENTRIES), file, protocol=4)

    return [*_real("pt_snapshot_*.pickle"), _cached(f"snapshot_{ENTRIES}.pickle", make)]


def xplane_files() -> list[Path]:
    """The real XPlane of 8 GPUs, then a synthetic one of ENTRIES memory events."""
    from benchmarks.bench_import import synthetic_xspace

    def make(path: Path) -> None:
        path.write_bytes(synthetic_xspace(ENTRIES))

    synthetic = _cached(f"synthetic_{ENTRIES}.xplane.pb", make)
    return [*_real("*.xplane.pb"), synthetic]


WORKLOADS: dict[str, tuple[str, Callable[[], Callable[[], object]]]] = {
    "gpuviz.importers._snapshotpickle": (
        f"gpuviz.load of the 6 real PyTorch snapshots and a {ENTRIES:,}-entry one",
        lambda: _loads(snapshot_files()),
    ),
    "gpuviz.importers._xplanewire": (
        f"gpuviz.load of the real 8-GPU XPlane and a {ENTRIES:,}-event synthetic one",
        lambda: _loads(xplane_files()),
    ),
}
