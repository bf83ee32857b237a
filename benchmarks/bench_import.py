"""Import benchmarks: time and peak memory of ``gpuviz.load`` per foreign format, against file size.

Run by hand, one format or all:
    .venv/bin/python benchmarks/bench_import.py [FORMAT ...] [--entries N]
Targets (issue 9): a 1M-entry PyTorch snapshot in <= 5 s; peak memory <= 3x the input file.
``--entries`` also sizes the synthetic XSpace of ``xplane`` (memory events) and the synthetic
profile of ``xprof-memory-profile`` (snapshots).

Each measurement runs ``gpuviz.load`` in a fresh Python process and reports its wall time and
the growth of the process's peak resident memory over what it held before the load.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pickle
import random
import shutil
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

def peak_bytes():
    # VmHWM: this process's own high-water mark (ru_maxrss keeps the parent's across fork+exec on Linux)
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

before, peak_before = resource.getrusage(resource.RUSAGE_SELF), peak_bytes()
start = time.perf_counter()
log = gpuviz.load(sys.argv[1], progress=False)
seconds = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF)
print(len(log), seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
      peak_bytes() - peak_before)
"""


def measure(path: Path) -> dict[str, Any]:
    """Import ``path`` in a fresh process: events, wall and CPU seconds, peak memory growth (bytes),
    file size (the machine may be shared: CPU seconds are the steadier number)."""
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


def _with_uncompressed(row: dict[str, Any], path: Path) -> dict[str, Any]:
    """``row`` plus the decompressed size and peak memory against it (gzip files)."""
    if path.suffix != ".gz":
        return row
    with gzip.open(path, "rb") as file:
        size = sum(len(block) for block in iter(lambda: file.read(1 << 20), b""))
    return {**row, "uncompressed_bytes": size, "peak_x_uncompressed": round(row["peak_growth_bytes"] / size, 2)}


def bench_pytorch_profiler(entries: int, work: Path) -> list[dict[str, Any]]:
    """The real profiler traces (the 54 MB V100 trace: target <= 3 s), compressed and not."""
    rows = []
    for path in sorted(TRACES.glob("pt_profiler_*.json.gz")):
        rows.append(_with_uncompressed(measure(path), path))
        plain = work / path.name.removesuffix(".gz")
        if not plain.exists():
            with gzip.open(path, "rb") as source, open(plain, "wb") as target:
                shutil.copyfileobj(source, target)
        rows.append(measure(plain))
    return rows


def bench_rmm_csv(entries: int, work: Path) -> list[dict[str, Any]]:
    """A synthetic RMM log of ``entries`` rows: allocate/free pairs over a few live buffers."""
    path = work / f"rmm_{entries}.dev0.csv"
    if not path.exists():
        with open(path, "w") as file:
            file.write("Thread,Time,Action,Pointer,Size,Stream\n")
            live: list[tuple[int, int]] = []
            for row in range(entries):
                us = row * 10
                stamp = f"{us // 3_600_000_000 % 24:02d}:{us // 60_000_000 % 60:02d}:{us // 1_000_000 % 60:02d}"
                stamp += f".{us % 1_000_000:06d}"
                if len(live) < 64 and (row % 3 != 2 or not live):
                    address, size = 0x7F0000000000 + (row % 4096) * (1 << 21), 256 * (1 + row % 4096)
                    if all(a != address for a, _ in live):
                        live.append((address, size))
                        file.write(f"140000,{stamp},allocate,{address:#x},{size},0\n")
                        continue
                address, size = live.pop(0)
                file.write(f"140000,{stamp},free,{address:#x},{size},0\n")
    return [measure(path)]


def bench_tf_placement(entries: int, work: Path) -> list[dict[str, Any]]:
    """The real Colab placement logs, and one of ``entries`` eager lines."""
    rows = [measure(path) for path in sorted(TRACES.glob("tf_placement_*"))]
    path = work / f"placement_{entries}.log"
    if not path.exists():
        device = "/job:localhost/replica:0/task:0/device:GPU:0"
        with open(path, "w") as file:
            file.writelines(f"Executing op Op{row % 50} in device {device}\n" for row in range(entries))
    rows.append(measure(path))
    return rows


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def synthetic_xspace(events: int, seed: int = 0) -> bytes:
    """An XSpace with one host line of ``events`` memory events on ``GPU_0_bfc`` (field numbers as
    in gpuviz/importers/xplane.py): allocations of random sizes at fresh addresses, each freed later."""
    names = ["allocator_name", "addr", "requested_bytes", "allocation_bytes", "bytes_allocated", "tf_op", "shape",
             "data_type", "region_type"]  # fmt: skip
    stat_ids = {name: i + 1 for i, name in enumerate(names)}

    def stat(name: str, value: int | str) -> bytes:
        payload = _field(5, value.encode()) if isinstance(value, str) else _field(4, value)
        return _field(4, _field(1, stat_ids[name]) + payload)

    rng = random.Random(seed)
    body = bytearray()
    live: list[tuple[int, int]] = []
    address, in_use = 1 << 40, 0
    for i in range(events):
        if live and (rng.random() < 0.5 or i + len(live) >= events):
            addr, size = live.pop(rng.randrange(len(live)))
            in_use -= size
            stats = stat("allocator_name", "GPU_0_bfc") + stat("addr", addr) + stat("allocation_bytes", size)
            body += _field(4, _field(1, 2) + _field(2, i * 1000) + stats + stat("bytes_allocated", in_use))
        else:
            size = 256 * rng.randint(1, 4096)
            live.append((address, size))
            in_use += size
            stats = b"".join((
                stat("allocator_name", "GPU_0_bfc"), stat("addr", address), stat("requested_bytes", size - 3),
                stat("allocation_bytes", size), stat("bytes_allocated", in_use), stat("tf_op", f"l{i % 97}/MatMul"),
                stat("shape", f"[{size // 4}]"), stat("data_type", 1), stat("region_type", "output"),
            ))  # fmt: skip
            body += _field(4, _field(1, 1) + _field(2, i * 1000) + stats)
            address += size
    line = _field(1, 1) + _field(2, b"python3") + _field(3, 1_000_000) + bytes(body)
    metadata = b"".join(_field(4, _field(1, i) + _field(2, _field(1, i) + _field(2, n.encode())))
                        for i, n in ((1, "MemoryAllocation"), (2, "MemoryDeallocation")))  # fmt: skip
    stat_metadata = b"".join(
        _field(5, _field(1, i) + _field(2, _field(1, i) + _field(2, n.encode()))) for n, i in stat_ids.items()
    )
    plane = _field(1, 0) + _field(2, b"/host:CPU") + _field(3, line) + metadata + stat_metadata
    return _field(1, plane)


def bench_xplane(entries: int, work: Path) -> list[dict[str, Any]]:
    rows = [measure(TRACES / "tb_xplane_gpu_multiworker.xplane.pb")]
    fixtures = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tf_bfc"
    rows += [measure(path) for path in sorted(fixtures.glob("*.xplane.pb.gz"))]
    path = work / f"synthetic_{entries}.xplane.pb"
    if not path.exists():
        path.write_bytes(synthetic_xspace(entries))
    rows.append(measure(path))
    return rows


def write_memory_profile(path: Path, snapshots: int, seed: int = 0) -> None:
    """A gzip-compressed XProf memory profile of ``snapshots`` timeline snapshots on ``GPU_0_bfc``
    (allocations of random sizes at fresh addresses, each freed later; xprof's proto3 JSON, as
    in gpuviz/importers/xprof_memory.py), written as it is made."""
    rng = random.Random(seed)
    live: list[tuple[int, int]] = []
    address, in_use = 1 << 40, 0
    with gzip.open(path, "wt", compresslevel=6) as out:
        out.write('{"memoryProfilePerAllocator": {"GPU_0_bfc": {"sampledTimelineSnapshots": [')
        for i in range(snapshots):
            if live and (rng.random() < 0.5 or i + len(live) >= snapshots):
                addr, size = live.pop(rng.randrange(len(live)))
                in_use -= size
                activity = {"memoryActivity": "DEALLOCATION", "address": str(addr), "allocationBytes": str(size)}
            else:
                addr, size = address, 256 * rng.randint(1, 4096)
                live.append((addr, size))
                address += size
                in_use += size
                activity = {"memoryActivity": "ALLOCATION", "address": str(addr), "allocationBytes": str(size),
                            "requestedBytes": str(size - 3), "tfOpName": f"l{i % 97}/MatMul", "dataType": "float",
                            "tensorShape": f"[{size // 4}]", "regionType": "output",
                            "stepId": str(i // 1000)}  # fmt: skip
            stats = {"heapAllocatedBytes": str(in_use), "peakBytesInUse": str(in_use)}
            snapshot = {"timeOffsetPs": str(i * 1_000_000), "activityMetadata": activity, "aggregationStats": stats}
            out.write(("," if i else "") + json.dumps(snapshot))
        out.write('], "profileSummary": {"memoryCapacity": "17179869184"}}}, ')
        out.write('"memoryIds": ["GPU_0_bfc"], "numHosts": 1}')


def bench_xprof(entries: int, work: Path) -> list[dict[str, Any]]:
    """The real profiles, then a synthetic one of ``entries`` snapshots (XProf itself keeps at
    most 1000 per allocator; a longer one shows the peak does not grow with the file)."""
    rows = [_with_uncompressed(measure(TRACES / name), TRACES / name) for name in (
        "tb_memory_profile_gpu_multiworker_converted_xprof2.24.2.json.gz", "tb_memory_profile_tpu_xprof_golden.json.gz"
    )]  # fmt: skip
    path = work / f"synthetic_{entries}.memory_profile.json.gz"
    if not path.exists():
        write_memory_profile(path, entries)
    rows.append(_with_uncompressed(measure(path), path))
    return rows


FORMATS: dict[str, Callable[[int, Path], list[dict[str, Any]]]] = {
    "pytorch-snapshot": bench_pytorch_snapshot,
    "pytorch-profiler": bench_pytorch_profiler,
    "rmm-csv": bench_rmm_csv,
    "tf-placement": bench_tf_placement,
    "xplane": bench_xplane,
    "xprof-memory-profile": bench_xprof,
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
