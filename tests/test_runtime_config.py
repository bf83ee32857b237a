"""gpuviz.config: every call, and its error once the runtime is initialised."""

from __future__ import annotations

import numpy as np
import pytest

import gpuviz
from gpuviz import EventLog, config
from gpuviz.base.units import GiB, MiB
from gpuviz.runtime import config as runtime_config
from gpuviz.runtime.context import get_runtime


def test_defaults(runtime_log: EventLog) -> None:
    assert [d.name for d in config.list_physical_devices()] == ["/physical_device:CPU:0", "/physical_device:GPU:0"]
    assert [d.name for d in config.list_physical_devices("GPU")] == ["/physical_device:GPU:0"]
    assert config.get_soft_device_placement() is True
    assert config.get_log_device_placement() is False
    assert config.get_memory_growth("GPU:0") is False
    logical = config.list_logical_devices()
    assert [(d.name, d.device_type) for d in logical] == [("/device:CPU:0", "CPU"), ("/device:GPU:0", "GPU")]
    gpu = get_runtime().devices["GPU:0"].allocator
    # preallocation of nearly all memory: 16 GiB minus what TF leaves to the system
    assert gpu.memory_limit == 16 * GiB - 1536 * MiB and gpu.growth is False


def test_simulated_gpus_growth_fraction(runtime_log: EventLog) -> None:
    config.set_simulated_gpus(count=2, memory="4GiB")
    for gpu in config.list_physical_devices("GPU"):
        config.set_memory_growth(gpu, True)
    config.set_memory_fraction(0.5)
    runtime = get_runtime()
    gpu0, gpu1 = runtime.devices["GPU:0"].allocator, runtime.devices["GPU:1"].allocator
    assert (gpu0.memory_limit, gpu0.growth) == (2 * GiB, True)
    assert (gpu1.memory_limit, gpu1.growth) == (2 * GiB, True)
    assert gpu0.stats().pool_bytes == gpu1.stats().pool_bytes == 0  # growth: nothing reserved yet
    gpuviz.asarray([1.0])
    assert (gpu0.stats().pool_bytes, gpu1.stats().pool_bytes) == (2 * MiB, 0)  # the first step only


def test_every_visible_gpu_is_preallocated_at_initialisation(runtime_log: EventLog) -> None:
    config.set_simulated_gpus(count=2, memory="4GiB")
    runtime = get_runtime()
    gpuviz.asarray([1.0])  # one array, on GPU:0
    pools = [runtime.devices[name].allocator.stats().pool_bytes for name in ("GPU:0", "GPU:1")]
    assert pools == [4 * GiB - 1536 * MiB] * 2  # 2.5 GiB each, as TensorFlow maps every GPU
    reserved = [(e.device, e.size) for e in runtime_log.filter(kind="segment_alloc")]
    assert reserved == [("GPU:0", 2560 * MiB), ("GPU:1", 2560 * MiB)]
    kinds = [e.kind for e in runtime_log if e.kind != "mark"]
    assert kinds[:2] == ["segment_alloc", "segment_alloc"]  # both at initialisation, before any array
    gpuviz.reset()  # a release returns the pools; they are reserved again at the next allocation only
    assert [runtime.devices[name].allocator.stats().pool_bytes for name in ("GPU:0", "GPU:1")] == [0, 0]


def test_hiding_a_gpu_saves_its_memory(runtime_log: EventLog) -> None:
    config.set_simulated_gpus(count=2, memory="4GiB")
    config.set_visible_devices(config.list_physical_devices("GPU")[:1], "GPU")
    runtime = get_runtime()
    gpus = [d for d in runtime.devices.values() if d.is_gpu]
    assert [(d.name, d.allocator.stats().pool_bytes) for d in gpus] == [("GPU:0", 2560 * MiB)]
    assert sum(upstream.reserved for upstream in {d.upstream for d in gpus}) == 2560 * MiB  # not 5 GiB


def test_logical_devices_are_each_preallocated(runtime_log: EventLog) -> None:
    config.set_logical_device_configuration("GPU:0", [64, 32])
    runtime = get_runtime()
    assert [runtime.devices[n].allocator.stats().pool_bytes for n in ("GPU:0", "GPU:1")] == [64 * MiB, 32 * MiB]
    assert runtime.devices["GPU:0"].upstream.reserved == 96 * MiB


def test_memory_growth_cannot_differ_between_gpus(runtime_log: EventLog) -> None:
    config.set_simulated_gpus(count=2, memory="4GiB")
    gpus = config.list_physical_devices("GPU")
    config.set_memory_growth(gpus[1], True)  # GPU:0 left unset, as TensorFlow counts it
    for _ in range(2):  # refused at initialisation, every time, and nothing is initialised
        with pytest.raises(ValueError, match=r"^Memory growth cannot differ between GPU devices$"):
            config.list_logical_devices()
        assert runtime_config.current().initialized is False and len(runtime_log) == 0
    config.set_memory_growth(gpus[0], False)
    with pytest.raises(ValueError, match="Memory growth cannot differ"):
        gpuviz.asarray([1.0])
    config.set_memory_growth(gpus[0], True)
    assert [d.name for d in config.list_logical_devices("GPU")] == ["/device:GPU:0", "/device:GPU:1"]


def test_growth_of_a_hidden_gpu_does_not_count(runtime_log: EventLog) -> None:
    config.set_simulated_gpus(count=2, memory="4GiB")
    gpus = config.list_physical_devices("GPU")
    config.set_memory_growth(gpus[0], True)
    config.set_visible_devices([gpus[0]], "GPU")
    assert get_runtime().devices["GPU:0"].allocator.growth is True


def _configuration_cell() -> None:
    """What a notebook's configuration cell does; run again after the runtime started."""
    config.set_backend("simulated")
    config.set_simulated_gpus(2, "4GiB")
    gpus = config.list_physical_devices("GPU")
    for gpu in gpus:
        config.set_memory_growth(gpu, True)
    config.set_visible_devices(gpus, "GPU")
    config.set_memory_limit(gpus[0], "1GiB")
    config.set_memory_fraction(0.5)
    config.set_record_stacks(False)
    config.set_transfer_model(latency_ns=5000)
    config.set_logical_device_configuration(gpus[1], None)


def test_rerunning_a_configuration_cell_is_silent(runtime_log: EventLog) -> None:
    _configuration_cell()
    x = gpuviz.asarray([1.0, 2.0])
    _configuration_cell()  # the same values: no error, nothing changes
    assert x.tolist() == [1.0, 2.0]
    gpu0 = get_runtime().devices["GPU:0"].allocator
    assert (gpu0.memory_limit, gpu0.growth, config.get_transfer_model().latency_ns) == (GiB, True, 5000)
    gpus = config.list_physical_devices("GPU")
    changes = [
        lambda: config.set_simulated_gpus(2, "8GiB"),
        lambda: config.set_memory_growth(gpus[0], False),
        lambda: config.set_visible_devices(gpus[:1], "GPU"),
        lambda: config.set_memory_limit(gpus[0], "2GiB"),
        lambda: config.set_memory_fraction(0.25),
        lambda: config.set_record_stacks(True),
        lambda: config.set_transfer_model(latency_ns=1),
        lambda: config.set_logical_device_configuration(gpus[1], [512]),
    ]
    for change in changes:  # a real change after initialisation still raises
        with pytest.raises(RuntimeError, match="cannot be modified after being initialized"):
            change()
    assert (gpu0.memory_limit, config.get_transfer_model().latency_ns, config.get_memory_growth(gpus[0])) == (
        GiB,
        5000,
        True,
    )


def test_experimental_namespace_as_in_tensorflow(runtime_log: EventLog) -> None:
    experimental = config.experimental
    assert experimental.set_memory_growth is config.set_memory_growth
    assert experimental.get_memory_growth is config.get_memory_growth
    assert experimental.set_virtual_device_configuration is config.set_logical_device_configuration
    assert experimental.VirtualDeviceConfiguration is config.LogicalDeviceConfiguration
    experimental.set_memory_growth(config.list_physical_devices("GPU")[0], True)
    assert experimental.get_memory_info("GPU:0") == {"current": 0, "peak": 0}
    a = gpuviz.asarray(np.zeros(1000, dtype=np.float32))  # 4000 B -> a 4096 B chunk
    b = gpuviz.asarray(np.zeros(100, dtype=np.float32))  # 400 B -> 512 B
    assert experimental.get_memory_info("/device:GPU:0") == {"current": 4608, "peak": 4608}
    a.release()
    assert experimental.get_memory_info("GPU:0") == {"current": 512, "peak": 4608}
    experimental.reset_memory_stats("/GPU:0")
    assert experimental.get_memory_info("GPU:0") == {"current": 512, "peak": 512}
    assert experimental.get_memory_info("CPU:0")["current"] == 0
    with pytest.raises(ValueError, match="unknown device 'GPU:3'; the devices are CPU:0, GPU:0"):
        experimental.get_memory_info("GPU:3")
    with pytest.raises(ValueError):
        experimental.reset_memory_stats("banana:0")
    assert b.tolist() == [0.0] * 100


def test_every_setter_fails_after_initialisation(runtime_log: EventLog) -> None:
    config.list_logical_devices()
    calls = [
        (lambda: config.set_simulated_gpus(2), "Physical devices cannot be modified after being initialized"),
        (lambda: config.set_memory_growth("GPU:0", True), "Physical devices cannot be modified"),
        (lambda: config.set_memory_fraction(0.5), "Physical devices cannot be modified"),
        (lambda: config.set_logical_device_configuration("GPU:0", [512]), "Virtual devices cannot be modified"),
        (lambda: config.set_visible_devices([]), "Visible devices cannot be modified"),
        (lambda: config.set_transfer_model(latency_ns=0), "The transfer model cannot be modified"),
    ]
    for call, message in calls:
        with pytest.raises(RuntimeError, match=message):
            call()
    config.set_soft_device_placement(False)  # these two may change at any time
    config.set_log_device_placement(True)
    assert config.get_soft_device_placement() is False and config.get_log_device_placement() is True


def test_bad_configuration_values(runtime_log: EventLog) -> None:
    with pytest.raises(ValueError, match="non-GPU"):
        config.set_memory_growth("/physical_device:CPU:0", True)
    with pytest.raises(ValueError, match="unknown physical device"):
        config.set_memory_growth("GPU:5", True)
    with pytest.raises(ValueError, match=r"memory fraction must be in \(0, 1\]"):
        config.set_memory_fraction(1.5)
    with pytest.raises(ValueError, match="more than the"):
        config.set_logical_device_configuration("GPU:0", ["10GiB", "10GiB"])
    with pytest.raises(ValueError, match="unknown unit"):
        config.set_simulated_gpus(1, memory="4 bananas")
    with pytest.raises(ValueError, match="unknown transfer model fields: speed"):
        config.set_transfer_model(speed=3)
    config.set_logical_device_configuration("GPU:0", [1024, 1024])
    with pytest.raises(ValueError, match="virtual devices configured"):
        config.set_memory_growth("GPU:0", True)


def test_logical_devices_each_have_their_own_allocator_and_limit(runtime_log: EventLog) -> None:
    gpu = config.list_physical_devices("GPU")[0]
    config.set_logical_device_configuration(
        gpu, [config.LogicalDeviceConfiguration(memory_limit=64), config.LogicalDeviceConfiguration("32MiB")]
    )
    assert [d.name for d in config.list_logical_devices("GPU")] == ["/device:GPU:0", "/device:GPU:1"]
    runtime = get_runtime()
    assert runtime.devices["GPU:0"].allocator.memory_limit == 64 * MiB
    assert runtime.devices["GPU:1"].allocator.memory_limit == 32 * MiB
    import numpy as np

    with gpuviz.device("GPU:1"):
        keep = gpuviz.asarray(np.zeros(1000))
    before = runtime.devices["GPU:1"].allocator.state()
    with gpuviz.device("GPU:0"), pytest.raises(gpuviz.OutOfMemoryError):
        gpuviz.asarray(np.zeros(10 * MiB))  # 80 MiB > 64 MiB
    assert runtime.devices["GPU:1"].allocator.state() == before  # the other logical device is untouched
    assert keep.sum().item() == 0.0
    # both logical devices live in the one physical GPU's address space
    assert runtime.devices["GPU:0"].upstream is runtime.devices["GPU:1"].upstream


def test_visible_devices(runtime_log: EventLog) -> None:
    config.set_simulated_gpus(3, "1GiB")
    gpus = config.list_physical_devices("GPU")
    config.set_visible_devices([gpus[2]], "GPU")
    assert [d.name for d in config.get_visible_devices()] == ["/physical_device:CPU:0", "/physical_device:GPU:2"]
    assert [d.name for d in config.list_logical_devices("GPU")] == ["/device:GPU:0"]
    assert get_runtime().devices["GPU:0"].upstream.base == 3 << 40  # physical GPU 2


def test_no_visible_gpu_runs_everything_on_the_cpu(runtime_log: EventLog) -> None:
    config.set_visible_devices([], "GPU")
    x = gpuviz.asarray([1, 2, 3]) * 2
    assert x.device == "CPU:0"
    assert len(runtime_log.filter(kind="transfer")) == 0


def test_simulated_gpus_are_used_even_where_real_gpus_exist(
    runtime_log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the hardware seam: CuPy reports two real GPUs
    monkeypatch.setattr("gpuviz.runtime.config.cupy_gpu_count", lambda: 2)
    assert config.get_backend() == "cupy"
    config.set_simulated_gpus(3, "1GiB")
    assert config.get_backend() == "simulated"
    assert len(config.list_physical_devices("GPU")) == 3
    gpuviz.reset(configuration=True)
    config.set_backend("cupy")
    with pytest.raises(ValueError, match="not used with the cupy backend"):
        config.set_simulated_gpus(1)
    assert config.get_backend() == "cupy"  # unchanged


def test_limits_are_checked_against_the_real_gpus_memory(
    runtime_log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the hardware seam: one real 80 GiB GPU (the simulated default is 16 GiB)
    monkeypatch.setattr("gpuviz.runtime.config.cupy_gpu_count", lambda: 1)
    monkeypatch.setattr("gpuviz.runtime.config.cupy_gpu_memory", lambda index: 80 * GiB)
    assert config.gpu_memory(0) == 80 * GiB
    config.set_memory_limit("GPU:0", "40GiB")
    config.set_logical_device_configuration("GPU:0", ["30GiB", "30GiB"])
    with pytest.raises(ValueError, match=f"between 1 MiB and the GPU's {80 * GiB} bytes"):
        config.set_memory_limit("GPU:0", "81GiB")
    with pytest.raises(ValueError, match=f"more than the {80 * GiB} bytes of GPU:0"):
        config.set_logical_device_configuration("GPU:0", ["50GiB", "40GiB"])
    assert [c.memory_limit_bytes for c in config.get_logical_device_configuration("GPU:0") or []] == [30 * GiB] * 2
