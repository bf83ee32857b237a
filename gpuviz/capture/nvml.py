"""Device facts from NVML (package ``nvidia-ml-py``, module ``pynvml``).

What the driver says about each NVIDIA GPU: name, memory total/used/free (bytes),
utilisation (%), per-process memory, PCIe throughput (KB/s over the driver's 20 ms
window). With no driver or no GPU, ``nvml_status()`` says "no NVIDIA device" with the
reason and ``device_facts()`` is empty. NVML numbers devices its own way: match a CuPy
device by PCI bus id (``facts_for_pci_bus_id``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["NvmlStatus", "ProcessMemory", "NvmlDevice", "nvml_status", "device_facts", "facts_for_pci_bus_id"]


@dataclass(frozen=True)
class NvmlStatus:
    available: bool
    reason: str
    count: int = 0
    driver_version: str | None = None


@dataclass(frozen=True)
class ProcessMemory:
    pid: int
    used_bytes: int | None  # None where the driver cannot tell (e.g. WDDM)


@dataclass(frozen=True)
class NvmlDevice:
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    gpu_utilization: int | None
    memory_utilization: int | None
    processes: tuple[ProcessMemory, ...]
    pcie_tx_kbps: int | None
    pcie_rx_kbps: int | None


def _errors() -> tuple[type[BaseException], ...]:
    import pynvml

    # NVMLLibraryMismatchError is not an NVMLError subclass: catch both
    return (pynvml.NVMLError, getattr(pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError), OSError)


@contextmanager
def _nvml() -> Iterator[Any]:
    import pynvml

    pynvml.nvmlInit()
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_status() -> NvmlStatus:
    """Whether NVML works here, how many devices it sees, and the driver version."""
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return NvmlStatus(False, "no NVIDIA device: nvidia-ml-py is not installed")
    try:
        with _nvml() as nvml:
            return NvmlStatus(
                True, "NVML available", nvml.nvmlDeviceGetCount(), _text(nvml.nvmlSystemGetDriverVersion())
            )
    except _errors() as error:
        return NvmlStatus(False, f"no NVIDIA device: {error}")


def _optional(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except _errors():
        return None


def _facts(nvml: Any, index: int, handle: Any) -> NvmlDevice:
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    rates = _optional(nvml.nvmlDeviceGetUtilizationRates, handle)
    processes = _optional(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
    pci = nvml.nvmlDeviceGetPciInfo(handle)
    return NvmlDevice(
        index=index,
        name=_text(nvml.nvmlDeviceGetName(handle)),
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        pci_bus_id=_text(pci.busId),
        total_bytes=int(memory.total),
        used_bytes=int(memory.used),
        free_bytes=int(memory.free),
        gpu_utilization=None if rates is None else int(rates.gpu),
        memory_utilization=None if rates is None else int(rates.memory),
        processes=tuple(
            ProcessMemory(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory)) for p in processes
        ),
        pcie_tx_kbps=_optional(nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_TX_BYTES),
        pcie_rx_kbps=_optional(nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_RX_BYTES),
    )


def device_facts() -> list[NvmlDevice]:
    """Facts of every NVIDIA GPU NVML sees; empty when there is none (or no driver)."""
    try:
        with _nvml() as nvml:
            return [_facts(nvml, i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    except ImportError:
        return []
    except _errors():
        return []


def facts_for_pci_bus_id(bus_id: str) -> NvmlDevice | None:
    """The facts of the GPU at ``bus_id`` (e.g. CuPy's ``Device(i).pci_bus_id``), or None."""
    wanted = bus_id.lower()
    for device in device_facts():
        # NVML prints an 8-digit domain ("00000000:3B:00.0"), CuPy a 4-digit one ("0000:3b:00.0")
        if device.pci_bus_id.lower().endswith(wanted[-12:]):
            return device
    return None
