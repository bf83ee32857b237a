"""Device strings in TensorFlow's syntax.

Accepted: ``/job:localhost/replica:0/task:0/device:GPU:0``, ``/device:CPU:0``, ``/GPU:0``,
``/gpu:0``, ``GPU:0``, ``gpu:1``, ``/cpu:0``, ``CPU`` (index 0). Job, replica and task
must be the local ones (``localhost``, 0, 0): gpuviz runs in one process.
Printed forms: ``full`` (``/job:localhost/replica:0/task:0/device:GPU:0``) and ``short``
(``GPU:0``, the name used in event logs).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DeviceSpec", "parse_device", "DEVICE_TYPES"]

DEVICE_TYPES = ("CPU", "GPU")
_LOCAL = {"job": "localhost", "replica": "0", "task": "0"}


@dataclass(frozen=True, order=True)
class DeviceSpec:
    """A local device: its type (``"CPU"`` or ``"GPU"``) and index."""

    device_type: str
    index: int

    @property
    def short(self) -> str:
        return f"{self.device_type}:{self.index}"

    @property
    def full(self) -> str:
        return f"/job:localhost/replica:0/task:0/device:{self.short}"

    def __str__(self) -> str:
        return self.short


def _parse_type_and_index(type_text: str, index_text: str | None, whole: str) -> DeviceSpec:
    device_type = type_text.upper()
    if device_type not in DEVICE_TYPES:
        raise ValueError(f"unknown device type {type_text!r} in {whole!r} (known: {', '.join(DEVICE_TYPES)})")
    if index_text is None:
        return DeviceSpec(device_type, 0)
    if not index_text.isdigit():
        raise ValueError(f"device index {index_text!r} in {whole!r} is not a non-negative integer")
    return DeviceSpec(device_type, int(index_text))


def parse_device(text: str | DeviceSpec) -> DeviceSpec:
    """Parse a device string; ``ValueError`` naming the bad part when it is malformed."""
    if isinstance(text, DeviceSpec):
        return text
    if not isinstance(text, str):
        raise TypeError(f"a device must be a string like 'GPU:0', not {type(text).__name__}")
    whole = text
    stripped = text.strip()
    if not stripped or stripped == "/":
        raise ValueError(f"empty device string {whole!r}")
    if not stripped.startswith("/"):  # local name: TYPE[:N]
        parts = stripped.split(":")
        if len(parts) > 2:
            raise ValueError(f"malformed device string {whole!r}: expected TYPE:INDEX, e.g. 'GPU:0'")
        return _parse_type_and_index(parts[0], parts[1] if len(parts) == 2 else None, whole)
    spec: DeviceSpec | None = None
    for component in stripped[1:].split("/"):
        if not component:
            raise ValueError(f"empty component in device string {whole!r}")
        key, _, rest = component.partition(":")
        if key in _LOCAL:
            if rest != _LOCAL[key]:
                raise ValueError(f"{key}:{rest} in {whole!r} is not local ({key} must be {_LOCAL[key]})")
            continue
        if spec is not None:
            raise ValueError(f"cannot specify multiple device types: {whole!r}")
        if key == "device":
            type_text, _, index_text = rest.partition(":")
            spec = _parse_type_and_index(type_text, index_text or None, whole)
        elif key.upper() in DEVICE_TYPES:
            spec = _parse_type_and_index(key, rest or None, whole)
        else:
            raise ValueError(f"unknown attribute {component!r} in {whole!r}")
    if spec is None:
        raise ValueError(f"no device type in {whole!r}")
    return spec
