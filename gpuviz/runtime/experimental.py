"""``gpuviz.config.experimental``: the names TensorFlow keeps under ``tf.config.experimental``.

The device setters are the same functions as in ``gpuviz.config`` (TensorFlow's
``set_virtual_device_configuration`` is ``set_logical_device_configuration``), so code
written for ``tf.config.experimental`` runs unchanged. ``get_memory_info`` and
``reset_memory_stats`` read and reset a logical device's allocator counters; they
initialise the runtime (as any use of a device does).
"""

from __future__ import annotations

from gpuviz.base.devices import parse_device
from gpuviz.runtime.config import (
    LogicalDevice,
    LogicalDeviceConfiguration,
    get_logical_device_configuration,
    get_memory_growth,
    get_visible_devices,
    list_physical_devices,
    set_logical_device_configuration,
    set_memory_growth,
    set_visible_devices,
)
from gpuviz.runtime.context import Device, get_runtime

__all__ = [
    "VirtualDeviceConfiguration",
    "get_memory_growth",
    "get_memory_info",
    "get_virtual_device_configuration",
    "get_visible_devices",
    "list_logical_devices",
    "list_physical_devices",
    "reset_memory_stats",
    "set_memory_growth",
    "set_virtual_device_configuration",
    "set_visible_devices",
]

VirtualDeviceConfiguration = LogicalDeviceConfiguration
set_virtual_device_configuration = set_logical_device_configuration
get_virtual_device_configuration = get_logical_device_configuration


def list_logical_devices(device_type: str | None = None) -> list[LogicalDevice]:
    """The devices ops can run on. Initialises the runtime (configuration is frozen after)."""
    return get_runtime().logical_devices(device_type)


def _device(device: str | LogicalDevice) -> Device:
    name = device.name if isinstance(device, LogicalDevice) else device
    spec = parse_device(name)
    runtime = get_runtime()
    found = runtime.devices.get(spec.short)
    if found is None:
        raise ValueError(f"unknown device {name!r}; the devices are {', '.join(runtime.devices)}")
    return found


def get_memory_info(device: str | LogicalDevice) -> dict[str, int]:
    """``{"current": bytes in use, "peak": peak bytes in use}`` of a logical device's
    allocator (chunk sizes, as TensorFlow counts them), e.g. ``get_memory_info("GPU:0")``."""
    stats = _device(device).allocator.stats()
    return {"current": stats.bytes_in_use, "peak": stats.peak_bytes_in_use}


def reset_memory_stats(device: str | LogicalDevice) -> None:
    """Reset a logical device's peak to its current bytes in use (TensorFlow's
    ``reset_memory_stats``: the allocator's ``clear_stats``)."""
    _device(device).allocator.clear_stats()
