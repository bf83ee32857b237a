"""gpuviz under CuPy. The CPU-side contract runs for real without a driver (CuPy builds
arrays over a custom allocator without touching CUDA); ``gpu``-marked tests need a GPU."""

from __future__ import annotations

import logging
import re
import threading

import numpy as np
import pytest

cupy = pytest.importorskip(
    "cupy", reason="CuPy is not installed (it is not in the test extra: pip install -e .[test,cuda12] or [cuda13])"
)

import gpuviz  # noqa: E402
import gpuviz.cupy as gcupy  # noqa: E402
from gpuviz import SimUpstream  # noqa: E402
from gpuviz.base.units import MiB  # noqa: E402
from gpuviz.capture.nvml import device_facts, facts_for_pci_bus_id, nvml_status  # noqa: E402
from gpuviz.cupy.allocator import Block  # noqa: E402
from gpuviz.cupy.cupti import cupti_status  # noqa: E402
from gpuviz.cupy.transfers import TransferHooks  # noqa: E402

BASE = 1 << 40
HAS_GPU = cupy.cuda.is_available()


@pytest.fixture
def sim():  # type: ignore[no-untyped-def]
    """gpuviz installed under CuPy over a simulated 64 MiB device 0."""
    upstreams: dict[int, SimUpstream] = {}

    def upstream(device_id: int) -> SimUpstream:
        return upstreams.setdefault(device_id, SimUpstream("64MiB", base=(device_id + 1) << 40))

    session = gcupy.install(upstream=upstream, current_device=lambda: 0, cupti=False)
    session.upstreams = upstreams  # type: ignore[attr-defined]
    yield session
    if gcupy.current() is not None:
        gcupy.uninstall()


def kinds(log: gpuviz.EventLog) -> list[tuple[str, int, int]]:
    return [(e.kind, e.address, e.size) for e in log]


def test_cupy_arrays_are_allocated_and_freed_through_gpuviz(sim) -> None:  # type: ignore[no-untyped-def]
    a = cupy.empty((100, 100), dtype=cupy.float32)  # 40000 bytes -> 40192
    assert a.data.ptr == BASE and a.data.device_id == 0
    assert isinstance(a.data.mem._owner, Block)
    b = cupy.ndarray((10,), dtype=cupy.float64)
    assert b.data.ptr == BASE + 40192
    assert kinds(sim.log)[:5] == [
        ("segment_alloc", BASE, 2 * MiB), ("split", BASE, 40192), ("alloc", BASE, 40192),
        ("split", BASE + 40192, 256), ("alloc", BASE + 40192, 256)]  # fmt: skip
    assert sim.log[2].requested == 40000
    gpu = sim.allocator.allocators[0]
    assert gpu.stats().bytes_in_use == 40192 + 256
    view = a[10:20]
    assert view.data.ptr == BASE + 10 * 100 * 4
    del a  # the view keeps the memory
    assert gpu.stats().bytes_in_use == 40192 + 256
    del view
    assert gpu.stats().bytes_in_use == 256
    assert sim.log.filter(kind="free")[0].address == BASE
    del b
    assert gpu.stats().bytes_in_use == 0
    gpu.check()
    assert gpuviz.replay(sim.log).state_at(-1) == gpu.state()


def test_zero_byte_arrays_and_explicit_device_ids(sim) -> None:  # type: ignore[no-untyped-def]
    empty = cupy.empty(0)
    assert empty.data.ptr == 0 and empty.size == 0
    assert len(sim.log) == 0  # no allocation was recorded for 0 bytes


def test_frees_from_another_thread(sim) -> None:  # type: ignore[no-untyped-def]
    arrays = [cupy.empty(1000 + i) for i in range(50)]
    gpu = sim.allocator.allocators[0]
    assert gpu.stats().bytes_in_use > 0

    def drop() -> None:
        while arrays:
            arrays.pop()

    worker = threading.Thread(target=drop)
    worker.start()
    worker.join()
    assert gpu.stats().bytes_in_use == 0
    gpu.check()
    assert {e.thread for e in sim.log.filter(kind="free")} == {worker.ident}


def test_oom_is_catchable_as_cupys_error_with_the_diagnosis(sim) -> None:  # type: ignore[no-untyped-def]
    keep = [cupy.empty(4 * MiB, dtype=cupy.uint8) for _ in range(16)]  # fills the 64 MiB device
    del keep[::2]  # 32 MiB free, in 4 MiB holes
    with pytest.raises(cupy.cuda.memory.OutOfMemoryError) as info:
        cupy.empty(8 * MiB, dtype=cupy.uint8)
    error = info.value
    assert isinstance(error, gpuviz.OutOfMemoryError)
    assert error.fragmentation is True and "fragmentation" in str(error)
    assert sim.log[-1].kind == "oom"


def test_uninstall_restores_the_previous_allocator_and_functions(sim) -> None:  # type: ignore[no-untyped-def]
    assert cupy.cuda.get_allocator() is sim.allocator
    assert TransferHooks.wrapped(cupy.ndarray.get) and TransferHooks.wrapped(cupy.ndarray.set)
    assert TransferHooks.wrapped(cupy._core.array)
    survivor = cupy.empty(100)
    log = gcupy.uninstall()
    assert log is sim.log
    assert cupy.cuda.get_allocator() is sim.previous_allocator
    assert "get" not in vars(cupy.ndarray) and "set" not in vars(cupy.ndarray)
    assert not TransferHooks.wrapped(cupy._core.array)
    del survivor  # memory allocated while installed still goes back to gpuviz
    assert sim.allocator.allocators[0].stats().bytes_in_use == 0
    with pytest.raises(RuntimeError, match="not installed"):
        gcupy.uninstall()


def test_context_manager_and_double_install() -> None:
    with gcupy.installed(upstream=lambda d: SimUpstream("16MiB"), current_device=lambda: 0, cupti=False) as s:
        with pytest.raises(RuntimeError, match="already installed"):
            gcupy.install()
        cupy.empty(10)
        assert len(s.log.filter(kind="alloc")) == 1
    assert gcupy.current() is None


@pytest.mark.parametrize(("value", "limit"), [("25%", 16 * MiB), ("1048576", MiB), ("2MiB", 2 * MiB)])
def test_cupy_gpu_memory_limit_is_honoured(monkeypatch: pytest.MonkeyPatch, value: str, limit: int) -> None:
    monkeypatch.setenv("CUPY_GPU_MEMORY_LIMIT", value)
    with gcupy.installed(upstream=lambda d: SimUpstream("64MiB"), current_device=lambda: 0, cupti=False) as s:
        cupy.empty(1)
        assert s.allocator.allocators[0].memory_limit == limit


def test_copies_without_a_driver_fail_cleanly_and_record_nothing(sim) -> None:  # type: ignore[no-untyped-def]
    a = cupy.empty(10)
    before = len(sim.log)
    with pytest.raises(cupy.cuda.runtime.CUDARuntimeError):
        a.get()  # reaches the wrapper, then CuPy's copy fails: nothing moved, nothing recorded
    with pytest.raises(cupy.cuda.runtime.CUDARuntimeError):
        cupy.asnumpy(a)
    with pytest.raises(cupy.cuda.runtime.CUDARuntimeError):
        cupy.asarray(np.ones(3))
    assert len(sim.log.filter(kind="transfer")) == 0
    assert len(sim.log) >= before


def test_stacks_point_at_the_users_line() -> None:
    with gcupy.installed(upstream=lambda d: SimUpstream("16MiB"), current_device=lambda: 0, cupti=False,
                         stacks=True) as s:  # fmt: skip
        cupy.zeros  # noqa: B018 - CuPy's own frames are skipped, not only gpuviz's
        cupy.empty(10)
        event = s.log.filter(kind="alloc")[0]
        frame = s.log.stacks[event.stack][0]
        assert frame.filename == __file__ and frame.function == "test_stacks_point_at_the_users_line"


def test_the_free_path_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    alloc = gpuviz.BFCAllocator(SimUpstream("1MiB"))
    block = Block(alloc, 12345)
    with caplog.at_level(logging.ERROR, logger="gpuviz"):
        del block
    assert "freeing 0x3039 failed" in caplog.text


def test_nvml_without_a_driver_says_no_nvidia_device() -> None:
    if HAS_GPU:
        pytest.skip("a GPU is present")
    status = nvml_status()
    assert status.available is False and status.reason.startswith("no NVIDIA device")
    assert device_facts() == [] and facts_for_pci_bus_id("0000:3b:00.0") is None


def test_cupti_reports_why_it_cannot_run() -> None:
    usable, why = cupti_status()
    if usable:
        pytest.skip("CUPTI works here")
    assert why
    with pytest.raises(RuntimeError, match=re.escape(why)):
        gcupy.install(upstream=lambda d: SimUpstream("16MiB"), current_device=lambda: 0, cupti=True)
    assert gcupy.current() is None
    assert "get" not in vars(cupy.ndarray)


# ------------------------------------------------------------------ with a real GPU


@pytest.mark.gpu
def test_gpu_allocation_round_trip_and_transfers() -> None:
    host = np.arange(1 << 20, dtype=np.float32)
    with gcupy.installed(cupti=False) as s:
        x = cupy.asarray(host)  # H2D through the wrapper
        y = (x * 2).sum()
        assert float(y) == float((host * 2).sum())  # D2H through get()
        gpu = s.allocator.allocators[cupy.cuda.runtime.getDevice()]
        assert gpu.stats().bytes_in_use >= host.nbytes
        transfers = s.log.filter(kind="transfer")
        assert next((e.flags, e.size) for e in transfers) == (int(gpuviz.log.schema.Direction.H2D), host.nbytes)
        del x, y
    gpu.check()
    assert gpuviz.replay(s.log).state_at(-1, device=gpu.device) == gpu.state()


@pytest.mark.gpu
def test_nvml_agrees_with_cupy() -> None:
    device = cupy.cuda.Device(0)
    facts = facts_for_pci_bus_id(device.pci_bus_id)
    assert facts is not None
    free, total = cupy.cuda.runtime.memGetInfo()
    assert facts.total_bytes == total
    assert abs(facts.free_bytes - free) < 256 * MiB


@pytest.mark.gpu
def test_cupti_sees_the_copies() -> None:
    if not cupti_status()[0]:
        pytest.skip(cupti_status()[1])
    with gcupy.installed(cupti=True) as s:
        cupy.asarray(np.ones(1 << 20, dtype=np.uint8)).get()
        s.cupti.flush()
    cupti_events = s.log.filter(kind="transfer", tag="cupti")
    assert {e.flags for e in cupti_events} >= {1, 2}
