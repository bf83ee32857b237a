"""The GPU checks, one function per step; ``.ci/gpu_check.py`` runs each in a fresh process.

    python .ci/gpu_steps.py STEP --json PATH [--dry-run]

A step returns a ``Step`` (or raises: the step failed, the message says what differed). On a
real GPU every check runs against the device; with ``--dry-run`` the same comparisons run on
gpuviz's simulated device (``SimUpstream``, the pluggable library's simulated device, CPU
PyTorch where it is installed) and the step reports ``simulated``. Sizes are in bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import random
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MiB = 1 << 20


@dataclass
class Step:
    status: str  # ok | simulated | failed | skipped
    summary: str
    metrics: list[tuple[str, float | int | str, str]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


def done(dry: bool, summary: str, metrics: list[Any] | None = None, **details: Any) -> Step:
    return Step("simulated" if dry else "ok", summary, metrics or [], details)


def check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


# ------------------------------------------------------------------ shared comparisons
def snapshot_state(snapshot: dict[str, Any], device: int = 0) -> Any:
    """The HeapState a PyTorch snapshot's own ``segments`` describe (read independently of gpuviz's
    importer): active blocks in use with their requested bytes, inactive blocks free."""
    from gpuviz.base.heapstate import ChunkState, HeapState, SegmentState

    segments = []
    for segment in sorted((s for s in snapshot["segments"] if s["device"] == device), key=lambda s: s["address"]):
        chunks = tuple(
            ChunkState(
                b["address"],
                b["size"],
                max(b["requested_size"], 1) if b["state"] != "inactive" else 0,
                b["state"] != "inactive",
            )
            for b in segment["blocks"]
        )
        segments.append(SegmentState(segment["address"], segment["total_size"], chunks))
    return HeapState(f"GPU:{device}", tuple(segments))


def first_difference(got: Any, want: Any) -> str:
    have = {s.base: s for s in got.segments}
    for segment in want.segments:
        other = have.get(segment.base)
        if other is None:
            return f"segment {segment.base:#x} (+{segment.size}) missing"
        for a, b in zip(other.chunks, segment.chunks, strict=False):
            if a != b:
                return f"segment {segment.base:#x}: gpuviz {a}, snapshot {b}"
        if len(other.chunks) != len(segment.chunks) or other.size != segment.size:
            return f"segment {segment.base:#x}: {len(other.chunks)} vs {len(segment.chunks)} blocks"
    return f"extra segments {sorted(set(have) - {s.base for s in want.segments})[:3]}"


def open_and_compare(path: Path) -> list[Any]:
    """Open a snapshot pickle in gpuviz and compare its final state with the snapshot's own."""
    import gpuviz

    with open(path, "rb") as file:
        raw = pickle.load(file)
    start = time.perf_counter()
    log = gpuviz.load(path, progress=False)
    seconds = time.perf_counter() - start
    got = gpuviz.replay(log).state_at(-1, device="GPU:0")
    want = snapshot_state(raw)
    want.check()
    check(got == want, f"gpuviz's final state differs from the snapshot's: {first_difference(got, want)}")
    conflicts = log.meta["source"].get("conflicts", 0)
    check(conflicts == 0, f"the importer reported {conflicts} conflicts")
    blocks = sum(len(s.chunks) for s in want.segments)
    return [
        ("events", len(log), ""),
        ("segments", len(want.segments), ""),
        ("blocks", blocks, ""),
        ("bytes in use at the end", want.bytes_in_use, "B"),
        ("gpuviz.load of the snapshot", seconds, "s"),
    ]


def chunk_tuples(state: Any) -> list[tuple[int, int, bool]]:
    return [(c.address, c.size, c.in_use) for c in state.chunks()]


# ------------------------------------------------------------------ steps
def environment(dry: bool) -> Step:
    """What the machine has: the GPU (NVML, nvidia-smi), PyTorch and CuPy and what they see."""
    import shutil
    import subprocess

    import gpuviz
    from gpuviz.capture.nvml import device_facts, nvml_status

    facts: dict[str, Any] = {"gpuviz": gpuviz.__version__, "python": sys.version.split()[0]}
    status = nvml_status()
    facts["nvml"] = status.reason
    gpus = device_facts()
    facts["gpus"] = [{"name": g.name, "total_bytes": g.total_bytes, "used_bytes": g.used_bytes} for g in gpus]
    if status.driver_version:
        facts["driver"] = status.driver_version
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        facts["nvidia-smi"] = smi.stdout.strip() or smi.stderr.strip()
    try:
        import torch

        facts["torch"] = torch.__version__
        facts["torch_cuda"] = torch.version.cuda
        facts["torch_sees_cuda"] = bool(torch.cuda.is_available())
        if torch.cuda.is_available():
            facts["torch_device"] = torch.cuda.get_device_name(0)
    except ImportError:
        facts["torch"] = None
    try:
        import cupy

        facts["cupy"] = cupy.__version__
        facts["cupy_sees_cuda"] = bool(cupy.cuda.is_available())
    except ImportError:
        facts["cupy"] = None
    from gpuviz.cupy.cupti import cupti_status

    facts["cupti"] = cupti_status()[1]
    if not dry:
        check(bool(gpus), f"NVML sees no GPU ({status.reason})")
        check(bool(facts.get("torch_sees_cuda")), "PyTorch sees no CUDA device")
        check(bool(facts.get("cupy_sees_cuda")), "CuPy sees no CUDA device")
    name = gpus[0].name if gpus else "no GPU (simulated device)"
    return done(dry, name, [("GPUs seen by NVML", len(gpus), "")], **facts)


def torch_snapshot(dry: bool) -> Step:
    """A PyTorch workload recorded with _record_memory_history, its snapshot opened in gpuviz:
    gpuviz's replay must end in exactly the snapshot's segments and blocks."""
    folder = Path(tempfile.mkdtemp(prefix="gpuviz-gpu-check-"))
    path = folder / "snapshot.pickle"
    if dry:  # PyTorch's caching allocator as gpuviz models it, on a simulated device, exported
        from gpuviz import SimUpstream
        from gpuviz.exporters.torch_snapshot import write_torch_snapshot
        from gpuviz.scenarios.torch_caching import TorchCachingAllocator

        alloc = TorchCachingAllocator(SimUpstream("8GiB"))
        rng = random.Random(0)
        live: list[int] = []
        for step in range(3000):
            if live and rng.random() < 0.45:
                alloc.free(live.pop(rng.randrange(len(live))))
            else:
                live.append(alloc.allocate(int(2 ** rng.uniform(8, 27))))
            if step == 1500:
                alloc.empty_cache()
        write_torch_snapshot(alloc.log, path)
        metrics = open_and_compare(path)
        import gpuviz

        again = gpuviz.replay(gpuviz.load(path, progress=False)).state_at(-1, device="GPU:0")
        check(chunk_tuples(again) == chunk_tuples(alloc.state()), "the exported run does not end in the model's state")
        return done(dry, "simulated caching allocator -> snapshot -> gpuviz: final segments and blocks equal", metrics)
    import torch

    memory = torch.cuda.memory
    memory._record_memory_history(max_entries=1_000_000)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
        optimizer = torch.optim.Adam(model.parameters())
        keep = []
        for step in range(30):
            x = torch.randn(512 + 8 * step, 1024, device="cuda")
            loss = model(x).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            keep.append(torch.empty(1000 * (step + 1) + 7, dtype=torch.uint8, device="cuda"))
            if step % 7 == 6:
                del keep[::2]
            if step == 15:
                torch.cuda.empty_cache()
        torch.cuda.synchronize()
        memory._dump_snapshot(str(path))
    finally:
        memory._record_memory_history(enabled=None)
    metrics = open_and_compare(path)
    metrics.append(("snapshot file", path.stat().st_size / 1e6, "MB"))
    return done(dry, "real _record_memory_history snapshot -> gpuviz: final segments and blocks equal", metrics)


def torch_bfc(dry: bool) -> Step:
    """PyTorch allocating through gpuviz's BFC (the pluggable allocator library): the log replays
    to the library's own state; on a GPU the cudaMalloc'd pool agrees with NVML."""
    import gpuviz
    from gpuviz import EventLog
    from gpuviz.torch import pluggable as gtorch

    log = EventLog()
    if dry:  # the library's entry points called as PyTorch calls them, on its simulated device
        import ctypes

        from gpuviz import BFCAllocator, SimUpstream

        lib = ctypes.CDLL(gtorch.library().__file__)
        malloc, free = lib.gpuviz_malloc, lib.gpuviz_free
        malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        free.restype, free.argtypes = None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        gtorch.library().drain()
        session = gtorch.TorchSession(
            log, {0: gtorch.configure_device(0, log, memory_limit=512 * MiB, simulated_capacity=512 * MiB)}
        )
        reference = BFCAllocator(SimUpstream(512 * MiB), memory_limit=512 * MiB)
        rng = random.Random(1)
        live: list[tuple[int, int]] = []
        for _ in range(5000):
            if live and rng.random() < 0.5:
                address, size = live.pop(rng.randrange(len(live)))
                free(address, size, 0, None)
                reference.free(address)
            else:
                size = int(2 ** rng.uniform(4, 24))
                address = malloc(size, 0, None)
                check(address == reference.allocate(size), "the library and the Python allocator placed a block apart")
                live.append((address, size))
        session.flush()
        stats = session.stats(0)
        state = gpuviz.replay(log).state_at(-1, device="GPU:0")
        check(state == reference.state(), "the library's log does not replay to the reference allocator's state")
        check(stats["bytes_in_use"] == state.bytes_in_use, "the library's counters disagree with its log")
        for address, size in live:
            free(address, size, 0, None)
        check(session.stats(0)["bytes_in_use"] == 0, "memory is still in use after every block was freed")
        gtorch.library().reset(0)
        return done(
            dry,
            "library entry points on the simulated device == the Python BFC allocator",
            [("events", len(log), ""), ("pool at the end", stats["pool_bytes"], "B")],
        )
    import torch

    from gpuviz.capture.nvml import device_facts

    session = gtorch.use_bfc(log=log, memory_limit="16GiB")
    a = torch.randn(1024, 1024, device="cuda")  # context, cuBLAS and the kernels loaded once
    (a @ a).sum().item()
    torch.empty(1000, device="cuda").fill_(1.0)  # (lazily loaded kernels take device memory too)
    torch.cuda.synchronize()
    session.flush()
    used0, pool0 = device_facts()[0].used_bytes, session.stats(0)["pool_bytes"]
    segments0 = len(log.filter(kind="segment_alloc"))
    # float32 tensors of 0.75 to 250 MiB and a bit (not multiples of the 2 MiB of a CUDA page)
    tensors = [torch.empty(n * MiB // 4 + 1000 * n, device="cuda").fill_(1.0) for n in (3, 17, 64, 250, 1000)]
    product = a @ a
    torch.cuda.synchronize()
    session.flush()
    used1, stats = device_facts()[0].used_bytes, session.stats(0)
    grown_segments = len(log.filter(kind="segment_alloc")) - segments0
    nvml_grew, pool_grew = used1 - used0, stats["pool_bytes"] - pool0
    tolerance = 2 * MiB * (grown_segments + 1)  # cudaMalloc maps whole 2 MiB pages
    check(
        abs(nvml_grew - pool_grew) <= tolerance,
        f"NVML's used memory grew by {nvml_grew} B, gpuviz's pool by {pool_grew} B ({grown_segments} segments)",
    )
    state = gpuviz.replay(log).state_at(-1, device="GPU:0")
    state.check()
    live = {c.address for c in state.chunks() if c.in_use}
    check(all(t.data_ptr() in live for t in [*tensors, product, a]), "a live tensor's memory is not in use in the log")
    check(
        stats["bytes_in_use"] == state.bytes_in_use,
        f"library {stats['bytes_in_use']} B in use, log {state.bytes_in_use}",
    )
    check(stats["invalid_frees"] == 0, f"{stats['invalid_frees']} frees of unknown pointers")
    check(
        bool(torch.allclose(product.cpu(), a.cpu() @ a.cpu(), rtol=1e-3, atol=1e-2)),
        "a @ a is wrong on gpuviz's memory",
    )
    return done(
        dry,
        "PyTorch on gpuviz's BFC: log == library state, pool growth == NVML growth",
        [
            ("events", len(log), ""),
            ("pool growth", pool_grew, "B"),
            ("NVML used growth", nvml_grew, "B"),
            ("segments grown", grown_segments, ""),
        ],
    )


def cupy_bfc(dry: bool) -> Step:
    """CuPy allocating through gpuviz's BFC over real cudaMalloc; NVML's used memory grows by what
    the allocator reserved; the log replays to the allocator's state."""
    import gpuviz

    try:
        import cupy
    except ImportError:
        cupy = None
    if dry:
        from gpuviz import SimUpstream
        from gpuviz.capture.native import allocator_class

        upstream = SimUpstream("1GiB")
        if cupy is not None:  # CuPy's arrays over gpuviz's allocator on the simulated device
            import gpuviz.cupy as gcupy

            with gcupy.installed(upstream=lambda d: upstream, current_device=lambda: 0, cupti=False) as s:
                arrays = [cupy.empty(n * 1000 + 3, dtype=cupy.float32) for n in range(1, 200)]
                del arrays[::3]
                allocator = s.allocator.allocators[0]
                log = s.log
                pointers = [x.data.ptr for x in arrays]
        else:
            allocator = allocator_class()(upstream, growth=True)
            log = allocator.log
            pointers = [allocator.allocate(n * 4000 + 12) for n in range(1, 200)]
        state = gpuviz.replay(log).state_at(-1, device="GPU:0")
        check(chunk_tuples(state) == chunk_tuples(allocator.state()), "the log does not replay to the allocator")
        check(state.pool_bytes == upstream.reserved, "the pool differs from what the simulated device reserved")
        live = {c.address for c in state.chunks() if c.in_use}
        check(all(p in live for p in pointers), "a live array's memory is not in use in the log")
        via = "CuPy arrays" if cupy is not None else "the allocator (CuPy not installed)"
        return done(
            dry,
            f"{via} on the simulated device: log == allocator, pool == reserved",
            [("events", len(log), ""), ("reserved", upstream.reserved, "B")],
        )
    import gpuviz.cupy as gcupy
    from gpuviz.capture.nvml import facts_for_pci_bus_id

    bus = cupy.cuda.Device(0).pci_bus_id
    with gcupy.installed(cupti=False, memory_limit="16GiB") as s:
        warm = cupy.arange(1 << 20, dtype=cupy.float32)  # the context and the kernels
        warm.fill(1.0)
        float(warm.sum())
        cupy.cuda.runtime.deviceSynchronize()
        gpu = s.allocator.allocators[0]
        facts = facts_for_pci_bus_id(bus)
        check(facts is not None, f"NVML does not know the GPU at {bus}")
        used0, reserved0 = facts.used_bytes, gpu.upstream.reserved
        segments0 = len(s.log.filter(kind="segment_alloc"))
        arrays = [cupy.empty(n * MiB // 4 + 1000 * n, dtype=cupy.float32) for n in (1, 5, 33, 200, 900)]
        for x in arrays:
            x.fill(2.0)
        cupy.cuda.runtime.deviceSynchronize()
        used1, reserved1 = facts_for_pci_bus_id(bus).used_bytes, gpu.upstream.reserved
        grown = len(s.log.filter(kind="segment_alloc")) - segments0
        check(float(arrays[1].sum()) == 2.0 * arrays[1].size, "a kernel's result on gpuviz's memory is wrong")
        total = cupy.cuda.runtime.memGetInfo()[1]
        check(facts.total_bytes == total, f"NVML total {facts.total_bytes} B != cudaMemGetInfo total {total} B")
        nvml_grew, reserved_grew = used1 - used0, reserved1 - reserved0
        tolerance = 2 * MiB * (grown + 1)
        check(
            abs(nvml_grew - reserved_grew) <= tolerance,
            f"NVML's used memory grew by {nvml_grew} B, cudaMalloc'd segments by {reserved_grew} B ({grown} segments)",
        )
        del arrays, warm
    gpu.check()
    check(
        gpuviz.replay(s.log).state_at(-1, device=gpu.device) == gpu.state(), "the log does not replay to the allocator"
    )
    return done(
        dry,
        "CuPy on gpuviz's BFC over cudaMalloc: reserved growth == NVML growth, log == allocator",
        [
            ("events", len(s.log), ""),
            ("cudaMalloc'd growth", reserved_grew, "B"),
            ("NVML used growth", nvml_grew, "B"),
            ("segments grown", grown, ""),
        ],
    )


class _Activity:
    def __init__(self, copy_kind: int, nbytes: int, start: int, end: int) -> None:
        self.kind, self.copy_kind, self.bytes, self.start, self.end, self.device_id = (
            "MEMCPY",
            copy_kind,
            nbytes,
            start,
            end,
            0,
        )


def cupti_transfers(dry: bool) -> Step:
    """CUPTI's memcpy records as transfer events: directions, bytes and device-side durations."""
    from gpuviz import EventLog
    from gpuviz.cupy.cupti import CuptiTransfers, cupti_status
    from gpuviz.log.schema import Direction

    nbytes = 256 * MiB
    if dry:  # CUPTI's activity records as it delivers them, through gpuviz's conversion
        from types import SimpleNamespace

        collector = object.__new__(CuptiTransfers)
        collector._cupti = SimpleNamespace(ActivityKind=SimpleNamespace(MEMCPY="MEMCPY"))
        collector.log, collector._offset, collector.records = EventLog(), 0, 0
        collector._buffer_completed(
            [
                _Activity(1, nbytes, 1_000, 11_001_000),
                _Activity(2, nbytes, 20_000_000, 31_000_000),
                _Activity(99, 1, 0, 1),
            ]
        )
        events = collector.log.filter(kind="transfer")
        got = [(int(e.flags), int(e.size), int(e.duration_ns)) for e in events]
        want = [(int(Direction.H2D), nbytes, 11_000_000), (int(Direction.D2H), nbytes, 11_000_000)]
        check(got == want, f"CUPTI records became {got}, not {want}")
        return done(dry, "CUPTI memcpy records (synthetic) -> transfer events", [("transfers", len(got), "")])
    usable, why = cupti_status()
    check(usable, why)
    import cupy
    import numpy as np

    import gpuviz.cupy as gcupy

    host = np.ones(nbytes, dtype=np.uint8)
    with gcupy.installed(cupti=True) as s:
        device = cupy.asarray(host)
        back = device.get()
        cupy.cuda.runtime.deviceSynchronize()
        s.cupti.flush()
    check(bool((back == host).all()), "the round trip changed the data")
    records = [e for e in s.log.filter(kind="transfer") if e.tag == "cupti"]
    sizes = {(int(e.flags), int(e.size)) for e in records}
    check(
        {(int(Direction.H2D), nbytes), (int(Direction.D2H), nbytes)} <= sizes,
        f"CUPTI saw {sorted(sizes)}, not both {nbytes}-byte copies",
    )
    hooks = [e for e in s.log.filter(kind="transfer") if e.tag != "cupti"]
    check(len(hooks) >= 2, "the Python copy hooks recorded fewer than two copies")
    metrics: list[Any] = [("CUPTI transfer records", len(records), "")]
    for e in records:
        if int(e.size) == nbytes and int(e.duration_ns) > 0:
            name = "H2D" if int(e.flags) == int(Direction.H2D) else "D2H"
            metrics.append(
                (f"{name} copy of 256 MiB (pageable host memory), CUPTI", nbytes / int(e.duration_ns), "GB/s")
            )
    return done(dry, "CUPTI saw the H2D and D2H copies with their bytes", metrics)


STEPS = {
    "environment": environment,
    "torch-snapshot": torch_snapshot,
    "torch-bfc": torch_bfc,
    "cupy-bfc": cupy_bfc,
    "cupti-transfers": cupti_transfers,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=list(STEPS))
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    try:
        step = STEPS[args.step](args.dry_run)
    except Exception as error:
        traceback.print_exc()
        step = Step("failed", f"{type(error).__name__}: {error}")
    out = {
        "status": step.status,
        "summary": step.summary,
        "seconds": round(time.perf_counter() - start, 2),
        "metrics": [list(m) for m in step.metrics],
        "details": step.details,
    }
    args.json.write_text(json.dumps(out, default=str), encoding="utf-8")
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)  # leave no CUDA teardown to race the exit (the result is written)


if __name__ == "__main__":
    main()
