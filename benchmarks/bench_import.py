"""Import benchmarks: time and peak memory of ``gpuviz.load`` per foreign format, against file size.

Run by hand, one format or all:
    .venv/bin/python benchmarks/bench_import.py [FORMAT ...] [--entries N] [--repeat N]
Targets (issue 9): a 1M-entry PyTorch snapshot in <= 5 s; peak memory <= 3x the input file.
``--entries`` also sizes the synthetic XSpace of ``xplane`` (memory events) and the synthetic
profile of ``xprof-memory-profile`` (snapshots).

What is measured, per input, in a fresh Python process after ``import gpuviz`` (best of
``--repeat`` processes, 3 by default):

- ``first_import_bytes``: the growth of the process's peak resident memory (``VmHWM``) while it
  loads a *warm-up input* of the same format (and the same compression): the modules
  ``gpuviz.load`` imports lazily for that format, its lazily built tables and caches. It is real,
  users pay it once per process, and it does not grow with the input.
- then, in the same process, the warm-up log is dropped, ``gc.collect()`` runs and the peak is
  reset to the current resident memory (writing ``5`` to ``/proc/self/clear_refs``, Linux >= 4.0);
  ``peak_growth_bytes`` is the growth of the peak while the real input loads: the memory the
  load needs *for the data*, what the target bounds (the lead's decision). ``peak_x_content``
  divides it by the content: the file's size, or for a gzip file the size of what it holds
  (a compressor's ratio says nothing about the importer).

The warm-up inputs are tiny on purpose (86 B to 1 KB made by this benchmark per format, or the
smallest real placement files, 7 and 27 KB): memory the allocator keeps free after the warm-up
(pymalloc arenas, malloc's heap) could otherwise serve the real load and hide part of its
growth; a few KB of it cannot hide anything measurable. The resolution is some tens of KB (RSS
moves in pages and the kernel's counters are approximate at that scale): the growth of an input
of a few KB is noise. Where the peak cannot be reset (no ``/proc/self/clear_refs``, or a kernel
that ignores ``5``), the row says ``"peak_reset": false`` and ``peak_growth_bytes`` is the
fresh-process growth of the real load (first import included), as measured before the warm-up
existed; a warning says so. ``--fresh`` warms up with the input itself: ``first_import_bytes``
is then the growth of a fresh process's first load of the input, the first import inside.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# the real third-party traces: the folder GPUVIZ_TEST_TRACES names, as for the tests
TRACES = Path(
    os.environ.get("GPUVIZ_TEST_TRACES") or Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
)
_MEASURE = """
import gc, resource, sys, time
import gpuviz

def status_kib(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))

def peak_bytes():
    # VmHWM: this process's own high-water mark (ru_maxrss keeps the parent's across fork+exec on Linux)
    try:
        return status_kib("VmHWM")
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

def reset_peak():
    # "5" resets VmHWM to the current RSS (Linux >= 4.0); True only where it did
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return status_kib("VmHWM") <= status_kib("VmRSS") + (64 << 10)
    except (OSError, StopIteration):
        return False

peak_before = peak_bytes()
warm = gpuviz.load(sys.argv[1], progress=False)
first_import = peak_bytes() - peak_before
del warm
gc.collect()
reset = reset_peak()
before, peak_before = resource.getrusage(resource.RUSAGE_SELF), peak_bytes()
if not reset:
    peak_before -= first_import  # the fresh process's peak before the warm-up
start = time.perf_counter()
log = gpuviz.load(sys.argv[2], progress=False)
seconds = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF)
print(len(log), seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
      peak_bytes() - peak_before, first_import, int(reset))
"""
REPEAT = 3  # processes per input (--repeat): the best of each number is reported
FRESH = False  # --fresh: warm up with the input itself


def content_bytes(path: Path) -> int:
    """The size of what ``path`` holds: decompressed for a gzip file, else the file's size."""
    with open(path, "rb") as file:
        if file.read(2) != b"\x1f\x8b":
            return path.stat().st_size
    with gzip.open(path, "rb") as file:
        return sum(len(block) for block in iter(lambda: file.read(1 << 20), b""))


def measure(path: Path, warmup: Path) -> dict[str, Any]:
    """Import ``warmup`` then ``path`` in each of ``REPEAT`` fresh processes (module docstring):
    events, wall and CPU seconds of the real load (the machine may be shared: CPU seconds are the
    steadier number), the first import's peak growth and the real load's peak growth (bytes),
    each the best (least) over the processes; file and content sizes."""
    warmup = path if FRESH else warmup
    runs = []
    for _ in range(REPEAT):
        command = [sys.executable, "-c", _MEASURE, str(warmup), str(path)]
        runs.append(subprocess.run(command, capture_output=True, text=True, check=True).stdout.split())
    events = {int(run[0]) for run in runs}
    if len(events) != 1:
        raise RuntimeError(f"{path}: the processes read different event counts {sorted(events)}")
    reset = all(run[5] == "1" for run in runs)
    if not reset:
        print(f"warning: the peak could not be reset here: {path.name}'s growth includes the first import",
              file=sys.stderr)  # fmt: skip
    size, content = path.stat().st_size, content_bytes(path)
    grown = min(int(run[3]) for run in runs)
    return {"file": path.name, "bytes": size, "content_bytes": content, "events": events.pop(),
            "seconds": round(min(float(run[1]) for run in runs), 2),
            "cpu_seconds": round(min(float(run[2]) for run in runs), 2),
            "first_import_bytes": min(int(run[4]) for run in runs), "warmup": warmup.name,
            "warmup_bytes": warmup.stat().st_size, "peak_reset": reset, "peak_growth_bytes": grown,
            "peak_x_content": round(grown / content, 2)}  # fmt: skip


# ---------------------------------------------------------------- warm-up inputs (tiny, one per format)
def _tiny(work: Path, name: str, content: bytes, compressed: bool = False) -> Path:
    """``work/warmup-name`` holding ``content`` (gzip-compressed when ``compressed``: ``.gz`` added)."""
    path = work / (f"warmup-{name}" + (".gz" if compressed else ""))
    path.write_bytes(gzip.compress(content, mtime=0) if compressed else content)
    return path


def warmup_snapshot(work: Path) -> Path:
    """A PyTorch snapshot pickle: a segment alive before the trace, then every common action with frames."""
    base, mib = 1 << 40, 1 << 20
    frames = [{"filename": "train.py", "line": 7 + i, "name": f"f{i}"} for i in range(3)]

    def entry(action: str, addr: int, size: int, time_us: int) -> dict[str, Any]:
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": time_us, "frames": frames}

    blocks = [{"address": base, "size": 2 * mib, "requested_size": 2 * mib, "state": "active_allocated",
               "frames": frames}]  # fmt: skip
    segment = {"device": 0, "address": base, "total_size": 2 * mib, "stream": 0, "segment_type": "large",
               "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "allocated_size": 2 * mib,
               "blocks": blocks}  # fmt: skip
    trace = [entry("segment_alloc", base + 64 * mib, 20 * mib, 1), entry("alloc", base + 64 * mib, 3 * mib, 2),
             entry("free_requested", base + 64 * mib, 3 * mib, 3), entry("free_completed", base + 64 * mib, 3 * mib, 4),
             entry("segment_free", base + 64 * mib, 20 * mib, 5)]  # fmt: skip
    snapshot = {"segments": [segment], "device_traces": [trace], "allocator_settings": {}}
    return _tiny(work, "snapshot.pickle", pickle.dumps(snapshot, protocol=4))


def warmup_profiler(work: Path, *, addressed: bool, compressed: bool) -> Path:
    """A PyTorch profiler trace of four ``[memory]`` events, in the current schema or the 2021 one."""
    events = []
    base = 1 << 40
    changes = ((base, 1024, 1024), (base + 1024, 512, 1536), (base, -1024, 512), (base + 1024, -512, 0))
    for i, (addr, size, total) in enumerate(changes):
        args: dict[str, Any] = {"Device Type": 1, "Device Id": 0, "Bytes": size}
        if addressed:
            args |= {"Addr": addr, "Total Allocated": total, "Total Reserved": 2 << 20}
        events.append({"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 7, "ts": 100 + i, "args": args})
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 7, "ts": 99, "dur": 5})
    trace = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "GPU", "totalGlobalMem": 1 << 30}],
             "traceEvents": events}  # fmt: skip
    name = "profiler.json" if addressed else "profiler-2021.json"
    return _tiny(work, name, json.dumps(trace).encode(), compressed)


def warmup_xplane(work: Path, *, compressed: bool) -> Path:
    return _tiny(work, "xplane.pb", synthetic_xspace(8), compressed)


def warmup_memory_profile(work: Path) -> Path:
    path = work / "warmup-memory_profile.json.gz"
    write_memory_profile(path, 8)
    return path


def warmup_memory_timeline(work: Path, *, compressed: bool) -> Path:
    rows = [[-1, 1, 512, 0], [10, 2, 256, 4], [11, 2, 256, 3], [12, 3, -256, 4], [12, 3, 256, 5], [13, 4, -256, 5],
            [14, 4, -256, 3], [15, 4, -512, 0]]  # fmt: skip
    return _tiny(work, "memory_timeline.json", json.dumps(rows).encode(), compressed)


def warmup_rmm(work: Path) -> Path:
    lines = ["Thread,Time,Action,Pointer,Size,Stream", "1,00:00:00.000001,allocate,0x7f0000000000,256,0",
             "1,00:00:00.000002,allocate,0x7f0000000100,512,0", "1,00:00:00.000003,free,0x7f0000000000,256,0",
             "1,00:00:00.000004,free,0x7f0000000100,512,0"]  # fmt: skip
    return _tiny(work, "rmm.csv", ("\n".join(lines) + "\n").encode())


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
    warmup = warmup_snapshot(work)
    rows = [measure(path, warmup) for path in sorted(TRACES.glob("pt_snapshot_*.pickle"))]
    for pattern in ("pt_snapshot_assignment2_2026b.pickle", "pt_snapshot_cs336_ctx128_fullstep_2025.pickle"):
        path = work / f"{entries}_{pattern}"
        if not path.exists():
            with open(path, "wb") as file:
                pickle.dump(repeated_snapshot(TRACES / pattern, entries), file, protocol=4)
        rows.append(measure(path, warmup))
    return rows


def bench_pytorch_profiler(entries: int, work: Path) -> list[dict[str, Any]]:
    """The real profiler traces (the 54 MB V100 trace: target <= 3 s), compressed and not."""
    rows = []
    for path in sorted(TRACES.glob("pt_profiler_*.json.gz")):
        addressed = "oldschema" not in path.name  # the 2021 schema's trace: a warm-up of that schema
        rows.append(measure(path, warmup_profiler(work, addressed=addressed, compressed=True)))
        rows.append(measure(_plain(path, work), warmup_profiler(work, addressed=addressed, compressed=False)))
    return rows


def _plain(path: Path, work: Path) -> Path:
    """``path`` (gzip-compressed) decompressed into ``work``, once."""
    plain = work / path.name.removesuffix(".gz")
    if not plain.exists():
        with gzip.open(path, "rb") as source, open(plain, "wb") as target:
            shutil.copyfileobj(source, target)
    return plain


def bench_memory_timeline(entries: int, work: Path) -> list[dict[str, Any]]:
    """The real timeline (HTA's), compressed and not, and one of ``entries`` rows repeating it
    (each repeat after the previous one in time)."""
    real = TRACES / "pt_memory_timeline_raw_hta.json.gz"
    rows = [measure(real, warmup_memory_timeline(work, compressed=True)),
            measure(_plain(real, work), warmup_memory_timeline(work, compressed=False))]  # fmt: skip
    path = work / f"memory_timeline_{entries}.json.gz"
    if not path.exists():
        pattern = json.loads(gzip.decompress(real.read_bytes()))
        times = [row[0] for row in pattern if row[0] >= 0]
        span = max(times) - min(times) + 1
        with gzip.open(path, "wt") as out:
            out.write("[")
            for i in range(entries):
                time_ns, action, size, category = pattern[i % len(pattern)]
                if time_ns >= 0:  # PREEXISTING rows (-1) stay -1: placed at the time before them
                    time_ns += i // len(pattern) * span
                out.write(("," if i else "") + json.dumps([time_ns, action, size, category]))
            out.write("]")
    rows.append(measure(path, warmup_memory_timeline(work, compressed=True)))
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
    return [measure(path, warmup_rmm(work))]


def bench_tf_placement(entries: int, work: Path) -> list[dict[str, Any]]:
    """The real Colab placement logs, and one of ``entries`` eager lines."""
    # the smallest real files (<= 27 KB) warm up: a notebook for notebooks, a log for logs
    notebook, text = TRACES / "tf_placement_colab_gpu_guide.ipynb", TRACES / "tf_placement_colab_gpu_guide.outputs.txt"
    paths = sorted(TRACES.glob("tf_placement_*"))
    rows = [measure(path, notebook if path.suffix == ".ipynb" else text) for path in paths]
    path = work / f"placement_{entries}.log"
    if not path.exists():
        device = "/job:localhost/replica:0/task:0/device:GPU:0"
        with open(path, "w") as file:
            file.writelines(f"Executing op Op{row % 50} in device {device}\n" for row in range(entries))
    rows.append(measure(path, text))
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
    """The real multi-GPU XSpace, TensorFlow's own (tests/fixtures/tf_bfc), and a synthetic one of
    ``entries`` memory events, plain and gzip-compressed."""
    plain, compressed = warmup_xplane(work, compressed=False), warmup_xplane(work, compressed=True)
    rows = [measure(TRACES / "tb_xplane_gpu_multiworker.xplane.pb", plain)]
    fixtures = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tf_bfc"
    rows += [measure(path, compressed) for path in sorted(fixtures.glob("*.xplane.pb.gz"))]
    path = work / f"synthetic_{entries}.xplane.pb"
    if not path.exists():
        path.write_bytes(synthetic_xspace(entries))
    packed = work / f"synthetic_{entries}.xplane.pb.gz"
    if not packed.exists():
        packed.write_bytes(gzip.compress(path.read_bytes(), mtime=0))
    rows += [measure(path, plain), measure(packed, compressed)]
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
    warmup = warmup_memory_profile(work)
    rows = [measure(TRACES / name, warmup) for name in (
        "tb_memory_profile_gpu_multiworker_converted_xprof2.24.2.json.gz", "tb_memory_profile_tpu_xprof_golden.json.gz"
    )]  # fmt: skip
    path = work / f"synthetic_{entries}.memory_profile.json.gz"
    if not path.exists():
        write_memory_profile(path, entries)
    rows.append(measure(path, warmup))
    return rows


FORMATS: dict[str, Callable[[int, Path], list[dict[str, Any]]]] = {
    "pytorch-snapshot": bench_pytorch_snapshot,
    "pytorch-profiler": bench_pytorch_profiler,
    "pytorch-memory-timeline": bench_memory_timeline,
    "rmm-csv": bench_rmm_csv,
    "tf-placement": bench_tf_placement,
    "xplane": bench_xplane,
    "xprof-memory-profile": bench_xprof,
}


def main() -> None:
    global REPEAT, FRESH
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script too
    from benchmarks._results import Results, add_json_option

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("formats", nargs="*", help=f"formats (default: all): {', '.join(FORMATS)}")
    parser.add_argument("--entries", type=int, default=1_000_000, help="entries of the synthetic traces")
    parser.add_argument("--repeat", type=int, default=REPEAT, help="fresh processes per input (the best is kept)")
    parser.add_argument("--fresh", action="store_true", help="warm up with the input itself (first load's growth)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gpuviz-bench-import")
    add_json_option(parser)
    args = parser.parse_args()
    results = Results("import", "Importers: time and peak memory of gpuviz.load per foreign format.", vars(args))
    unknown = [name for name in args.formats if name not in FORMATS]
    if unknown:
        parser.error(f"unknown formats {unknown}; choose from {', '.join(FORMATS)}")
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, not {args.repeat}")
    REPEAT, FRESH = args.repeat, args.fresh
    args.work.mkdir(parents=True, exist_ok=True)
    for name in args.formats or FORMATS:
        for row in FORMATS[name](args.entries, args.work):
            print(json.dumps({"format": name, **row}))
            what = f"{name}, {row['file']} ({row['events']:,} events, {row['content_bytes'] / 1e6:.2f} MB)"
            results.add(f"{what}: load", row["seconds"], "s", note=f"{row['cpu_seconds']} s CPU")
            results.add(f"{what}: peak memory growth over the content", row["peak_x_content"], "x")
    results.write(args.json)


if __name__ == "__main__":
    main()
