"""Live dashboard benchmark: a real kernel (jupyter_client) runs ``%%gpuviz`` cells and this
script times the widget messages as a front-end receives them on iopub.

Reported per cell: first draw (request -> the first figure the dashboard sends), live
updates while the cell ran (each changes the header) and their rate, the dashboard thread's CPU
time as a share of the cell's wall time and per update (what it takes from the cell, less
sensitive to load from elsewhere than wall times), the cell's own time with the dashboard
against the same cell run plainly (the cost), and the empty-cell overhead.

Run by hand:  .venv/bin/python benchmarks/bench_live.py [--busy-ops N]

``--busy-ops``: ops in the busy cell (default 40000; since small ops got cheaper, 40000 take
well under a second, so ``--busy-ops 400000`` gives the ~7 s busy cell of earlier measurements).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from jupyter_client.manager import start_new_kernel

SLEEPY = """
import time, numpy as np, gpuviz
x = gpuviz.asarray(np.ones((32, 32)))
start, cpu = time.perf_counter(), time.thread_time()
for _ in range(100):
    y = x @ x
    time.sleep(0.1)
print(f"cell {time.perf_counter() - start:.4f} {time.thread_time() - cpu:.4f}")
"""
BUSY = """
import time, numpy as np, gpuviz
x = gpuviz.asarray(np.ones((16, 16)))
keep = []
start, cpu = time.perf_counter(), time.thread_time()
for i in range({ops}):
    y = x @ x
    if i % 100 == 0:
        keep.append(y)
print(f"cell {time.perf_counter() - start:.4f} {time.thread_time() - cpu:.4f}")
"""

REPEAT = 3
CPU = (
    "board = get_ipython().magics_manager.registry['GpuvizMagics'].dashboard\n"
    "print(f'cell {board.live_cpu_seconds:.6f} {board.live_updates}')"
)  # its thread's CPU time, its updates


def run(client: Any, code: str) -> dict[str, Any]:
    """Execute ``code``; the times (s, from the request) of the widget messages and the cell's own time."""
    while True:  # drain what earlier cells' dashboards sent after they ended (their final draw)
        try:
            client.get_iopub_msg(timeout=2)
        except Exception:
            break
    start = time.perf_counter()
    msg_id = client.execute(code)
    first_draw = None
    updates: list[float] = []
    cell = None
    cell_cpu = None
    done = None
    while True:
        msg = client.get_iopub_msg(timeout=300)
        now = time.perf_counter() - start
        kind, content = msg["msg_type"], msg["content"]
        if msg["parent_header"].get("msg_id") != msg_id and not kind.startswith("comm_"):
            continue  # widget messages sent from a thread may carry another parent
        if kind in ("comm_msg", "comm_open"):
            data = content.get("data", {})
            state = data.get("state", {})
            custom = data.get("content", {}) if data.get("method") == "custom" else {}
            if first_draw is None and ("map_json" in state or "timeline_json" in state or "extend" in custom):
                first_draw = now
            if "header" in state and "running" in state["header"]:  # one per live update
                updates.append(now)
        elif kind == "stream" and content["text"].startswith("cell "):
            words = content["text"].split()
            cell = float(words[1])
            cell_cpu = float(words[2]) if len(words) > 2 else None
        elif kind == "error":
            raise RuntimeError("\n".join(content["traceback"]))
        elif kind == "status" and content["execution_state"] == "idle":
            done = now
            break
    return {"first_draw": first_draw, "updates": updates, "cell": cell, "cell_cpu": cell_cpu, "total": done}


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script too
    from benchmarks._results import Results, add_json_option

    parser = argparse.ArgumentParser()
    parser.add_argument("--busy-ops", type=int, default=40000)
    add_json_option(parser)
    args = parser.parse_args()
    results = Results("live", "The live dashboard in a real kernel: first draw, updates, cost to the cell.", vars(args))
    busy = BUSY.replace("{ops}", str(args.busy_ops))
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        run(client, "%load_ext gpuviz")
        cold = run(client, "%%gpuviz\npass")  # the kernel's first: sends plotly.js, starts the runtime
        drawn = f"{cold['first_draw'] * 1e3:.0f} ms" if cold["first_draw"] is not None else "after the cell"
        print(f"first %%gpuviz cell of a kernel: {cold['total'] * 1e3:.0f} ms, first draw {drawn}")
        results.add("first %%gpuviz cell of a kernel", cold["total"] * 1e3, "ms")
        empty = [run(client, "%%gpuviz\npass")["total"] for _ in range(5)]
        plain = [run(client, "pass")["total"] for _ in range(5)]
        print(f"empty %%gpuviz cell: {min(empty) * 1e3:.0f} ms (plain empty cell {min(plain) * 1e3:.0f} ms)"
              f" -> overhead {(min(empty) - min(plain)) * 1e3:.0f} ms")  # fmt: skip
        results.add("empty %%gpuviz cell over a plain empty cell (best of 5)", (min(empty) - min(plain)) * 1e3, "ms")
        for name, code in (("sleepy 10 s cell", SLEEPY), ("busy cell", busy)):  # best of REPEAT each
            bares, lives, cpus, counts = [], [], [], []
            for _ in range(REPEAT):  # alternated, so that load from elsewhere hits both alike
                bares.append(run(client, code))
                lives.append(run(client, "%%gpuviz\n" + code))
                spent = run(client, CPU)  # the dashboard thread's CPU time during the cell, its updates
                cpus.append(spent["cell"])
                counts.append(spent["cell_cpu"])
            best = min(range(REPEAT), key=lambda i: lives[i]["cell"])
            bare, live, cpu, count = min(b["cell"] for b in bares), lives[best], cpus[best], counts[best]
            during = [t for t in live["updates"] if t <= live["cell"]]
            rate = len(during) / live["cell"]
            print(f"{name}: plain {bare:.2f} s, with the live dashboard {live['cell']:.2f} s"
                  f" ({100 * (live['cell'] / bare - 1):+.1f} %); dashboard thread CPU {cpu * 1e3:.0f} ms"
                  f" = {100 * cpu / live['cell']:.1f} % of the cell, {1e3 * cpu / max(count, 1):.1f} ms an update;"
                  f" first draw {live['first_draw'] * 1e3:.0f} ms"
                  f" after the request; {len(during)} updates while it ran ({rate:.1f} Hz)")  # fmt: skip
            results.add(f"{name}: cost of the live dashboard (best of {REPEAT})", 100 * (live["cell"] / bare - 1), "%")
            results.add(f"{name}: dashboard thread CPU, share of the cell", 100 * cpu / live["cell"], "%")
            results.add(f"{name}: live updates while it ran", rate, "Hz")
            if live["first_draw"] is not None:
                results.add(f"{name}: first draw after the request", live["first_draw"] * 1e3, "ms")
            pairs = ", ".join(f"{b['cell']:.2f}/{lv['cell']:.2f} s {100 * (lv['cell'] / b['cell'] - 1):+.0f} %"
                              f" (main thread CPU {b['cell_cpu']:.2f}/{lv['cell_cpu']:.2f} s)"
                              f" {len([t for t in lv['updates'] if t <= lv['cell']]) / lv['cell']:.1f} Hz,"
                              f" thread CPU {100 * c / lv['cell']:.1f} %, {1e3 * c / max(n, 1):.1f} ms an update"
                              for b, lv, c, n in zip(bares, lives, cpus, counts, strict=True))  # fmt: skip
            print(f"  each alternated pair, plain/live: {pairs}")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    results.write(args.json)


if __name__ == "__main__":
    main()
