"""The cluster summary of a run computed in parallel: on a Dask cluster, or in a local process pool.

``profile_run(paths, client)`` makes one task per log file. Each task opens its own file on
the worker (``summarize_rank``: one log in memory at a time per worker) and sends back only
its ``RankSummary`` (table rows and ``points``-bucket series per device, a few kB; never
events); the caller assembles them (``assemble_summary``). The result equals
``gpuviz.cluster_summary(load_run(paths))`` exactly.

Dask is imported only when a client is given (``pip install 'gpuviz[dask]'``); without one
the tasks run in a ``concurrent.futures.ProcessPoolExecutor`` of ``min(files, os.cpu_count())``
processes started by a ``forkserver`` (a child forked from the caller would inherit its
threads and CUDA context; the fork server is a fresh process that imports gpuviz once;
``spawn`` where there is no fork server).
Workers read the files by the paths the caller gives, so on a multi-machine cluster the
run directory must be on a filesystem every worker sees at the same path.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuviz.analysis.cluster import DEFAULT_THRESHOLD, ClusterSummary, RankSummary, assemble_summary, summarize_rank
from gpuviz.analysis.run import Run, load_run

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["profile_run", "as_run", "summarize_file"]


def as_run(paths: str | Path | Run | Sequence[str | Path]) -> Run:
    """``paths`` as a ``Run``: a ``Run`` as is; a directory or glob pattern through ``load_run``;
    a list of files in the order given (a file without ``meta["run"]`` is rank = its position).

    Raises ``FileNotFoundError`` when there is no file.
    """
    if isinstance(paths, Run):
        run = paths
    elif isinstance(paths, (str, Path)):
        run = load_run(paths)
    else:
        run = Run(tuple(Path(p) for p in paths))
    if not len(run):
        raise FileNotFoundError("no log files given (a run is a directory of logs, a glob pattern or a list of files)")
    return run


def summarize_file(run: Run, position: int, *, points: int, gpus_only: bool) -> RankSummary:
    """One task: ``summarize_rank`` of file ``position``, on whichever process runs it.

    Errors that do not already name the file (loading errors do) are raised again, with the
    same type where it is a ``ValueError``, naming it, so the caller learns which file failed.
    """
    path = run.paths[position]
    try:
        return summarize_rank(run, position, points=points, gpus_only=gpus_only)
    except Exception as exc:
        if str(path) in str(exc) or path.name in str(exc):
            raise
        wrapper = ValueError if isinstance(exc, ValueError) else RuntimeError
        raise wrapper(f"{path}: {type(exc).__name__}: {exc}") from exc


_POOL_RUN: list[Run] = []  # the run a process-pool worker summarises files of (set once per worker)


def _set_pool_run(run: Run) -> None:
    _POOL_RUN[:] = [run]


def _pool_task(position: int, points: int, gpus_only: bool) -> RankSummary:
    return summarize_file(_POOL_RUN[0], position, points=points, gpus_only=gpus_only)


def _on_process_pool(run: Run, *, points: int, gpus_only: bool) -> list[RankSummary]:
    n = len(run)
    workers = min(n, os.cpu_count() or 1)
    context: BaseContext = multiprocessing.get_context("spawn")
    if "forkserver" in multiprocessing.get_all_start_methods():  # not on Windows
        server = multiprocessing.get_context("forkserver")
        server.set_forkserver_preload(["gpuviz.analysis.cluster"])  # imported once, in the fork server
        context = server
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_set_pool_run, initargs=(run,)) as pool:
        return list(pool.map(_pool_task, range(n), [points] * n, [gpus_only] * n))


def _on_dask(client: Client, run: Run, *, points: int, gpus_only: bool) -> list[RankSummary]:
    dask: Any = client  # distributed's scatter, gather and cancel are not annotated
    shared = dask.scatter(run, broadcast=True)  # the file list goes to each worker once, not with every task
    n = len(run)
    futures = dask.map(summarize_file, [shared] * n, range(n), points=points, gpus_only=gpus_only, pure=False)
    try:
        results: list[RankSummary] = dask.gather(futures)
    finally:
        dask.cancel([*futures, shared])
    return results


def profile_run(
    paths: str | Path | Run | Sequence[str | Path],
    client: Client | None = None,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    points: int = 500,
    gpus_only: bool = True,
) -> ClusterSummary:
    """The cluster summary of a run, one task per log file.

    ``paths``: a run directory, a glob pattern, a ``Run`` or a list of files. ``client``: a
    ``dask.distributed.Client`` to run the tasks on; ``None``: a local process pool.
    ``threshold``, ``points``, ``gpus_only``: as for ``cluster_summary``, whose result this
    equals. Raises ``FileNotFoundError`` when there is no file, the error of the first file
    that fails (naming it: ``LogFormatError`` for a file that is not a readable log), and
    ``ValueError`` when two files claim the same rank on the same host.
    """
    if not threshold >= 0:
        raise ValueError(f"threshold must be a fraction >= 0, got {threshold!r}")
    if not points >= 1:
        raise ValueError(f"points must be at least 1, got {points!r}")
    run = as_run(paths)
    options: dict[str, Any] = {"points": points, "gpus_only": gpus_only}
    ranks = _on_process_pool(run, **options) if client is None else _on_dask(client, run, **options)
    return assemble_summary(ranks, threshold=threshold)
