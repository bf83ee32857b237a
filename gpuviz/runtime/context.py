"""The device runtime: logical devices with their allocators, placement, copies, release.

Initialised lazily from ``gpuviz.config`` at the first use. Every logical device has a
``gpuviz.BFCAllocator``; all of them record into one EventLog (``gpuviz.default_log()``, or the
log of the active ``Session``). Simulated GPUs are ``SimUpstream``s backed by lazily
committed host memory, so data on them is real.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from gpuviz.base.devices import DeviceSpec, parse_device
from gpuviz.base.scopes import ThreadStack
from gpuviz.base.units import GiB, MiB
from gpuviz.capture.bfc import ReferenceBFCAllocator
from gpuviz.capture.events import record_placement, record_transfer
from gpuviz.capture.marks import default_log, run_log, set_default_log
from gpuviz.capture.native import allocator_class
from gpuviz.capture.upstream import SimUpstream, Upstream
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Direction
from gpuviz.runtime import config as _config_module
from gpuviz.runtime.backends import Backend, CupyBackend, SimulatedBackend
from gpuviz.runtime.config import LogicalDevice

__all__ = [
    "Device",
    "Buffer",
    "Runtime",
    "get_runtime",
    "device",
    "reset",
    "reconfigure",
    "record_into",
    "record_run",
    "record_from_start",
    "Session",
    "current_scope",
    "device_names",
]

CPU_BASE = 1 << 48
"""Address of the simulated host memory; simulated GPU i starts at ``(i + 1) << 40``."""


def min_system_memory(available: int) -> int:
    """Bytes TensorFlow leaves to the system when it preallocates a GPU (compute capability 8.x figure)."""
    return 225 * MiB if available < 2 * GiB else 1536 * MiB


class Buffer:
    """Device memory owned by one or more DeviceArrays; freed when the last one is gone
    (``__del__``: cheaper per array than a ``weakref.finalize``), or at ``release()``."""

    __slots__ = ("__weakref__", "address", "device", "nbytes", "released")

    def __init__(self, device: Device, address: int, nbytes: int) -> None:
        self.device = device
        self.address = address
        self.nbytes = nbytes
        self.released: str | None = None

    def release(self, reason: str = "released") -> None:
        """Free the memory now; arrays on it raise when used afterwards."""
        if self.released is None:
            self.released = reason
            self.device.buffers.pop(id(self), None)
            self.device.allocator.free(self.address)

    def __del__(self) -> None:
        if self.released is None:
            self.released = "garbage collected"
            try:
                self.device.buffers.pop(id(self), None)
                self.device.allocator.free(self.address)
            except Exception:
                if not sys.is_finalizing():  # at interpreter exit the allocator may be gone already
                    raise


class Device:
    """A logical device: its name, allocator, backend and (shared with sibling logical
    devices) upstream."""

    def __init__(
        self, spec: DeviceSpec, allocator: ReferenceBFCAllocator, upstream: Upstream, physical: int, backend: Backend
    ) -> None:
        self.spec = spec
        self.name = spec.short
        self.allocator = allocator
        self.upstream = upstream
        self.physical = physical
        self.backend = backend
        self.index = allocator.log.device_index(spec.short)
        self.buffers: dict[int, weakref.ref[Buffer]] = {}  # id -> each live Buffer (dropped at its free)

    @property
    def is_gpu(self) -> bool:
        return self.spec.device_type == "GPU"

    def allocate(self, nbytes: int, tag: str | None) -> Buffer:
        address = self.allocator.allocate(nbytes, tag=tag)
        buffer = Buffer(self, address, nbytes)
        self.buffers[id(buffer)] = weakref.ref(buffer)
        return buffer

    def view(self, buffer: Buffer, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """An array (NumPy or CuPy, by backend) over the buffer's device memory."""
        return self.backend.view(buffer.address, buffer.nbytes, shape, dtype, buffer)

    def __repr__(self) -> str:
        return f"<Device {self.name}>"


class Runtime:
    def __init__(self, log: EventLog) -> None:
        cfg = _config_module.current()
        self.config = cfg
        self.devices: dict[str, Device] = {}
        self._upstreams: list[tuple[Upstream, int, DeviceSpec, dict[str, Any]]] = []
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        self._upstreams.append(
            (SimUpstream(host, base=CPU_BASE, backed=True), -1, DeviceSpec("CPU", 0), {"growth": True})
        )
        real = _config_module.get_backend() == "cupy"
        visible = _visible_gpus(cfg)
        growths = {cfg.memory_growth.get(physical) for physical in visible}
        if len(growths) > 1:  # as TensorFlow: unset, on and off are three different settings
            raise ValueError("Memory growth cannot differ between GPU devices")
        logical_index = 0
        for physical in visible:
            upstream = self._gpu_upstream(physical, real, cfg.gpu_memory)
            memory = upstream.capacity
            limits = cfg.logical.get(physical)
            if limits is None:
                if physical in cfg.memory_limits:
                    limit = cfg.memory_limits[physical]
                elif cfg.memory_fraction is not None:
                    limit = int(memory * cfg.memory_fraction)
                else:
                    limit = memory - min_system_memory(memory)
                limits = [max(limit, MiB)]
            growth = cfg.memory_growth.get(physical, False)
            for limit in limits:
                options = {"memory_limit": limit, "growth": growth, "physical_device": f"GPU:{physical}"}
                self._upstreams.append((upstream, physical, DeviceSpec("GPU", logical_index), options))
                logical_index += 1
        self._build(log)
        for gpu in self.gpus:  # TensorFlow maps every visible GPU at initialisation (not after a release)
            gpu.allocator.preallocate()
        cfg.initialized = True

    @staticmethod
    def _gpu_upstream(physical: int, real: bool, memory: int) -> Upstream:
        if real:
            from gpuviz.cupy.upstream import CupyUpstream

            return CupyUpstream(physical)
        return SimUpstream(memory, base=(physical + 1) << 40, backed=True)

    @staticmethod
    def _backend(upstream: Upstream, physical: int, allocator: ReferenceBFCAllocator) -> Backend:
        if isinstance(upstream, SimUpstream):
            return SimulatedBackend(upstream)
        return CupyBackend(physical, allocator)

    def _build(self, log: EventLog) -> None:
        self.log = log
        log.meta["transfer_model"] = asdict(self.config.transfer)
        self.devices = {}
        for upstream, physical, spec, options in self._upstreams:
            allocator = allocator_class()(
                upstream,
                memory_limit=options.get("memory_limit"),
                growth=options["growth"],
                device=spec.short,
                log=log,
                stacks=self.config.record_stacks,
            )
            if "physical_device" in options:
                log.add_device(spec.short, physical_device=options["physical_device"])
            backend = self._backend(upstream, physical, allocator)
            self.devices[spec.short] = Device(spec, allocator, upstream, physical, backend)
        self.cpu = self.devices["CPU:0"]
        self.gpus = [d for d in self.devices.values() if d.is_gpu]

    def record_into(self, log: EventLog) -> None:
        """Record every device into ``log`` from now on, without releasing anything: the
        current heaps are written first, so replaying ``log`` reproduces them."""
        log.meta["transfer_model"] = asdict(self.config.transfer)
        for dev in self.devices.values():
            dev.allocator.record_into(log)
            dev.index = log.device_index(dev.name)
        for dev in self.devices.values():
            if dev.physical >= 0:
                log.add_device(dev.name, physical_device=f"GPU:{dev.physical}")
        self.log = log

    # ----------------------------------------------------------------- placement
    def place(self, op: str, *, gpu_kernel: bool = True) -> tuple[Device, int, bool]:
        """Where ``op`` runs: (device, requested device index or -1, moved by soft placement)."""
        scope = _scopes.top()  # current_scope(), one call less on every op
        soft_enabled = self.config.soft_placement
        if scope is None:
            target = self.gpus[0] if self.gpus and gpu_kernel else self.cpu
            return target, -1, False
        requested = self.log.add_device(scope.short)
        target_or_none = self.devices.get(scope.short)
        if target_or_none is None:
            if not soft_enabled:
                raise RuntimeError(f"{scope.full} unknown device")
            same_type = [d for d in self.devices.values() if d.spec.device_type == scope.device_type]
            target_or_none = same_type[0] if same_type else self.cpu
            if target_or_none.is_gpu and not gpu_kernel:
                target_or_none = self.cpu
            return target_or_none, requested, True
        if target_or_none.is_gpu and not gpu_kernel:
            if not soft_enabled:
                raise RuntimeError(
                    f"no GPU kernel for op {op} with these inputs on {scope.full}; enable soft device placement"
                )
            return self.cpu, requested, True
        return target_or_none, requested, False

    def record_op(self, op: str, target: Device, requested: int, soft: bool, start_ns: int, duration_ns: int) -> None:
        record_placement(self.log, op, target.index, requested, soft, start_ns, duration_ns)
        if self.config.log_placement:
            print(f"Executing op {op} in device {target.spec.full}", file=sys.stdout)

    # ------------------------------------------------------------------- copies
    def copy(self, source: Any, src: Device, dst: Device, tag: str, reason: str) -> tuple[Buffer, Any]:
        """Allocate on ``dst`` and copy ``source`` (an array on ``src``) there, recording the
        transfer; returns the buffer and ``dst``'s view of it."""
        nbytes = int(source.nbytes)
        buffer = dst.allocate(nbytes, tag)
        start = time.perf_counter_ns()
        view = dst.view(buffer, tuple(source.shape), source.dtype)
        dst.backend.copy_into(view, source)
        self.record_copy(src, dst, nbytes, start, reason)
        return buffer, view

    def record_copy(self, src: Device, dst: Device, nbytes: int, start_ns: int, reason: str) -> None:
        if not (src.is_gpu or dst.is_gpu):
            return  # host to host: not a transfer
        model = self.config.transfer
        if src.is_gpu and dst.is_gpu:
            direction = Direction.D2D
            bandwidth = model.same_gpu_bytes_per_s if src.physical == dst.physical else model.d2d_bytes_per_s
        elif dst.is_gpu:
            direction, bandwidth = Direction.H2D, model.h2d_bytes_per_s
        else:
            direction, bandwidth = Direction.D2H, model.d2h_bytes_per_s
        record_transfer(
            self.log, direction=direction, source=src.index, destination=dst.index, nbytes=nbytes,
            start_ns=start_ns, duration_ns=model.duration_ns(nbytes, bandwidth), tag=reason,
        )  # fmt: skip

    # ------------------------------------------------------------------ release
    def release_all(self) -> None:
        for dev in self.devices.values():
            for ref in list(dev.buffers.values()):
                buffer = ref()
                if buffer is not None:
                    buffer.release("released by gpuviz.reset()")
            dev.allocator.release_free_segments()

    def logical_devices(self, device_type: str | None = None) -> list[LogicalDevice]:
        return [
            LogicalDevice(f"/device:{d.name}", d.spec.device_type)
            for d in self.devices.values()
            if device_type is None or d.spec.device_type == device_type.upper()
        ]


def _visible_gpus(cfg: _config_module._Config) -> list[int]:
    """The physical GPUs the runtime uses."""
    return cfg.visible_gpus if cfg.visible_gpus is not None else list(range(_config_module.gpu_count()))


def device_names() -> list[str]:
    """Short names of the logical devices ops can run on (``["CPU:0", "GPU:0", ...]``): the
    runtime's, or those it will have when it initialises (this does not initialise it)."""
    if _runtime:
        return list(_runtime[0].devices)
    cfg = _config_module.current()
    gpus = sum(len(cfg.logical.get(physical, [0])) for physical in _visible_gpus(cfg))
    return ["CPU:0", *(f"GPU:{i}" for i in range(gpus))]


_runtime: list[Runtime] = []
_runtime_lock = threading.Lock()
_scopes: ThreadStack[DeviceSpec] = ThreadStack()


def get_runtime() -> Runtime:
    """The runtime, initialised from ``gpuviz.config`` at the first call."""
    if _runtime:
        return _runtime[0]
    with _runtime_lock:
        if not _runtime:
            _runtime.append(Runtime(default_log()))
        return _runtime[0]


def current_scope() -> DeviceSpec | None:
    return _scopes.top()


@contextmanager
def device(name: str | LogicalDevice | DeviceSpec) -> Iterator[DeviceSpec]:
    """Run ops (and create arrays) on ``name`` inside the block, e.g. ``with gpuviz.device("/GPU:1"):``."""
    spec = parse_device(name.name if isinstance(name, LogicalDevice) else name)
    with _scopes.pushed(spec):
        yield spec


def reset(*, configuration: bool = False, log: EventLog | None = None) -> None:
    """Free every array the runtime allocated and return all segments upstream.

    Arrays created before become unusable. ``configuration=True`` also returns to the
    uninitialised state with the default configuration, so ``gpuviz.config`` can be set
    anew. ``log`` makes the runtime record into that log from now on.
    """
    with _runtime_lock:
        if _runtime:
            runtime = _runtime[0]
            runtime.release_all()
            if configuration:
                _runtime.clear()
            elif log is not None:
                runtime._build(log)
        if configuration:
            _config_module.reset_configuration()


def reconfigure() -> None:
    """Release everything and let ``gpuviz.config`` be changed again, keeping its values."""
    with _runtime_lock:
        if _runtime:
            _runtime[0].release_all()
            _runtime.clear()
        _config_module.unfreeze()


def record_into(log: EventLog) -> None:
    """Make the runtime record into ``log`` (also the default log for marks) from now on,
    keeping every array: the current heaps are written into ``log`` first."""
    get_runtime().record_into(log)
    set_default_log(log)


def record_from_start(log: EventLog) -> None:
    """Like ``record_into``, but a runtime not started yet stays so: it records into ``log``
    when the first array makes it (no device is initialised for a program that never uses one)."""
    with _runtime_lock:
        started = bool(_runtime)
    if started:
        record_into(log)
    else:
        set_default_log(log)


def record_run(directory: str | Path) -> EventLog:
    """Record this process of a distributed run into its own file in ``directory`` from now on.

    The file is named from the launcher's environment (``RANK``, ``SLURM_PROCID``, ... and the
    host name), e.g. ``node3-rank12.arrow``; the log (returned) becomes the default log as with
    ``record_into``. Setting ``GPUVIZ_LOG_DIR`` before the first use does the same.
    """
    log = run_log(directory)
    record_from_start(log)
    return log


class Session:
    """A fresh recording: on entry everything is released and the runtime records into
    ``session.log`` (also the default log for marks); on exit everything is released
    again and the previous default log returns. ``session.log`` keeps the whole run."""

    def __init__(self, log: EventLog | None = None) -> None:
        self.log = log if log is not None else EventLog()
        self._previous: EventLog | None = None

    def __enter__(self) -> Session:
        self._previous = default_log()
        get_runtime()
        reset(log=self.log)
        set_default_log(self.log)
        return self

    def __exit__(self, *exc: object) -> None:
        previous = self._previous if self._previous is not None else EventLog()
        reset(log=previous)
        set_default_log(previous)
