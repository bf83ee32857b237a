"""``gpuviz.dask.profile_run``: a run's cluster summary computed on a real Dask ``LocalCluster``
(worker processes) and on a local process pool equals the in-process ``cluster_summary`` exactly."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster
from runs import write_leaky_run
from traces import trace_path
from waiting import wait_until

import gpuviz
from gpuviz import EventLog, LogFormatError, SimUpstream, cluster_summary, load_run
from gpuviz.analysis.cluster import ClusterSummary
from gpuviz.analysis.timeline import ResampledSeries
from gpuviz.base.ranks import RankInfo
from gpuviz.base.units import MiB
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.dask import profile_run


@pytest.fixture
def leaky_run(tmp_path: Path) -> Path:
    """Five ranks on host node0; rank 2 leaks (see ``runs.write_leaky_run``)."""
    return write_leaky_run(tmp_path)


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with (
        LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster) as dask_client,
    ):
        yield dask_client


@pytest.fixture(params=["dask", "process-pool"])
def executor(request: pytest.FixtureRequest) -> Client | None:
    """Where ``profile_run`` runs its tasks: the LocalCluster's client, or ``None`` (a process pool)."""
    if request.param == "dask":
        dask_client: Client = request.getfixturevalue("client")
        return dask_client
    return None


def assert_identical(got: ClusterSummary, expected: ClusterSummary) -> None:
    """Every field equal: the table (values and dtypes), every series array, the rest by ``==``."""
    for field in dataclasses.fields(expected):
        mine, theirs = getattr(got, field.name), getattr(expected, field.name)
        if field.name == "table":
            pd.testing.assert_frame_equal(mine, theirs, check_exact=True, check_dtype=True)
        elif field.name == "series":
            assert len(mine) == len(theirs) == len(expected.table)
            for a, b in zip(mine, theirs, strict=True):
                assert_same_series(a, b)
        else:
            assert mine == theirs, field.name


def assert_same_series(a: ResampledSeries, b: ResampledSeries) -> None:
    assert a.device == b.device
    arrays = [("time_ns", a.time_ns, b.time_ns)]
    for side in ("minimum", "maximum"):
        mine, theirs = getattr(a, side), getattr(b, side)
        assert list(mine) == list(theirs) and "bytes_in_use" in theirs
        arrays += [(f"{side}[{m}]", mine[m], theirs[m]) for m in theirs]
    for name, x, y in arrays:
        assert x.dtype == y.dtype and np.array_equal(x, y), name


def test_the_summary_on_workers_equals_the_in_process_one(leaky_run: Path, executor: Client | None) -> None:
    got = profile_run(leaky_run, executor)
    assert_identical(got, cluster_summary(load_run(leaky_run)))
    # the leaking rank is the one outlier, found on the workers too
    assert got.outliers["rank"].tolist() == [2] and got.outliers["outlier"].tolist() == ["peak,growth"]
    assert got.table["file"].tolist() == [f"node0-rank{r}.arrow" for r in range(5)]


def test_options_reach_the_workers(leaky_run: Path, executor: Client | None) -> None:
    log = EventLog(meta={"run": RankInfo(5, 0, 6, "node1").as_meta()})
    for device in ("GPU:0", "CPU:0"):
        alloc = ReferenceBFCAllocator(SimUpstream(1 << 30), memory_limit=64 * MiB, growth=False, device=device, log=log)
        alloc.free(alloc.allocate(4 * MiB))
    log.with_columns(time_ns=np.arange(len(log), dtype=np.int64)).save(leaky_run / "node1-rank5.arrow")
    options: dict[str, Any] = {"threshold": 0.05, "points": 7, "gpus_only": False}
    got = profile_run(str(leaky_run / "*.arrow"), executor, **options)
    assert_identical(got, cluster_summary(load_run(str(leaky_run / "*.arrow")), **options))
    assert got.table["device"].tolist()[-2:] == ["node1/rank5/CPU:0", "node1/rank5/GPU:0"]
    # rank 5's one 4 MiB block is in use at the middle of its time span and freed at the end
    assert got.table["growth_bytes"].tolist()[-2:] == [-4 * MiB, -4 * MiB]
    assert got.table["outlier"].tolist() == ["", "", "peak,growth", "peak", "", "growth", "growth"]
    assert [len(s.time_ns) for s in got.series[:5]] == [7] * 5


def test_imported_traces_given_as_a_list_are_ranks_in_list_order(executor: Client | None) -> None:
    names = ["pt_snapshot_assignment2_2026b.pickle", "pt_snapshot_assignment2_2026a.pickle"]
    files = [trace_path(name) for name in names]  # real traces (GPUVIZ_TEST_TRACES)
    got = profile_run(files, executor)
    assert_identical(got, cluster_summary(gpuviz.Run(tuple(files))))
    assert got.table["host"].tolist() == ["pt_snapshot_assignment2_2026b", "pt_snapshot_assignment2_2026a"]
    assert got.table["peak_bytes"].tolist() == [13927832064, 3861684736]


def test_a_file_that_is_not_a_log_is_named(leaky_run: Path, executor: Client | None) -> None:
    bad = leaky_run / "node0-rank5.arrow"
    bad.write_bytes(b"this is not an event log")
    with pytest.raises(LogFormatError, match=r"node0-rank5\.arrow"):
        profile_run(leaky_run, executor)


def test_a_bad_run_identity_is_named_with_its_file(leaky_run: Path, executor: Client | None) -> None:
    log = gpuviz.load(leaky_run / "node0-rank4.arrow", progress=False)
    log.meta["run"] = {"rank": "four", "local_rank": 4, "world_size": 5, "host": "node0"}
    (leaky_run / "node0-rank4.arrow").unlink()
    log.save(leaky_run / "odd.arrow")
    with pytest.raises(ValueError, match=r"odd\.arrow: ValueError: log\.meta\['run'\] is not a run identity"):
        profile_run(leaky_run, executor)


def test_two_files_claiming_one_rank_are_refused(leaky_run: Path, executor: Client | None) -> None:
    (leaky_run / "copy.arrow").write_bytes((leaky_run / "node0-rank1.arrow").read_bytes())
    with pytest.raises(ValueError, match=r"node0-rank1\.arrow and copy\.arrow are both rank 1 on host node0"):
        profile_run(leaky_run, executor)


def test_no_files_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no log files"):
        profile_run(tmp_path)
    with pytest.raises(FileNotFoundError, match="no log files given"):
        profile_run([])
    with pytest.raises(ValueError, match="points must be at least 1"):
        profile_run(tmp_path, points=0)


def test_the_dask_client_is_left_clean(leaky_run: Path, client: Client) -> None:
    """No task result or scattered file list stays on the cluster after a summary. (distributed
    sends the cancel on its batched stream, which a later call may overtake: the scheduler has
    forgotten the keys shortly after, not necessarily when profile_run returns.)"""
    profile_run(leaky_run, client)
    wait_until(
        lambda: client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) == 0,
        "the scheduler forgets the summary's tasks",
        poll_s=0.05,
    )


def test_import_gpuviz_does_not_import_dask() -> None:
    code = (
        "import sys, gpuviz; gpuviz.dask.profile_run; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
