"""What TensorFlow's memory traces share: allocator names -> devices, dtypes, tags.

Used by the XPlane and XProf memory-profile importers. TensorFlow names an allocator per
device (``GPU_0_bfc``) plus host allocators (``gpu_host_bfc``, ``cpu``, ...); each becomes one
gpuviz device: ``GPU_N_bfc`` -> ``GPU:N``, every other allocator -> a host device ``CPU:k``
(k counts host allocators in order of appearance), with ``{"allocator": name}`` in its options.
"""

from __future__ import annotations

import re

from gpuviz.base.tags import array_tag

__all__ = ["DTYPE_BY_ENUM", "dtype_name", "allocator_device", "memory_tag", "parse_shape"]

# tensorflow/core/framework/types.proto DataType enum -> the dtype names gpuviz tags use.
DTYPE_BY_ENUM: dict[int, str] = {
    1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string",
    8: "complex64", 9: "int64", 10: "bool", 11: "qint8", 12: "quint8", 13: "qint32", 14: "bfloat16",
    15: "qint16", 16: "quint16", 17: "uint16", 18: "complex128", 19: "float16", 20: "resource",
    21: "variant", 22: "uint32", 23: "uint64", 24: "float8_e5m2", 25: "float8_e4m3fn", 29: "int4", 30: "uint4",
}  # fmt: skip
# TensorFlow's DataTypeString names (XProf JSON's dataType) that differ from gpuviz's.
_DTYPE_BY_TF_NAME = {"float": "float32", "double": "float64", "half": "float16"}
_GPU_ALLOCATOR = re.compile(r"^(?:XLA_)?(GPU|TPU)_(\d+)_bfc$")
_SHAPE = re.compile(r"^\[(-?\d+(?:,-?\d+)*)?\]$")
_TAG_UNSAFE = re.compile(r"[:\[\]]")


def dtype_name(value: int | str | None) -> str | None:
    """gpuviz's name of a TensorFlow dtype, from the enum number or TF's name; None when invalid."""
    if value is None:
        return None
    if isinstance(value, int):
        return DTYPE_BY_ENUM.get(value)
    name = value.strip()
    if not name or name.upper() == "INVALID":
        return None
    return _DTYPE_BY_TF_NAME.get(name, name)


def allocator_device(allocator: str, hosts: dict[str, str]) -> str:
    """The gpuviz device of TF allocator ``allocator``; ``hosts`` (allocator -> device) grows
    as host allocators are met, so each gets its own ``CPU:k``."""
    match = _GPU_ALLOCATOR.match(allocator)
    if match:
        return f"{match[1]}:{int(match[2])}"
    if allocator not in hosts:
        hosts[allocator] = f"CPU:{len(hosts)}"
    return hosts[allocator]


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    """``"[4,384,1024]"`` -> ``(4, 384, 1024)``; ``"[]"`` -> ``()``; None when not a static shape."""
    if not text:
        return None
    match = _SHAPE.match(text.replace(" ", ""))
    if match is None:
        return None
    dims = tuple(int(n) for n in match[1].split(",")) if match[1] else ()
    return None if any(n < 0 for n in dims) else dims


def memory_tag(op: str | None, dtype: str | None, shape: str | None) -> str | None:
    """The runtime tag ``op:dtype[shape]`` where the trace has all three, else the op name alone
    (characters the tag form reserves, ``:[]``, become ``_`` in the op name)."""
    if not op:
        return None
    op = _TAG_UNSAFE.sub("_", op)
    dims = parse_shape(shape)
    if dtype is None or dims is None:
        return op
    return array_tag(op, dtype, dims)
