"""A run exported as a Parquet dataset partitioned by host and rank: every event of every rank
once, partitions right, and the documentation's DuckDB and Dask DataFrame examples run as written."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest
from runs import write_leaky_run, write_rank

import gpuviz
from gpuviz import EventLog, SimUpstream, cluster_summary, load_run
from gpuviz.base.ranks import RankInfo
from gpuviz.base.units import KiB, MiB
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.capture.events import record_transfer
from gpuviz.exporters.parquet import export_run_parquet, partition_path
from gpuviz.frontends.cli import main
from gpuviz.log.schema import KIND_NAMES, Direction

PAGE = Path(__file__).resolve().parent.parent / "docs" / "distributed.md"


def readme_example(name: str) -> str:
    """The Python block after ``<!-- example: NAME -->`` in docs/distributed.md, exactly as written."""
    found = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```\n", PAGE.read_text(encoding="utf-8"), re.S)
    assert found, f"docs/distributed.md has no example {name!r}"
    return found.group(1)


def named(column: pd.Series) -> list[object]:
    """A decoded column's values, ``None`` where null."""
    return column.astype(object).where(column.notna(), None).tolist()


def _write_two_device_rank(folder: Path) -> None:
    """Rank 5 on host node1: a transfer between CPU:0 and GPU:0, a tagged allocation, a mark."""
    log = EventLog(meta={"run": RankInfo(5, 0, 6, "node1").as_meta()})
    gpu = ReferenceBFCAllocator(SimUpstream(1 << 30), memory_limit=64 * MiB, growth=False, device="GPU:0", log=log)
    cpu = log.add_device("CPU:0")
    address = gpu.allocate(3 * MiB, tag="weights")
    record_transfer(log, direction=Direction.H2D, source=cpu, destination=0, nbytes=MiB, start_ns=5, duration_ns=7)
    log.mark("step 1")
    gpu.free(address)
    log.with_columns(time_ns=np.arange(len(log), dtype=np.int64)).save(folder / "node1-rank5.arrow")


@pytest.fixture
def leaky_run(tmp_path: Path) -> Path:
    """Five ranks on host node0; rank 2 leaks (see ``runs.write_leaky_run``)."""
    return write_leaky_run(tmp_path / "run")


@pytest.fixture
def two_host_run(leaky_run: Path) -> Path:
    _write_two_device_rank(leaky_run)
    return leaky_run


def test_every_event_of_every_rank_once_in_its_partition(two_host_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.parquet"
    parts = export_run_parquet(load_run(two_host_run), out)
    expected = [("node0", r) for r in range(5)] + [("node1", 5)]
    assert parts == [out / f"host={h}" / f"rank={r}" / "part-0.parquet" for h, r in expected]
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted(
        str(partition_path(h, r)) for h, r in expected
    )
    table = ds.dataset(out, partitioning="hive").to_table()
    assert table.schema.field("rank").type == "int32" and table.schema.field("host").type == "string"
    frame = table.to_pandas()
    total = 0
    for rank_log in load_run(two_host_run):
        info, log = rank_log.info, rank_log.log
        mine = frame[(frame["host"] == info.host) & (frame["rank"] == info.rank)].sort_values("seq")
        total += len(log)
        cols = log.columns
        assert mine["seq"].tolist() == list(range(len(log)))
        for name in ("time_ns", "flags", "thread", "address", "size", "requested", "segment", "largest_free",
                     "duration_ns", "stack"):  # fmt: skip
            assert mine[name].tolist() == cols[name].tolist(), name
        assert mine["kind"].astype(str).tolist() == [KIND_NAMES[k] for k in cols["kind"]]
        names = log.device_names
        assert named(mine["device"]) == [names[d] if d >= 0 else None for d in cols["device"]]
        assert named(mine["peer"]) == [names[d] if d >= 0 else None for d in cols["peer"]]
        assert named(mine["tag"]) == [log.strings[t] if t >= 0 else None for t in cols["tag"]]
    assert len(frame) == total
    rank5 = frame[frame["rank"] == 5]
    transfer = rank5[rank5["kind"] == "transfer"]
    assert transfer[["device", "peer", "size"]].astype(object).values.tolist() == [
        ["node1/rank5/CPU:0", "node1/rank5/GPU:0", MiB]
    ]
    assert rank5.loc[rank5["kind"] == "alloc", "tag"].tolist() == ["weights"]
    assert rank5.loc[rank5["kind"] == "mark", "tag"].tolist() == ["step 1"]


@pytest.fixture
def run_example(two_host_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], dict[str, Any]]:
    """Runs a documented example in a folder holding ``run.parquet`` (the two-host run); returns its variables."""
    export_run_parquet(load_run(two_host_run), tmp_path / "run.parquet")
    monkeypatch.chdir(tmp_path)

    def run(name: str) -> dict[str, Any]:
        namespace: dict[str, Any] = {}
        exec(readme_example(name), namespace)
        return namespace

    return run


def test_readme_duckdb_example_finds_each_ranks_peak(
    two_host_run: Path, run_example: Callable[[str], dict[str, Any]]
) -> None:
    peaks = run_example("duckdb")["peaks"]
    assert peaks.columns.tolist() == ["host", "rank", "device", "peak_bytes"]
    rows = peaks.values.tolist()
    assert rows == [
        ["node0", 0, "node0/rank0/GPU:0", 4 * MiB],
        ["node0", 1, "node0/rank1/GPU:0", 4 * MiB],
        ["node0", 2, "node0/rank2/GPU:0", 14 * MiB],
        ["node0", 3, "node0/rank3/GPU:0", 4 * MiB + 256 * KiB],
        ["node0", 4, "node0/rank4/GPU:0", 4 * MiB],
        ["node1", 5, "node1/rank5/GPU:0", 3 * MiB],
    ]
    summary = cluster_summary(load_run(two_host_run)).table  # the same peaks as the cluster summary's
    assert [r[3] for r in rows] == summary["peak_bytes"].tolist()


def test_readme_dask_dataframe_example_sums_bytes_allocated_per_host(
    run_example: Callable[[str], dict[str, Any]],
) -> None:
    per_host = run_example("dask-dataframe")["per_host"]
    # ten steps of 4 MiB on ranks 0, 1, 4; + 1 MiB leaked per step on rank 2; + 256 KiB per step on rank 3
    node0 = 3 * 10 * 4 * MiB + 10 * 5 * MiB + 10 * (4 * MiB + 256 * KiB)
    assert {str(k): int(v) for k, v in per_host.items()} == {"node0": node0, "node1": 3 * MiB}


def test_cli_exports_a_run_directory(two_host_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dataset"
    assert main(["export", str(two_host_run), "--to", "parquet", "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"Parquet dataset of 6 rank(s) written to {out} (partitioned by host and rank)\n"
    assert ds.dataset(out, partitioning="hive").count_rows() == sum(len(r.log) for r in load_run(two_host_run))
    # a non-empty output folder is refused and left as it was
    before = sorted(out.rglob("*"))
    assert main(["export", str(two_host_run), "--to", "parquet", "-o", str(out)]) == 2
    assert "exists and is not an empty directory" in capsys.readouterr().err
    assert sorted(out.rglob("*")) == before


def test_a_duplicate_rank_leaves_no_dataset(leaky_run: Path, tmp_path: Path) -> None:
    (leaky_run / "node0-rank1-copy.arrow").write_bytes((leaky_run / "node0-rank1.arrow").read_bytes())
    out = tmp_path / "out" / "run.parquet"
    with pytest.raises(
        ValueError, match=r"node0-rank1\.arrow and node0-rank1-copy\.arrow are both rank 1 on host node0"
    ):
        export_run_parquet(load_run(leaky_run), out)
    assert list((tmp_path / "out").iterdir()) == []


def test_host_names_are_percent_encoded_in_partitions(tmp_path: Path) -> None:
    write_rank(tmp_path, 0)
    log = gpuviz.load(tmp_path / "node0-rank0.arrow", progress=False)
    log.meta["run"] = RankInfo(0, 0, 1, "gpu node/7").as_meta()
    odd = tmp_path / "odd" / "x.arrow"
    odd.parent.mkdir()
    log.save(odd)
    out = tmp_path / "ds"
    assert export_run_parquet(load_run(odd), out) == [out / "host=gpu%20node%2F7" / "rank=0" / "part-0.parquet"]
    table = ds.dataset(out, partitioning="hive").to_table()
    assert set(table.column("host").to_pylist()) == {"gpu node/7"}
