"""``gpuviz.config``: device configuration (see ``gpuviz.runtime.config``); TensorFlow's
``tf.config.experimental`` names are under ``gpuviz.config.experimental``."""

from gpuviz.runtime import experimental
from gpuviz.runtime.config import (
    LogicalDevice,
    LogicalDeviceConfiguration,
    PhysicalDevice,
    TransferModel,
    get_backend,
    get_log_device_placement,
    get_logical_device_configuration,
    get_memory_growth,
    get_soft_device_placement,
    get_transfer_model,
    get_visible_devices,
    gpu_memory,
    list_physical_devices,
    set_backend,
    set_log_device_placement,
    set_logical_device_configuration,
    set_memory_fraction,
    set_memory_growth,
    set_memory_limit,
    set_record_stacks,
    set_simulated_gpus,
    set_soft_device_placement,
    set_transfer_model,
    set_visible_devices,
)


def list_logical_devices(device_type: str | None = None) -> list[LogicalDevice]:
    """The devices ops can run on. Initialises the runtime (configuration is frozen after)."""
    from gpuviz.runtime.context import get_runtime

    return get_runtime().logical_devices(device_type)


__all__ = [
    "experimental",
    "LogicalDevice",
    "LogicalDeviceConfiguration",
    "PhysicalDevice",
    "TransferModel",
    "get_log_device_placement",
    "get_logical_device_configuration",
    "get_memory_growth",
    "get_soft_device_placement",
    "get_transfer_model",
    "get_visible_devices",
    "gpu_memory",
    "list_logical_devices",
    "list_physical_devices",
    "set_log_device_placement",
    "set_logical_device_configuration",
    "set_memory_fraction",
    "get_backend",
    "set_backend",
    "set_memory_growth",
    "set_memory_limit",
    "set_record_stacks",
    "set_simulated_gpus",
    "set_soft_device_placement",
    "set_transfer_model",
    "set_visible_devices",
]
