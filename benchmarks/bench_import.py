"""Import benchmarks: time and peak memory of ``gpuviz.load`` per foreign format, against file size.

Run by hand, one format or all:
    .venv/bin/python benchmarks/bench_import.py [FORMAT ...] [--entries N]
Targets (issue 9): a 1M-entry PyTorch snapshot in <= 5 s; peak memory <= 3x the input file.

Each measurement runs ``gpuviz.load`` in a fresh Python process and reports its wall time and
the growth of the process's peak resident memory over what it held before the load.
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "traces"
_MEASURE = """
import resource, sys, time
import gpuviz
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start, cpu = time.perf_counter(), time.process_time()
log = gpuviz.load(sys.argv[1], progress=False)
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(len(log), seconds, cpu, (peak - before) * 1024)
"""


def measure(path: Path) -> dict[str, Any]:
    """Import ``path`` in a fresh process: events, wall and CPU seconds (the CPU time is what a
    machine shared with other work still measures fairly), peak memory growth (bytes), file size."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(path)], capture_output=True, text=True, check=True)
    events, seconds, cpu, grown = out.stdout.split()
    size = path.stat().st_size
    return {"file": path.name, "bytes": size, "events": int(events), "seconds": round(float(seconds), 2),
            "cpu_seconds": round(float(cpu), 2), "peak_growth_bytes": int(grown),
            "peak_x_input": round(int(grown) / size, 2)}  # fmt: skip


def repeated_snapshot(pattern: Path, entries: int) -> dict[str, Any]:
    """A snapshot of at least ``entries`` trace entries: copies of ``pattern``'s heap side by side,
    each shifted to its own address range and its trace after the previous one's in time (frame
    dicts shared between copies, as a real snapshot shares them between entries)."""
    with open(pattern, "rb") as file:
        base = pickle.load(file)
    trace = base["device_traces"][0]
    addresses = [s["address"] for s in base["segments"]] + [e["addr"] for e in trace if e.get("addr")]
    span = max(s["address"] + s["total_size"] for s in base["segments"]) - min(addresses)
    offset = 1 << max(span.bit_length(), 30)
    times = [e["time_us"] for e in trace if "time_us" in e]
    duration = (times[-1] - times[0] + 1) if times else 0
    segments: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    copy = 0
    while len(out) < entries:
        shift = copy * offset
        for s in base["segments"]:
            blocks = [{**b, "address": b["address"] + shift} for b in s["blocks"]]
            segments.append({**s, "address": s["address"] + shift, "blocks": blocks})
        for e in trace:
            moved = {**e, "addr": e["addr"] + shift} if e.get("addr") else dict(e)
            if "time_us" in e:
                moved["time_us"] = e["time_us"] + copy * duration
            out.append(moved)
        copy += 1
    return {**base, "segments": segments, "device_traces": [out]}


def bench_pytorch_snapshot(entries: int, work: Path) -> list[dict[str, Any]]:
    """Every real snapshot, then ``entries``-entry snapshots repeating two real files' patterns."""
    rows = [measure(path) for path in sorted(TRACES.glob("pt_snapshot_*.pickle"))]
    for pattern in ("pt_snapshot_assignment2_2026b.pickle", "pt_snapshot_cs336_ctx128_fullstep_2025.pickle"):
        path = work / f"{entries}_{pattern}"
        if not path.exists():
            with open(path, "wb") as file:
                pickle.dump(repeated_snapshot(TRACES / pattern, entries), file, protocol=4)
        rows.append(measure(path))
    return rows


FORMATS: dict[str, Callable[[int, Path], list[dict[str, Any]]]] = {
    "pytorch-snapshot": bench_pytorch_snapshot,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("formats", nargs="*", help=f"formats (default: all): {', '.join(FORMATS)}")
    parser.add_argument("--entries", type=int, default=1_000_000, help="entries of the synthetic traces")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gpuviz-bench-import")
    args = parser.parse_args()
    unknown = [name for name in args.formats if name not in FORMATS]
    if unknown:
        parser.error(f"unknown formats {unknown}; choose from {', '.join(FORMATS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    for name in args.formats or FORMATS:
        for row in FORMATS[name](args.entries, args.work):
            print(json.dumps({"format": name, **row}))


if __name__ == "__main__":
    main()
