"""Distributed runs: recording from many processes into one directory, loading the run,
the cluster summary with outliers, the ranks x time heatmap and the run's CLI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from runs import write_leaky_run, write_rank
from traces import trace_path

import gpuviz
from gpuviz import cluster_summary, load_run
from gpuviz.base.ranks import RankInfo, rank_file_name, rank_from_env
from gpuviz.base.units import MiB
from gpuviz.frontends.cli import main
from gpuviz.views.cluster import cluster_grid, cluster_heatmap, cluster_report_html

XPLANE = "tb_xplane_gpu_multiworker.xplane.pb"  # a real trace (GPUVIZ_TEST_TRACES)


# ------------------------------------------------------------------ rank identity
@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"RANK": "12", "LOCAL_RANK": "4", "WORLD_SIZE": "16"}, RankInfo(12, 4, 16, "node3")),
        ({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8"}, RankInfo(5, 1, 8, "node3")),
        ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"},
         RankInfo(3, 3, 4, "node3")),
        ({"PMI_RANK": "2", "PMI_SIZE": "3"}, RankInfo(2, 2, 3, "node3")),
        ({"RANK": "1", "SLURM_PROCID": "7", "SLURM_NTASKS": "9"}, RankInfo(1, 1, 2, "node3")),
        ({}, RankInfo(0, 0, 1, "node3")),
    ],
)  # fmt: skip
def test_rank_from_the_launchers_environment(env: dict[str, str], expected: RankInfo) -> None:
    assert rank_from_env(env, host="node3") == expected


def test_the_rank_file_is_named_from_host_and_rank() -> None:
    assert rank_file_name(RankInfo(12, 4, 16, "node3")) == "node3-rank12.arrow"
    assert rank_file_name(RankInfo(0, 0, 1, "a b/c")) == "a_b_c-rank0.arrow"
    assert rank_from_env({}).host == socket.gethostname()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "x"}, "RANK='x' is not an integer"),
        ({"RANK": "-1"}, "RANK='-1' is negative"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4 is not below WORLD_SIZE=4"),
    ],
)
def test_bad_rank_variables_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rank_from_env(env, host="h")


# ------------------------------------------------------- many real processes recording
CHILD = textwrap.dedent(
    """
    import os
    import numpy as np
    import gpuviz

    gpuviz.config.set_simulated_gpus(1, "1GiB")
    rank = int(os.environ["RANK"])
    for step in range(30):
        gpuviz.mark(f"rank{rank} step{step}")
        kept = gpuviz.empty((256 * (rank + 1) * (step + 1),), np.float32)
        del kept
    log = gpuviz.default_log()
    log.close()
    print(len(log), len(log.filter(kind="alloc")))
    """
)


def test_processes_record_concurrently_into_one_run(tmp_path: Path) -> None:
    """Four processes with torchrun's variables record at once into GPUVIZ_LOG_DIR; the run
    holds each process's events once, under its rank and host, with prefixed device names."""
    run_dir = tmp_path / "run"
    procs = []
    for rank in range(4):
        env = {**os.environ, "GPUVIZ_LOG_DIR": str(run_dir), "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": "4"}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, text=True))
    written = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        written.append(tuple(int(n) for n in out.split()))
    host = socket.gethostname()
    assert sorted(p.name for p in run_dir.iterdir()) == [f"{host}-rank{r}.arrow" for r in range(4)]
    run = load_run(run_dir)
    assert len(run) == 4
    for position, rank_log in enumerate(run):
        rank = rank_log.info.rank
        assert rank == position and rank_log.info == RankInfo(rank, rank, 4, host)
        log = rank_log.log
        events, allocations = written[rank]
        assert len(log) == events and log["seq"].tolist() == list(range(events))
        assert len(log.filter(kind="alloc")) == allocations
        assert set(log.device_names) == {f"{host}/rank{rank}/CPU:0", f"{host}/rank{rank}/GPU:0"}
        labels = [e.tag for e in log if e.kind == "mark"]
        assert labels == [f"rank{rank} step{s}" for s in range(30)]
    summary = cluster_summary(run)
    assert summary.table["device"].tolist() == [f"{host}/rank{r}/GPU:0" for r in range(4)]
    assert summary.table["peak_bytes"].tolist() == [4 * 256 * (r + 1) * 30 for r in range(4)]


def test_record_run_in_python_names_the_file_from_the_environment(tmp_path: Path) -> None:
    code = (
        "import sys, gpuviz, numpy as np; gpuviz.config.set_simulated_gpus(1, '1GiB'); "
        "log = gpuviz.record_run(sys.argv[1]); gpuviz.empty((1024,), np.float32); log.close()"
    )
    env = {**os.environ, "SLURM_PROCID": "6", "SLURM_LOCALID": "2", "SLURM_NTASKS": "8"}
    env.pop("RANK", None)
    before = time.time_ns()
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, check=True, timeout=120)
    after = time.time_ns()
    host = socket.gethostname()
    log = gpuviz.load(tmp_path / f"{host}-rank6.arrow")
    offset = log.meta["run"]["clock_offset_ns"]  # the wall-clock anchor: event time + offset = epoch ns
    assert log.meta["run"] == {"rank": 6, "local_rank": 2, "world_size": 8, "host": host, "clock_offset_ns": offset}
    assert before < int(log["time_ns"].min()) + offset < int(log["time_ns"].max()) + offset < after
    assert log.device_names == ["CPU:0", "GPU:0"]  # the prefix is applied when a run is loaded
    assert load_run(tmp_path).open(0).log.device_names == [f"{host}/rank6/CPU:0", f"{host}/rank6/GPU:0"]


# ---------------------------------------------------------- a constructed leaking run
@pytest.fixture
def leaky_run(tmp_path: Path) -> Path:
    return write_leaky_run(tmp_path)


def test_a_leaking_rank_is_the_one_outlier(leaky_run: Path) -> None:
    summary = cluster_summary(load_run(leaky_run))
    table = summary.table
    assert table["device"].tolist() == [f"node0/rank{r}/GPU:0" for r in range(5)]
    assert table["peak_bytes"].tolist() == [4 * MiB, 4 * MiB, 14 * MiB, 4 * MiB + 256 * 1024, 4 * MiB]
    assert table["end_bytes"].tolist() == [0, 0, 10 * MiB, 0, 0]
    assert table["growth_bytes"].tolist() == [0, 0, 5 * MiB, 0, 0]  # end minus step 4's end (the middle)
    assert table["peak_time_ns"].tolist()[2] == 9_000_000 + 3  # step 9: split, alloc (leak), split, alloc
    assert table["ooms"].tolist() == [0] * 5 and table["pool_at_peak"].tolist() == [64 * MiB] * 5
    assert table["outlier"].tolist() == ["", "", "peak,growth", "", ""]
    assert summary.outliers["rank"].tolist() == [2]
    # rank 3's peak, 6.25 % over the median, passes at 10 %, not at 5 %
    at_5 = cluster_summary(load_run(leaky_run), threshold=0.05).table["outlier"].tolist()
    assert at_5 == ["", "", "peak,growth", "peak", ""]


def test_the_heatmap_holds_each_ranks_bytes_in_use_over_time(leaky_run: Path) -> None:
    summary = cluster_summary(load_run(leaky_run))
    t_ns, z = cluster_grid(summary, columns=10)
    assert t_ns[0] == 0 and len(t_ns) == 10
    assert z[2].tolist() == [float((5 + k) * MiB) for k in range(10)]
    assert z[0].tolist() == [float(4 * MiB)] * 10
    figure = cluster_heatmap(summary)
    assert list(figure.data[0].y) == ["node0/rank0/GPU:0", "node0/rank1/GPU:0", "node0/rank2/GPU:0 ⚠",
                                      "node0/rank3/GPU:0", "node0/rank4/GPU:0"]  # fmt: skip
    with pytest.raises(ValueError, match="metric must be one of"):
        cluster_grid(summary, "bytes")


def test_two_files_claiming_one_rank_are_refused(leaky_run: Path) -> None:
    (leaky_run / "copy.arrow").write_bytes((leaky_run / "node0-rank1.arrow").read_bytes())
    with pytest.raises(ValueError, match=r"node0-rank1\.arrow and copy\.arrow are both rank 1 on host node0"):
        cluster_summary(load_run(leaky_run))


def test_a_cpu_only_run_counts_its_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Ranks whose logs name no GPU are summarised by the devices they used, not dropped."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for rank in range(2):
        write_rank(run_dir, rank, device="CPU:0", leak=MiB if rank == 1 else 0)
    table = cluster_summary(load_run(run_dir)).table
    assert list(table["rank"]) == [0, 1] and list(table["device"]) == ["node0/rank0/CPU:0", "node0/rank1/CPU:0"]
    assert list(table["peak_bytes"]) == [4 * MiB, 4 * MiB + 10 * MiB]
    main(["summary", str(run_dir)])
    assert "2 ranks" in capsys.readouterr().out


def test_an_empty_run_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no log files"):
        load_run(tmp_path)


def test_cli_summary_and_report_of_a_run_directory(leaky_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(leaky_run)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "run: 5 ranks on 1 hosts, 5 devices"
    assert "node0/rank2/GPU:0: peak 14 MiB at 0.009 s" in out and "OUTLIER (peak,growth)" in out
    assert out.count("OUTLIER") == 1
    assert out.splitlines()[-1].endswith("node0/rank2/GPU:0")
    report = leaky_run.parent / "run.html"
    assert main(["report", str(leaky_run), "-o", str(report), "--cdn", "--rank-reports", "none"]) == 0
    page = report.read_text(encoding="utf-8")
    assert page.count('class="outlier"') == 1 and page.count("Plotly.newPlot") == 2
    assert page == cluster_report_html(cluster_summary(load_run(leaky_run)), plotlyjs="cdn",
                                       title=f"gpuviz run: {leaky_run.name}")  # fmt: skip


# ------------------------------------------------------------------ imported traces
def test_the_8_gpu_xplane_is_a_run_of_8_gpu_rows() -> None:
    summary = cluster_summary(load_run(trace_path(XPLANE)))
    table = summary.table
    assert table["device"].tolist() == [f"tb_xplane_gpu_multiworker/rank0/GPU:{i}" for i in range(8)]
    assert table["rank"].tolist() == [0] * 8
    active = table["peak_bytes"] > 0  # the trace has allocator events on GPUs 1, 4 and 6 only
    assert table.loc[active, "device"].str[-5:].tolist() == ["GPU:1", "GPU:4", "GPU:6"]
    log = gpuviz.load(trace_path(XPLANE), progress=False)
    assert table["peak_bytes"].tolist() == [gpuviz.peak(log, f"GPU:{i}").bytes for i in range(8)]
    # idle GPUs are never outliers; GPU:1 (7.5 KiB against ~2 GiB on GPUs 4 and 6) is
    assert table["peak_bytes"].tolist()[1] == 7680
    assert [flag.split(",")[0] for flag in table["outlier"]] == ["", "peak", "", "", "", "", "", ""]
    _, z = cluster_grid(summary, columns=50)
    assert z.shape == (8, 50)


def test_per_rank_pytorch_snapshots_join_as_ranks_in_file_order() -> None:
    names = ["pt_snapshot_assignment2_2026a", "pt_snapshot_assignment2_2026b"]
    folder = trace_path(f"{names[0]}.pickle").parent
    assert trace_path(f"{names[1]}.pickle").parent == folder
    table = cluster_summary(load_run(str(folder / "pt_snapshot_assignment2_2026*.pickle"))).table
    assert table["rank"].tolist() == [0, 1] and table["host"].tolist() == names
    assert table["device"].tolist() == [f"{name}/rank{r}/GPU:0" for r, name in enumerate(names)]
    peaks = [gpuviz.peak(gpuviz.load(trace_path(f"{name}.pickle"), progress=False), "GPU:0").bytes for name in names]
    assert table["peak_bytes"].tolist() == peaks == [3861684736, 13927832064]


def test_magic_start_with_a_run_dir_records_this_rank_to_its_file(  # type: ignore[no-untyped-def]
    runtime_log, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    if "GpuvizMagics" not in shell.magics_manager.registry:
        shell.run_line_magic("load_ext", "gpuviz")
    magics = shell.magics_manager.registry["GpuvizMagics"]
    magics.last = magics.recording = magics.dashboard = None
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with capture_output():
        shell.run_line_magic("gpuviz", f"start --no-live --run-dir {tmp_path}")
    shell.run_cell("import numpy as np, gpuviz; a = gpuviz.asarray(np.ones(100))")
    shell.run_line_magic("gpuviz", "stop")
    shell.run_cell("%reset -f")
    host = socket.gethostname()
    saved = gpuviz.load(tmp_path / f"{host}-rank3.arrow", progress=False)
    assert saved.meta["run"] == {"rank": 3, "local_rank": 3, "world_size": 4, "host": host,
                                 "clock_offset_ns": saved.meta["run"]["clock_offset_ns"]}  # fmt: skip
    assert saved.truncated is False
    assert [e.tag for e in saved.filter(kind="mark")] == ["gpuviz start", "gpuviz stop"]
    assert len(saved) == len(magics.last)


def test_growth_compares_the_halves_of_the_run_not_two_instants() -> None:
    """Identical steps give the same growth wherever their middle and end instants fall in a
    step; a leak shows as half of what it kept."""
    import numpy as np

    from gpuviz.analysis.cluster import growth

    times = np.arange(12, dtype=np.int64) * 10
    steady = np.array([0, 100, 0] * 4)  # each step allocates 100 and frees it
    shifted = np.array([100, 0, 0] * 4)  # the same steps, out of phase
    assert growth(steady, times) == growth(shifted, times) == 0
    leaking = np.arange(12) * 8  # keeps 8 bytes per event
    assert growth(leaking, times) == 48  # halves' means 20 and 68
    assert growth(np.array([5]), np.array([0])) == 0
