"""The pluggable allocator library (what PyTorch's CUDAPluggableAllocator loads), driven as a
framework would — through its C entry points, loaded by path — on a simulated device."""

from __future__ import annotations

import ctypes
import importlib.util
import json
import subprocess
import sys
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from gpuviz import EventLog, OutOfMemoryError, SimUpstream, replay
from gpuviz.base.units import MiB
from gpuviz.capture import ReferenceBFCAllocator

try:
    import gpuviz.torch.pluggable as gtorch

    gtorch.library()
    BUILT = True
except RuntimeError:
    BUILT = False

needs_library = pytest.mark.skipif(not BUILT, reason="the pluggable library is not built (no C compiler)")


class Library:
    """The library's entry points, called through ctypes (the GIL is released during each call)."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(gtorch.library().__file__)
        self.malloc = lib.gpuviz_malloc
        self.malloc.restype = ctypes.c_void_p
        self.malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self.free = lib.gpuviz_free
        self.free.restype = None
        self.free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]


@pytest.fixture
def lib() -> Iterator[Library]:
    gtorch.library().drain()
    yield Library()
    gtorch.library().drain()


def columns(log: EventLog) -> dict[str, list[int]]:
    log.flush()
    return {k: v.tolist() for k, v in log.columns.items() if k not in ("time_ns", "thread")}


@needs_library
@pytest.mark.parametrize(
    ("limit_mib", "capacity_mib", "growth", "gc"),
    [(64, 64, True, False), (24, 64, True, True), (12, 12, False, False), (200, 90, True, True)],
)
def test_the_library_decides_and_records_as_the_python_allocator(
    lib: Library, limit_mib: int, capacity_mib: int, growth: bool, gc: bool
) -> None:
    limit = min(limit_mib, capacity_mib) * MiB
    reference = ReferenceBFCAllocator(
        SimUpstream(capacity_mib * MiB), memory_limit=limit, growth=growth, garbage_collection=gc
    )
    log = EventLog()
    session = gtorch.TorchSession(log, {0: gtorch.configure_device(0, log, memory_limit=limit, growth=growth,
                                                                   garbage_collection=gc,
                                                                   simulated_capacity=capacity_mib * MiB)})  # fmt: skip
    rng = np.random.default_rng(limit_mib)
    live: list[tuple[int, int]] = []
    ooms = 0
    for _ in range(3000):
        if live and rng.random() < 0.5:
            address, size = live.pop(int(rng.integers(len(live))))
            reference.free(address)
            lib.free(address, size, 0, None)
        else:
            size = int(2 ** rng.uniform(0, 23))
            try:
                expected: int | None = reference.allocate(size)
            except OutOfMemoryError:
                expected = None
                ooms += 1
            got = lib.malloc(size, 0, None)
            assert got == expected
            if got:
                live.append((got, size))
    for address, size in live:
        reference.free(address)
        lib.free(address, size, 0, None)
    session.flush()
    assert columns(log) == columns(reference.log)
    stats = session.stats(0)
    assert stats["bytes_in_use"] == 0 and stats["invalid_frees"] == 0
    assert stats["pool_bytes"] == reference.stats().pool_bytes
    assert stats["peak_bytes_in_use"] == reference.stats().peak_bytes_in_use
    assert replay(log).state_at(-1) == replay(reference.log).state_at(-1)
    if limit_mib == 12:
        assert ooms > 0  # the out-of-memory path ran too
    gtorch.library().reset(0)


@needs_library
def test_threads_call_the_entry_points_at_once(lib: Library) -> None:
    log = EventLog()
    session = gtorch.TorchSession(log, {0: gtorch.configure_device(0, log, simulated_capacity=1 << 34)})
    errors: list[BaseException] = []
    together = threading.Barrier(6)

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        live: list[int] = []
        together.wait()
        try:
            for _ in range(2000):
                if live and rng.random() < 0.5:
                    lib.free(live.pop(int(rng.integers(len(live)))), 0, 0, None)
                else:
                    ptr = lib.malloc(int(rng.integers(1, 1 << 22)), 0, None)
                    assert ptr
                    live.append(ptr)
            for ptr in live:
                lib.free(ptr, 0, 0, None)
            together.wait()  # all six are alive at once, so their thread ids differ
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    session.flush()
    assert session.stats(0)["bytes_in_use"] == 0
    state = replay(log).state_at(-1)
    state.check()
    assert state.bytes_in_use == 0
    assert len(log.filter(kind="alloc")) == len(log.filter(kind="free")) > 6 * 900
    assert len(set(log["thread"].tolist())) == 6
    gtorch.library().reset(0)


_NO_HOST_MEMORY_FOR_ROWS = """import ctypes, json, resource
from gpuviz import EventLog
import gpuviz.torch.pluggable as gtorch
from gpuviz.base.units import MiB

lib = ctypes.CDLL(gtorch.library().__file__)
malloc, free = lib.gpuviz_malloc, lib.gpuviz_free
malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
free.restype, free.argtypes = None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]

def vm_size():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))

def run(limit_at):  # the row buffer keeps its size across runs: the run with a limit goes first
    gtorch.library().drain()
    log = EventLog()
    device = gtorch.configure_device(0, log, memory_limit=256 * MiB, simulated_capacity=256 * MiB)
    session = gtorch.TorchSession(log, {0: device})
    sizes = [(i % 7 + 1) * 4096 for i in range(12_000)]
    live = [0] * 8
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    for i, size in enumerate(sizes):
        if i == limit_at:
            resource.setrlimit(resource.RLIMIT_AS, (vm_size() + (512 << 10), hard))
        if live[i % 8]:
            free(live[i % 8], 0, 0, None)
        live[i % 8] = malloc(size, 0, None)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    for address in live:
        free(address, 0, 0, None)
    session.stop()
    made = session.stats(0)
    gtorch.library().reset(0)
    return len(log), log.problems, made

cut, cut_problems, cut_made = run(2000)
whole, problems, made = run(None)
print(json.dumps({"whole": whole, "cut": cut, "problems": cut_problems, "clean": problems, "same": made == cut_made}))
"""


@needs_library
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status")
def test_rows_without_host_memory_are_counted_and_said_and_the_allocations_stand() -> None:
    """PyTorch's hook cannot take an error: where the library finds no host memory for a row
    (its buffer cannot grow under RLIMIT_AS), the allocation is made all the same, and the
    next flush says how many rows the log misses (log.problems, and the gpuviz logger)."""
    out = subprocess.run([sys.executable, "-c", _NO_HOST_MEMORY_FOR_ROWS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["same"] is True  # the same allocator state and counters with and without the limit
    assert result["clean"] == [] and result["cut"] < result["whole"]
    lost = result["whole"] - result["cut"]
    message = (
        f"{lost} events of PyTorch's allocations were not recorded: the allocator library found no host memory "
        "for their rows (the allocations were made; the log misses them)"
    )
    assert result["problems"] == [message]
    assert f"gpuviz: {message}" in out.stderr


@needs_library
def test_a_free_of_an_unknown_pointer_is_counted_not_fatal(lib: Library) -> None:
    log = EventLog()
    gtorch.configure_device(1, log, simulated_capacity=64 * MiB)
    ptr = lib.malloc(1000, 1, None)
    assert ptr == 1 << 40
    lib.free(ptr + 256, 0, 1, None)
    lib.free(ptr, 0, 1, None)
    lib.free(ptr, 0, 1, None)
    assert gtorch.library().stats(1)["invalid_frees"] == 2
    with pytest.raises(RuntimeError, match="cannot be configured again"):
        gtorch.configure_device(1, log, simulated_capacity=64 * MiB)
    gtorch.library().reset(1)
    gtorch.configure_device(1, log, simulated_capacity=64 * MiB)  # after a reset it can
    gtorch.library().reset(1)


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="PyTorch is installed")
def test_use_bfc_without_pytorch_says_so() -> None:
    with pytest.raises(RuntimeError, match="needs PyTorch"):
        gtorch.use_bfc()


@pytest.mark.gpu
def test_pytorch_allocates_through_gpuviz() -> None:  # pragma: no cover - needs a GPU and PyTorch
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    log = EventLog()
    session = gtorch.use_bfc(log=log, memory_limit="1GiB")
    x = torch.empty(1000, device="cuda")
    del x
    torch.cuda.synchronize()
    session.flush()
    kinds = [e.kind for e in log]
    assert kinds[:3] == ["segment_alloc", "split", "alloc"]
    assert "free" in kinds
