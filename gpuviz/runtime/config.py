"""Device configuration, in the shape TensorFlow's ``tf.config`` users know.

Everything that shapes devices (simulated GPUs, memory growth, memory fraction, logical
devices, visible devices, the transfer model) must be set before the runtime is
initialised (the first op, array or ``list_logical_devices``); afterwards a change raises
``RuntimeError`` as TensorFlow does, while setting the value already in force returns
silently (so a notebook's configuration cell can run again). Soft placement and placement
logging can change at any time. ``gpuviz.reset(configuration=True)`` returns to the
uninitialised state.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field

from gpuviz.base.devices import parse_device
from gpuviz.base.units import GiB, MiB, parse_bytes
from gpuviz.runtime.backends import cupy_gpu_count, cupy_gpu_memory

__all__ = [
    "PhysicalDevice",
    "LogicalDevice",
    "LogicalDeviceConfiguration",
    "TransferModel",
    "gpu_memory",
    "list_physical_devices",
    "set_simulated_gpus",
    "set_memory_growth",
    "get_memory_growth",
    "check_gpu_options",
    "set_memory_fraction",
    "set_memory_limit",
    "set_record_stacks",
    "set_backend",
    "get_backend",
    "set_logical_device_configuration",
    "get_logical_device_configuration",
    "set_visible_devices",
    "get_visible_devices",
    "set_soft_device_placement",
    "get_soft_device_placement",
    "set_log_device_placement",
    "get_log_device_placement",
    "set_transfer_model",
    "get_transfer_model",
]


@dataclass(frozen=True)
class PhysicalDevice:
    """A physical device: ``name`` like ``/physical_device:GPU:0``."""

    name: str
    device_type: str

    @property
    def index(self) -> int:
        return int(self.name.rsplit(":", 1)[1])


@dataclass(frozen=True)
class LogicalDevice:
    """A logical device ops can run on: ``name`` like ``/device:GPU:0``."""

    name: str
    device_type: str


@dataclass(frozen=True)
class LogicalDeviceConfiguration:
    """One logical device carved from a physical GPU.

    ``memory_limit``: MiB when an int (as in TensorFlow), or a size string such as ``"1GiB"``.
    """

    memory_limit: int | str

    @property
    def memory_limit_bytes(self) -> int:
        if isinstance(self.memory_limit, bool):
            raise TypeError("memory_limit must be MiB (int) or a size string")
        if isinstance(self.memory_limit, int):
            if self.memory_limit <= 0:
                raise ValueError(f"memory_limit must be positive, got {self.memory_limit} MiB")
            return self.memory_limit * MiB
        return parse_bytes(self.memory_limit, name="memory_limit")


@dataclass(frozen=True)
class TransferModel:
    """How long a simulated copy takes: ``latency_ns + nbytes / bandwidth``.

    Bandwidths in bytes per second. The host<->device defaults are an effective PCIe 4.0
    x16 figure (25 GB/s of 31.5 GB/s theoretical); copies between logical devices of one
    physical GPU run at device-memory bandwidth.
    """

    h2d_bytes_per_s: float = 25e9
    d2h_bytes_per_s: float = 25e9
    d2d_bytes_per_s: float = 25e9
    same_gpu_bytes_per_s: float = 1.5e12
    latency_ns: int = 10_000

    def duration_ns(self, nbytes: int, bandwidth: float) -> int:
        return self.latency_ns + int(nbytes * 1e9 / bandwidth)


@dataclass
class _Config:
    simulated_gpus: int = 1
    gpu_memory: int = 16 * GiB
    memory_growth: dict[int, bool] = field(default_factory=dict)
    memory_fraction: float | None = None
    logical: dict[int, list[int]] = field(default_factory=dict)
    visible_gpus: list[int] | None = None
    soft_placement: bool = True
    log_placement: bool = False
    transfer: TransferModel = field(default_factory=TransferModel)
    memory_limits: dict[int, int] = field(default_factory=dict)
    record_stacks: bool = False
    backend: str = "auto"
    initialized: bool = False


_config = _Config()
_lock = threading.RLock()


def _check_not_initialized(what: str) -> None:
    if _config.initialized:
        raise RuntimeError(f"{what} cannot be modified after being initialized")


def _may_change(what: str, current: object, new: object) -> bool:
    """Whether a setter should store ``new``: False when it is the value in force (a silent
    no-op, as in TensorFlow, also after initialisation); ``RuntimeError`` for a real change
    after initialisation."""
    if current == new:
        return False
    _check_not_initialized(what)
    return True


def _gpu_index(device: PhysicalDevice | str) -> int:
    name = device.name if isinstance(device, PhysicalDevice) else device
    spec = parse_device(name.replace("/physical_device:", "/device:"))
    if spec.device_type != "GPU":
        raise ValueError("Cannot set memory growth on non-GPU devices")
    if spec.index >= gpu_count():
        raise ValueError(f"unknown physical device {name!r} ({gpu_count()} GPU(s))")
    return spec.index


BACKENDS = ("auto", "simulated", "cupy")


def set_backend(backend: str) -> None:
    """Where GPUs come from: ``"cupy"`` (real GPUs), ``"simulated"``, or ``"auto"`` (default:
    real GPUs when CuPy finds any, else simulated ones)."""
    with _lock:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
        if not _may_change("The backend", _config.backend, backend):
            return
        if backend == "cupy" and cupy_gpu_count() == 0:
            raise RuntimeError("the cupy backend needs CuPy and an NVIDIA GPU; none was found")
        _config.backend = backend


def get_backend() -> str:
    """The backend in use: ``"cupy"`` or ``"simulated"`` (``"auto"`` resolved)."""
    if _config.backend == "auto":
        return "cupy" if cupy_gpu_count() > 0 else "simulated"
    return _config.backend


def gpu_count() -> int:
    """Physical GPUs: real ones with the cupy backend, else the simulated count."""
    return cupy_gpu_count() if get_backend() == "cupy" else _config.simulated_gpus


def gpu_memory(index: int) -> int:
    """Total memory of physical GPU ``index`` in bytes: the real GPU's with the cupy backend,
    else the simulated size."""
    return cupy_gpu_memory(index) if get_backend() == "cupy" else _config.gpu_memory


def list_physical_devices(device_type: str | None = None) -> list[PhysicalDevice]:
    """The CPU and every GPU of the machine: real ones when CuPy finds them, else simulated."""
    devices = [PhysicalDevice("/physical_device:CPU:0", "CPU")]
    devices += [PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(gpu_count())]
    return [d for d in devices if device_type is None or d.device_type == device_type.upper()]


def set_simulated_gpus(count: int = 1, memory: int | str = "16GiB") -> None:
    """How many simulated GPUs the machine has, and the memory of each.

    With the ``"auto"`` backend this also selects the ``"simulated"`` backend, so the
    simulated GPUs are used even on a machine with real ones; with the ``"cupy"`` backend
    it is an error (call ``set_backend("simulated")`` first).
    """
    with _lock:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"count must be a non-negative int, got {count!r}")
        size = parse_bytes(memory, name="memory")
        if size < MiB:
            raise ValueError(f"a simulated GPU needs at least 1 MiB, got {size} bytes")
        if _config.backend == "cupy":
            raise ValueError("simulated GPUs are not used with the cupy backend; call set_backend('simulated') first")
        current = (get_backend() == "simulated", _config.simulated_gpus, _config.gpu_memory)
        if not _may_change("Physical devices", current, (True, count, size)):
            return
        _config.backend = "simulated"
        _config.simulated_gpus = count
        _config.gpu_memory = size
        _config.memory_growth.clear()
        _config.logical.clear()
        _config.visible_gpus = None


def _growth_index(device: PhysicalDevice | str) -> int:
    index = _gpu_index(device)
    if index in _config.logical:
        raise ValueError("Cannot set memory growth on device when virtual devices configured")
    return index


def _limit_bytes(index: int, limit: int | str) -> int:
    size = parse_bytes(limit, name="memory limit")
    total = gpu_memory(index)
    if not MiB <= size <= total:
        raise ValueError(f"memory limit must be between 1 MiB and the GPU's {total} bytes, got {size}")
    return size


def check_gpu_options(
    device: PhysicalDevice | str, *, memory_growth: bool | None = None, memory_limit: int | str | None = None
) -> None:
    """Raise the ``ValueError``/``TypeError`` that ``set_memory_growth`` / ``set_memory_limit``
    would raise for these values, changing nothing (front-ends validate before they release
    anything)."""
    with _lock:
        index = _growth_index(device) if memory_growth is not None else _gpu_index(device)
        if memory_limit is not None:
            _limit_bytes(index, memory_limit)


def set_memory_growth(device: PhysicalDevice | str, enable: bool) -> None:
    """Reserve GPU memory as needed (True) instead of preallocating nearly all of it (default).

    As in TensorFlow, every visible GPU must have the same setting (checked when the runtime
    initialises: ``ValueError: Memory growth cannot differ between GPU devices``).
    """
    with _lock:
        index = _growth_index(device)
        if _may_change("Physical devices", _config.memory_growth.get(index), bool(enable)):
            _config.memory_growth[index] = bool(enable)


def get_memory_growth(device: PhysicalDevice | str) -> bool:
    return _config.memory_growth.get(_gpu_index(device), False)


def set_memory_limit(device: PhysicalDevice | str, limit: int | str | None) -> None:
    """Cap one GPU's allocator at ``limit`` bytes (or ``"4GiB"``); works with memory growth.

    A gpuviz addition: TensorFlow expresses a limit only through logical devices, which
    exclude memory growth. ``None`` removes the cap.
    """
    with _lock:
        index = _gpu_index(device)
        size = None if limit is None else _limit_bytes(index, limit)
        if not _may_change("Physical devices", _config.memory_limits.get(index), size):
            return
        if size is None:
            _config.memory_limits.pop(index, None)
        else:
            _config.memory_limits[index] = size


def set_record_stacks(enabled: bool) -> None:
    """Record the caller's Python stack with every allocator event (off by default)."""
    with _lock:
        if _may_change("Stack recording", _config.record_stacks, bool(enabled)):
            _config.record_stacks = bool(enabled)


def set_memory_fraction(fraction: float | None) -> None:
    """Limit each GPU to ``fraction`` of its total memory (TF's per_process_gpu_memory_fraction)."""
    with _lock:
        if fraction is not None and (isinstance(fraction, bool) or not 0 < fraction <= 1):
            raise ValueError(f"memory fraction must be in (0, 1], got {fraction!r}")
        if _may_change("Physical devices", _config.memory_fraction, fraction):
            _config.memory_fraction = fraction


def set_logical_device_configuration(
    device: PhysicalDevice | str, logical_devices: list[LogicalDeviceConfiguration | int | str] | None
) -> None:
    """Split a physical GPU into logical GPUs, each with its own allocator and memory limit.

    Items are ``LogicalDeviceConfiguration`` or memory limits (int MiB or size strings).
    ``None`` or ``[]`` removes the split.
    """
    with _lock:
        try:
            index = _gpu_index(device)
        except ValueError as error:
            if "non-GPU" in str(error):
                raise ValueError("Setting memory limit is required for GPU virtual devices only") from None
            raise
        if not logical_devices:
            if _may_change("Virtual devices", _config.logical.get(index), None):
                _config.logical.pop(index, None)
            return
        limits = [
            (
                item if isinstance(item, LogicalDeviceConfiguration) else LogicalDeviceConfiguration(item)
            ).memory_limit_bytes
            for item in logical_devices
        ]
        total = gpu_memory(index)
        if sum(limits) > total:
            raise ValueError(f"logical devices ask for {sum(limits)} bytes, more than the {total} bytes of GPU:{index}")
        if not _may_change("Virtual devices", _config.logical.get(index), limits):
            return
        _config.logical[index] = limits
        _config.memory_growth.pop(index, None)


def get_logical_device_configuration(device: PhysicalDevice | str) -> list[LogicalDeviceConfiguration] | None:
    limits = _config.logical.get(_gpu_index(device))
    return None if limits is None else [LogicalDeviceConfiguration(f"{b}B") for b in limits]


def set_visible_devices(
    devices: list[PhysicalDevice | str] | PhysicalDevice | str, device_type: str | None = None
) -> None:
    """Which physical GPUs the runtime may use (the CPU always stays visible)."""
    with _lock:
        items = devices if isinstance(devices, list) else [devices]
        gpus = []
        for item in items:
            name = item.name if isinstance(item, PhysicalDevice) else item
            spec = parse_device(name.replace("/physical_device:", "/device:"))
            if device_type is not None and spec.device_type != device_type.upper():
                raise ValueError(f"{name} is not a {device_type} device")
            if spec.device_type == "GPU":
                if spec.index >= gpu_count():
                    raise ValueError(f"unknown physical device {name!r}")
                gpus.append(spec.index)
        visible = sorted(set(gpus))
        current = _config.visible_gpus if _config.visible_gpus is not None else list(range(gpu_count()))
        if _may_change("Visible devices", current, visible):
            _config.visible_gpus = visible


def get_visible_devices(device_type: str | None = None) -> list[PhysicalDevice]:
    visible = _config.visible_gpus
    return [
        d for d in list_physical_devices(device_type) if d.device_type == "CPU" or visible is None or d.index in visible
    ]


def set_soft_device_placement(enabled: bool) -> None:
    """Let ops run on another device when the requested one is missing or has no kernel (default on)."""
    _config.soft_placement = bool(enabled)


def get_soft_device_placement() -> bool:
    return _config.soft_placement


def set_log_device_placement(enabled: bool) -> None:
    """Print ``Executing op <Name> in device <full name>`` for every op."""
    _config.log_placement = bool(enabled)


def get_log_device_placement() -> bool:
    return _config.log_placement


def set_transfer_model(model: TransferModel | None = None, **changes: float) -> None:
    """Replace the simulated transfer model, or change some of its fields (bytes/s, ns)."""
    with _lock:
        base = model or _config.transfer
        unknown = set(changes) - set(asdict(base))
        if unknown:
            raise ValueError(f"unknown transfer model fields: {', '.join(sorted(unknown))}")
        values = {**asdict(base), **changes}
        if any(v <= 0 for k, v in values.items() if k.endswith("_per_s")) or values["latency_ns"] < 0:
            raise ValueError("bandwidths must be positive and latency non-negative")
        new = TransferModel(**values)
        if _may_change("The transfer model", _config.transfer, new):
            _config.transfer = new


def get_transfer_model() -> TransferModel:
    return _config.transfer


def unfreeze() -> None:
    """Allow configuration again, keeping the current values (``gpuviz.reconfigure``)."""
    with _lock:
        _config.initialized = False


def reset_configuration() -> None:
    """Back to defaults and uninitialised (used by ``gpuviz.reset(configuration=True)``)."""
    global _config
    with _lock:
        _config = _Config()


def current() -> _Config:
    return _config
