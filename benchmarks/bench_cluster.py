"""Distributed-run benchmarks (issue 14): the cluster summary of a big run on Dask, and the
per-rank report of a wide run.

Run by hand:  .venv/bin/python benchmarks/bench_cluster.py [--ranks 64] [--events 1000000]
                  [--cache DIR] [--report-ranks 1024] [--skip-big] [--skip-report]

(a) A run of ``--ranks`` logs of ``--events`` events each (8 ranks per host, all running the
same data-parallel steps, rank 13 also leaking 2 MiB every 2000 steps), recorded by the
native allocator as the runtime records (the mixed workload of bench_core: sizes
log-uniform 64 B .. 16 MiB, ~1000 live buffers), is generated once into ``--cache``
(reused when present; 64 x 1M events = 5.5 GB). Its cluster summary is timed in one
process (``cluster_summary``), on a 2-worker ``LocalCluster`` (``gpuviz.dask.profile_run``)
(also with ``MALLOC_TRIM_THRESHOLD_`` unset in the workers: ``dask-no-trim``) and on the
local process pool (``profile_run`` without a client); then the run report
(``cluster_report_html``) from the summary. Each runs in a fresh interpreter, the three
modes interleaved ``--repeats`` times.
Targets: the client's peak memory <= 10 % of the logs' total size; no process holds more
than about one rank's log.

(b) A run of ``--report-ranks`` small logs (2000 events each): the report's size (target
<= 15 MB with plotly.js inline) and Chromium's time to load it and draw the first heatmap
(target <= 3 s).

Memory: ``VmHWM`` (peak resident set, /proc/PID/status) of each process; the client's is
read by itself at the end, the workers' are sampled every 50 ms by a thread of the client
(a high-water mark: only the last 50 ms of a worker's life could be missed). Resident sets
count the pages of memory-mapped log files that were touched. Every time is wall-clock,
with CPU seconds of the processes involved in brackets: the machine's 2 cores are shared.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_core import mixed_workload
from gpuviz import EventLog, SimUpstream
from gpuviz.base.ranks import RankInfo, rank_file_name
from gpuviz.base.units import MiB
from gpuviz.capture.native import allocator_class

RANKS_PER_HOST = 8
LEAKY_RANK = 13


def write_rank(folder: Path, rank: int, world: int, events: int) -> Path:
    """One rank's log of about ``events`` events (``meta["run"]`` set) saved in ``folder``."""
    info = RankInfo(rank, rank % RANKS_PER_HOST, world, f"node{rank // RANKS_PER_HOST}")
    log = EventLog(meta={"run": info.as_meta()})
    alloc = allocator_class()(SimUpstream("64GiB"), growth=True, device="GPU:0", log=log)
    ops = mixed_workload(100_000)  # data-parallel: every rank runs the same steps
    live = [alloc.allocate(256) for _ in range(1000)]
    kept = []
    allocate, free = alloc.allocate, alloc.free
    i = 0
    while len(log) < events:
        for _ in range(min(2000, max(1, (events - len(log)) // 3))):
            size, victim = ops[i % len(ops)]
            i += 1
            free(live[victim])
            live[victim] = allocate(size)
        if rank == LEAKY_RANK:
            kept.append(allocate(2 * MiB))
        log.flush()
    path = folder / rank_file_name(info)
    log.save(path)
    return path


def generate(folder: Path, ranks: int, events: int, workers: int = 2) -> list[Path]:
    """The run in ``folder`` (generated when it does not hold ``ranks`` logs yet)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = sorted(folder.glob("*.arrow"))
    if len(paths) == ranks:
        return paths
    for path in paths:
        path.unlink()
    start = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        paths = sorted(pool.map(write_rank, [folder] * ranks, range(ranks), [ranks] * ranks, [events] * ranks))
    size = sum(p.stat().st_size for p in paths)
    print(f"generated {ranks} logs x {events} events in {time.perf_counter() - start:.0f} s: {size / 1e9:.2f} GB")
    return paths


# ---------------------------------------------------------------- measured in a child
def hwm(pid: int | str = "self") -> int:
    """Peak resident set of process ``pid`` in bytes (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class DescendantPeaks:
    """Samples the peak resident set of every descendant process while running."""

    def __init__(self) -> None:
        import psutil

        self.me = psutil.Process()
        self.peaks: dict[int, int] = {}
        self.cpu: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for child in self.me.children(recursive=True):
                peak = hwm(child.pid)
                if peak:
                    self.peaks[child.pid] = max(self.peaks.get(child.pid, 0), peak)
                    try:
                        times = child.cpu_times()
                        self.cpu[child.pid] = times.user + times.system
                    except Exception:
                        pass
                    if child.pid not in self.names:
                        try:
                            self.names[child.pid] = " ".join(child.cmdline())[-60:]
                        except Exception:
                            self.names[child.pid] = "?"
            self.stop.wait(0.05)

    def __enter__(self) -> DescendantPeaks:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def child(mode: str, folder: str) -> dict[str, Any]:
    """Run one measurement in this (fresh) process; returns what it measured."""
    import gpuviz
    from gpuviz.dask import profile_run
    from gpuviz.views.cluster import cluster_report_html

    result: dict[str, Any] = {"mode": mode}
    run = gpuviz.load_run(folder)
    if mode.startswith("dask"):
        import dask
        from distributed import Client, LocalCluster

        if mode == "dask-no-trim":  # Dask's nanny sets MALLOC_TRIM_THRESHOLD_=65536 in workers by default
            environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ"))
            environ.pop("MALLOC_TRIM_THRESHOLD_", None)
            dask.config.set({"distributed.nanny.pre-spawn-environ": environ})
        start = time.perf_counter()
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
        client.run(lambda: __import__("gpuviz.dask") and None)  # workers import gpuviz before the clock starts
        result["cluster_start_s"] = time.perf_counter() - start
        result["worker_idle_rss"] = list(client.run(lambda: hwm()).values())
        trim = client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
        result["worker_malloc_trim"] = sorted(set(map(str, trim.values())))
        worker_cpu = client.run(time.process_time)
    result["client_base_rss"] = hwm()
    cpu = time.process_time()
    start = time.perf_counter()
    with DescendantPeaks() as peaks:
        if mode == "one-process":
            summary = gpuviz.cluster_summary(run)
        elif mode.startswith("dask"):
            summary = profile_run(run, client)
        else:
            summary = profile_run(run)
    result["summary_s"] = time.perf_counter() - start
    result["client_cpu_s"] = time.process_time() - cpu
    if mode.startswith("dask"):
        after = client.run(time.process_time)
        result["worker_cpu_s"] = sum(after[w] - worker_cpu[w] for w in after)
        result["worker_peak_rss"] = list(client.run(lambda: hwm()).values())
        client.close()
        cluster.close()
    elif mode == "process-pool":
        result["worker_cpu_s"] = sum(peaks.cpu.values())  # as last sampled
        result["worker_peak_rss"] = sorted(peaks.peaks.values())[-min(len(run), os.cpu_count() or 1) :]
        result["descendants"] = {peaks.names[p]: v for p, v in peaks.peaks.items()}
    start = time.perf_counter()
    page = cluster_report_html(summary, plotlyjs="cdn")
    result["report_s"] = time.perf_counter() - start
    result["report_bytes"] = len(page.encode())
    result["client_peak_rss"] = hwm()
    result["rows"] = len(summary.table)
    result["outliers"] = dict(zip(summary.outliers["rank"].tolist(), summary.outliers["outlier"], strict=True))
    return result


def measure(mode: str, folder: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(folder)], capture_output=True, text=True, check=False
    )
    if proc.returncode:
        raise RuntimeError(f"{mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def bench_big(folder: Path, ranks: int, events: int, repeats: int, out: Any = None) -> None:
    paths = generate(folder, ranks, events)
    sizes = [p.stat().st_size for p in paths]
    total = sum(sizes)
    print(f"run: {ranks} logs x {events} events, {total / 1e9:.2f} GB (largest log {max(sizes) / 1e6:.0f} MB)")
    print(f"load average before: {os.getloadavg()[0]:.2f} (2 cores, shared)")
    mb = 1e6
    results: dict[str, list[float]] = {}
    for mode in ("one-process", "dask", "dask-no-trim", "process-pool") * repeats:
        r = measure(mode, folder)
        results.setdefault(mode, []).append(r["summary_s"])
        line = f"{mode:>13}: summary {r['summary_s']:6.1f} s [client CPU {r['client_cpu_s']:.1f} s"
        if "worker_cpu_s" in r:
            line += f", workers CPU {r['worker_cpu_s']:.1f} s"
        peak, base = r["client_peak_rss"], r["client_base_rss"]
        line += (
            f"]; client peak RSS {peak / mb:.0f} MB (after imports {base / mb:.0f} MB) = {peak / total:.1%} of the logs"
        )
        print(line)
        if "worker_peak_rss" in r:
            idle = r.get("worker_idle_rss")
            print(
                "               worker peak RSS "
                + ", ".join(f"{v / mb:.0f} MB" for v in r["worker_peak_rss"])
                + (f" (idle {', '.join(f'{v / mb:.0f}' for v in idle)} MB)" if idle else "")
                + f"; one log is {max(sizes) / mb:.0f} MB"
            )
        if "worker_malloc_trim" in r:
            print(f"               workers' MALLOC_TRIM_THRESHOLD_: {r['worker_malloc_trim']}")
        if "cluster_start_s" in r:
            print(f"               LocalCluster start (2 workers, gpuviz imported): {r['cluster_start_s']:.1f} s")
        print(f"               report from the summary: {r['report_s']:.2f} s, {r['report_bytes'] / mb:.2f} MB (cdn)")
        print(f"               rows {r['rows']}, outliers {r['outliers']}")
    best = {mode: min(times) for mode, times in results.items()}
    print(f"best of {repeats}: " + ", ".join(f"{mode} {t:.1f} s" for mode, t in best.items()))
    print(f"speed-up of 2 Dask workers over one process: {best['one-process'] / best['dask']:.2f}x; process pool "
          f"({os.cpu_count()} workers): {best['one-process'] / best['process-pool']:.2f}x")  # fmt: skip
    if out is not None:
        for mode, seconds in best.items():
            out.add(f"cluster summary of {ranks} x {events:,} events, {mode} (best of {repeats})", seconds, "s")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def bench_report(n_ranks: int, cache: Path, out: Any = None) -> None:
    from gpuviz.dask import profile_run
    from gpuviz.views.cluster import cluster_report_html

    folder = cache / f"{n_ranks}x2000"
    generate(folder, n_ranks, 2000)
    start = time.perf_counter()
    summary = profile_run(folder)
    print(f"report run: {n_ranks} ranks x 2000 events; summary (process pool) {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    page = cluster_report_html(summary, title=f"{n_ranks} ranks")
    print(f"  report HTML built in {time.perf_counter() - start:.2f} s")
    # the same report of 16 ranks: what loading plotly.js alone costs on this machine now
    few = dataclasses.replace(summary, table=summary.table.iloc[:16].reset_index(drop=True), series=summary.series[:16])
    floor = cluster_report_html(few, title="16 ranks")
    with tempfile.TemporaryDirectory() as tmp:
        path, small = Path(tmp) / "run.html", Path(tmp) / "few.html"
        path.write_text(page, encoding="utf-8")
        small.write_text(floor, encoding="utf-8")
        print(
            f"  report size (plotly.js's cartesian bundle inline): {path.stat().st_size / 1e6:.2f} MB (target <= 15 MB)"
        )
        if out is not None:
            out.add(f"run report of {n_ranks} ranks: size", path.stat().st_size / 1e6, "MB")
        drawn = []
        for attempt in range(3):
            load_s, drawn_s = chromium_load(path)
            drawn.append(drawn_s)
            floor_load, floor_drawn = chromium_load(small)
            print(f"  Chromium #{attempt + 1}: load event {load_s:.2f} s, heatmap drawn {drawn_s:.2f} s "
                  f"(target <= 3 s); 16 ranks: {floor_load:.2f} s, {floor_drawn:.2f} s; "
                  f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
        if out is not None:
            out.add(f"run report of {n_ranks} ranks: Chromium draws the heatmap (best of 3)", min(drawn), "s")


def chromium_load(path: Path) -> tuple[float, float]:
    """Seconds from navigation start to the load event, and to the heatmaps drawn (the fragmentation
    one is drawn when scrolled to: ``bench_plotlyjs.py`` times that too)."""
    from benchmarks.bench_plotlyjs import chromium_load as load_and_draw

    load, drawn, _ = load_and_draw(path)
    return load, drawn


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script too
    from benchmarks._results import Results, add_json_option

    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "gpuviz-bench-cluster")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--report-ranks", type=int, default=1024)
    parser.add_argument("--skip-big", action="store_true")
    parser.add_argument("--skip-report", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "DIR"), help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    results = Results("cluster", "Distributed runs: the cluster summary on Dask, the report of a wide run.", vars(args))
    if not args.skip_big:
        bench_big(args.cache / f"{args.ranks}x{args.events}", args.ranks, args.events, args.repeats, results)
    if not args.skip_report:
        bench_report(args.report_ranks, args.cache, results)
    results.write(args.json)


if __name__ == "__main__":
    main()
