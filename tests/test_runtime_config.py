"""gpuviz.config: every call, and its error once the runtime is initialised."""

from __future__ import annotations

import pytest

import gpuviz
from gpuviz import EventLog, config
from gpuviz.base.units import GiB, MiB
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
    config.set_memory_growth(config.list_physical_devices("GPU")[1], True)
    config.set_memory_fraction(0.5)
    runtime = get_runtime()
    gpu0, gpu1 = runtime.devices["GPU:0"].allocator, runtime.devices["GPU:1"].allocator
    assert (gpu0.memory_limit, gpu0.growth) == (2 * GiB, False)
    assert (gpu1.memory_limit, gpu1.growth) == (2 * GiB, True)
    gpuviz.asarray([1.0])
    assert gpu0.stats().pool_bytes == 2 * GiB  # preallocated at the first allocation
    with gpuviz.device("GPU:1"):
        gpuviz.asarray([1.0])
    assert gpu1.stats().pool_bytes == 2 * MiB  # grew by the first step only


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
