"""DeviceArray: an n-dimensional array whose memory comes from a device's allocator.

Ops run through NumPy's protocols (``__array_ufunc__``, ``__array_function__``), so
ordinary NumPy code works on DeviceArrays. Each op is placed (``Runtime.place``), its
inputs are copied to that device when they live elsewhere (recorded transfers), it runs,
its placement is recorded, and its output is allocated from that device's allocator.
Outputs that NumPy returns as views of an input (reshape, slicing, transpose) share
that input's memory instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from gpuviz.base.tags import array_tag
from gpuviz.runtime.context import Buffer, Device, Runtime, get_runtime

__all__ = ["DeviceArray", "asarray", "empty", "op_name"]

# TensorFlow's names for the ops users see in placement logs; others are CamelCased.
_OP_NAMES = {
    "add": "AddV2",
    "subtract": "Sub",
    "multiply": "Mul",
    "true_divide": "RealDiv",
    "floor_divide": "FloorDiv",
    "matmul": "MatMul",
    "dot": "MatMul",
    "negative": "Neg",
    "power": "Pow",
    "sum": "Sum",
    "mean": "Mean",
    "amax": "Max",
    "max": "Max",
    "amin": "Min",
    "min": "Min",
    "reshape": "Reshape",
    "transpose": "Transpose",
    "concatenate": "ConcatV2",
    "stack": "Pack",
    "getitem": "StridedSlice",
    "setitem": "Assign",
    "astype": "Cast",
    "copy": "Identity",
    "maximum": "Maximum",
    "minimum": "Minimum",
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "equal": "Equal",
    "greater": "Greater",
    "less": "Less",
    "argmax": "ArgMax",
    "argmin": "ArgMin",
}
_GPU_KINDS = frozenset("biufc")  # bool, int, uint, float, complex have GPU kernels


_DTYPE_NAMES: dict[np.dtype, str] = {}


def _dtype_name(dtype: np.dtype) -> str:
    """``dtype.name``, cached (it is computed anew on every access)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


_TAGS: dict[tuple[str, np.dtype, tuple[int, ...]], str] = {}


def _tag(op: str, dtype: np.dtype, shape: tuple[int, ...]) -> str:
    """``array_tag(op, dtype name, shape)``, cached (ops in a loop repeat their tags)."""
    key = (op, dtype, shape)
    tag = _TAGS.get(key)
    if tag is None:
        if len(_TAGS) > 4096:  # a bound for programs with endlessly varying shapes
            _TAGS.clear()
        tag = _TAGS[key] = array_tag(op, _dtype_name(dtype), shape)
    return tag


_SCALARS = frozenset((int, float, bool, complex))


def op_name(name: str) -> str:
    """TensorFlow-style op name for a NumPy function or ufunc name."""
    return _OP_NAMES.get(name) or "".join(part.capitalize() for part in name.split("_"))


class DeviceArray(NDArrayOperatorsMixin):
    """An array on a device. ``device`` is its device name; ``numpy()`` copies it to the host."""

    __array_priority__ = 100

    def __init__(self, buffer: Buffer, view: np.ndarray) -> None:
        self._buffer = buffer
        self._view = view

    # ---------------------------------------------------------------- basics
    @property
    def _data(self) -> np.ndarray:
        if self._buffer.released is not None:
            raise RuntimeError(f"this {self.device} array was {self._buffer.released}")
        return self._view

    @property
    def device(self) -> str:
        return self._buffer.device.name

    @property
    def shape(self) -> tuple[int, ...]:
        return self._view.shape

    @property
    def dtype(self) -> np.dtype:
        return self._view.dtype

    @property
    def ndim(self) -> int:
        return self._view.ndim

    @property
    def size(self) -> int:
        return int(self._view.size)

    @property
    def nbytes(self) -> int:
        return int(self._view.nbytes)

    @property
    def address(self) -> int:
        """Address of the device memory holding the array's first byte."""
        buffer = self._buffer
        return buffer.address + buffer.device.backend.offset(self._view, buffer.address)

    def __len__(self) -> int:
        return len(self._view)

    def release(self) -> None:
        """Free this array's device memory now (views sharing it become unusable too)."""
        self._buffer.release()

    # --------------------------------------------------------------- copies
    def numpy(self) -> np.ndarray:
        """A host copy (a device-to-host transfer when the array is on a GPU)."""
        runtime = get_runtime()
        start = time.perf_counter_ns()
        result = self._buffer.device.backend.to_host(self._data)
        runtime.record_copy(self._buffer.device, runtime.cpu, result.nbytes, start, "numpy")
        return result

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        result = self.numpy()
        return result if dtype is None else result.astype(dtype, copy=False)

    def to(self, device: str) -> DeviceArray:
        """A copy of this array on ``device`` (the same array when it is already there)."""
        runtime = get_runtime()
        target = runtime.devices.get(device) or runtime.devices[_short(device)]
        return _to_device(self, target, runtime, reason="to")

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def item(self) -> Any:
        return self.numpy().item()

    def __float__(self) -> float:
        return float(self.numpy())

    def __int__(self) -> int:
        return int(self.numpy())

    def __bool__(self) -> bool:
        return bool(self.numpy())

    def __iter__(self) -> Iterator[DeviceArray]:
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        if self._buffer.released is not None:
            return f"<DeviceArray {self.dtype}{list(self.shape)} on {self.device}, {self._buffer.released}>"
        body = np.array2string(self.numpy(), separator=", ", prefix="DeviceArray(")
        return f"DeviceArray({body}, dtype={self.dtype}, device='{self.device}')"

    # ------------------------------------------------------------------ ops
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        name = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}_{method}"
        out = kwargs.pop("out", None)
        func: Callable[..., Any] = getattr(ufunc, method)
        result = run_op(op_name(name), func, inputs, kwargs)
        if out is not None:
            targets = out if isinstance(out, tuple) else (out,)
            results = result if isinstance(result, tuple) else (result,)
            for target, value in zip(targets, results, strict=True):
                target[...] = value
            return out if isinstance(out, tuple) and len(out) > 1 else targets[0]
        return result

    def __array_function__(self, func: Callable[..., Any], types: Any, args: Any, kwargs: Any) -> Any:
        if func in (np.shape, np.ndim, np.size):
            return func(self._view)
        return run_op(op_name(func.__name__), func, args, kwargs)

    def __getitem__(self, key: Any) -> Any:
        return run_op("StridedSlice", lambda a, k: a[k], (self, _host_key(key)), {})

    def __setitem__(self, key: Any, value: Any) -> None:
        runtime = get_runtime()
        device = self._buffer.device
        start = time.perf_counter_ns()
        source = _to_device(value, device, runtime, reason="Assign")._data if _is_array(value) else value
        self._data[_host_key(key)] = source
        runtime.record_op("Assign", device, -1, False, start, time.perf_counter_ns() - start)

    def reshape(self, *shape: Any, **kwargs: Any) -> DeviceArray:
        return self._method(np.reshape, shape[0] if len(shape) == 1 else shape, **kwargs)

    def transpose(self, *axes: Any) -> DeviceArray:
        return self._method(np.transpose, axes or None)

    @property
    def T(self) -> DeviceArray:  # NumPy's name
        return self._method(np.transpose)

    def astype(self, dtype: Any) -> DeviceArray:
        return run_op("Cast", lambda a: a.astype(dtype), (self,), {})  # type: ignore[no-any-return]

    def copy(self) -> DeviceArray:
        return run_op("Identity", lambda a: a.copy(), (self,), {})  # type: ignore[no-any-return]

    def sum(self, *args: Any, **kwargs: Any) -> DeviceArray:
        return self._method(np.sum, *args, **kwargs)

    def mean(self, *args: Any, **kwargs: Any) -> DeviceArray:
        return self._method(np.mean, *args, **kwargs)

    def max(self, *args: Any, **kwargs: Any) -> DeviceArray:
        return self._method(np.max, *args, **kwargs)

    def min(self, *args: Any, **kwargs: Any) -> DeviceArray:
        return self._method(np.min, *args, **kwargs)

    def _method(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> DeviceArray:
        return run_op(op_name(func.__name__), func, (self, *args), kwargs)  # type: ignore[no-any-return]


def _short(device: str) -> str:
    from gpuviz.base.devices import parse_device

    return parse_device(device).short


def _host_key(key: Any) -> Any:
    """Index keys are host values; DeviceArray keys (masks, index arrays) are read back."""
    if isinstance(key, DeviceArray):
        return key.numpy()
    if isinstance(key, tuple):
        return tuple(_host_key(k) for k in key)
    return key


def _is_array(value: Any) -> bool:
    return isinstance(value, (DeviceArray, np.ndarray, list))


def _to_device(value: Any, target: Device, runtime: Runtime, *, reason: str) -> DeviceArray:
    """``value`` (a DeviceArray, NumPy array or nested list) as a DeviceArray on ``target``."""
    if isinstance(value, DeviceArray):
        source_device = value._buffer.device
        if source_device is target:
            return value
        data = value._data
    else:
        source_device = runtime.cpu
        data = np.ascontiguousarray(value)
    if data.dtype.kind == "O":
        raise TypeError("DeviceArrays hold numbers, booleans or fixed-width strings, not Python objects")
    buffer, view = runtime.copy(data, source_device, target, _tag(reason, data.dtype, data.shape), reason)
    return DeviceArray(buffer, view)


def _wrap(result: Any, target: Device, op: str, runtime: Runtime, inputs: list[DeviceArray]) -> Any:
    backend = target.backend
    if type(result) is not np.ndarray:  # the common case skips these checks
        if isinstance(result, tuple):
            return tuple(_wrap(r, target, op, runtime, inputs) for r in result)
        if isinstance(result, list) and all(isinstance(r, np.ndarray) or backend.is_array(r) for r in result):
            return [_wrap(r, target, op, runtime, inputs) for r in result]
        if isinstance(result, np.generic):
            result = np.asarray(result)
        if not (isinstance(result, np.ndarray) or backend.is_array(result)):
            return result
    if type(result) is not np.ndarray or result.base is not None:  # a fresh NumPy output shares nothing
        for source in inputs:
            if source._buffer.device is target and backend.shares_memory(result, source._view):
                return DeviceArray(source._buffer, result)  # a view: no new memory
    if result.dtype.kind == "O":
        return result  # Python objects cannot live in raw device memory; they stay on the host
    shape = tuple(result.shape)
    buffer = target.allocate(int(result.nbytes), _tag(op, result.dtype, shape))
    view = target.view(buffer, shape, result.dtype)
    backend.copy_into(view, result)
    return DeviceArray(buffer, view)


def _collect(value: Any, found: list[Any]) -> None:
    if isinstance(value, (DeviceArray, np.ndarray)):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect(item, found)


def _convert(value: Any, target: Device, runtime: Runtime, op: str, moved: list[DeviceArray]) -> Any:
    """``value`` with every array in it replaced by the backend array of its copy on ``target``.

    (A module-level function: a recursive closure would form a reference cycle that keeps
    the moved arrays, and their device memory, alive until the cycle collector runs.)
    """
    if isinstance(value, DeviceArray) or (
        isinstance(value, np.ndarray) and value.dtype.kind in _GPU_KINDS and target.is_gpu
    ):
        placed = _to_device(value, target, runtime, reason=op)
        moved.append(placed)
        return placed._data
    if isinstance(value, list):
        return [_convert(v, target, runtime, op, moved) for v in value]
    if isinstance(value, tuple):
        return tuple(_convert(v, target, runtime, op, moved) for v in value)
    return value


def run_op(op: str, func: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> Any:
    """Place ``op``, move its array inputs to that device, run ``func``, wrap the output."""
    runtime = get_runtime()
    if not kwargs and type(args) is tuple:
        simple = _run_simple(runtime, op, func, args)
        if simple is not _NOT_SIMPLE:
            return simple
    arrays: list[Any] = []
    _collect(args, arrays)
    _collect(list(kwargs.values()), arrays)
    gpu_kernel = all(a.dtype.kind in _GPU_KINDS for a in arrays)
    target, requested, soft = runtime.place(op, gpu_kernel=gpu_kernel)
    moved: list[DeviceArray] = []
    host_args = _convert(args, target, runtime, op, moved)
    host_kwargs = {k: _convert(v, target, runtime, op, moved) for k, v in kwargs.items()}
    start = time.perf_counter_ns()
    result = target.backend.run(func, host_args, host_kwargs)
    runtime.record_op(op, target, requested, soft, start, time.perf_counter_ns() - start)
    return _wrap(result, target, op, runtime, moved)


_NOT_SIMPLE = object()


def _run_simple(runtime: Runtime, op: str, func: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``run_op`` for the common case, positional DeviceArrays and Python scalars only, without
    the generic walk over nested arguments (the same placement, copies and records);
    ``_NOT_SIMPLE`` for anything else."""
    gpu_kernel = True
    for value in args:
        kind = type(value)
        if kind is DeviceArray:
            if value._view.dtype.kind not in _GPU_KINDS:
                gpu_kernel = False
        elif kind not in _SCALARS:
            return _NOT_SIMPLE
    target, requested, soft = runtime.place(op, gpu_kernel=gpu_kernel)
    inputs: list[DeviceArray] = []
    host_args = []
    for value in args:
        if type(value) is DeviceArray:
            placed = value if value._buffer.device is target else _to_device(value, target, runtime, reason=op)
            inputs.append(placed)
            host_args.append(placed._data)
        else:
            host_args.append(value)
    start = time.perf_counter_ns()
    result = target.backend.run(func, host_args, {})
    runtime.record_op(op, target, requested, soft, start, time.perf_counter_ns() - start)
    return _wrap(result, target, op, runtime, inputs)


def _operator(ufunc: np.ufunc, reflected: bool) -> Callable[[DeviceArray, Any], Any]:
    """``DeviceArray.__add__`` and its kin: with a DeviceArray or Python scalar operand, the op
    runs at once (``_run_simple``), without NumPy's dispatch to ``__array_ufunc__``; otherwise as
    NumPy's operator mixin does (the same result, placement and records either way)."""
    op = op_name(ufunc.__name__)
    fallback = getattr(NDArrayOperatorsMixin, f"__{'r' if reflected else ''}{_DUNDER[ufunc]}__")

    def method(self: DeviceArray, other: Any) -> Any:
        if type(other) is DeviceArray or type(other) in _SCALARS:
            result = _run_simple(get_runtime(), op, ufunc, (other, self) if reflected else (self, other))
            if result is not _NOT_SIMPLE:
                return result
        return fallback(self, other)

    method.__name__ = method.__qualname__ = f"__{'r' if reflected else ''}{_DUNDER[ufunc]}__"
    return method


_DUNDER = {np.add: "add", np.subtract: "sub", np.multiply: "mul", np.true_divide: "truediv",
           np.floor_divide: "floordiv", np.matmul: "matmul", np.power: "pow", np.remainder: "mod"}  # fmt: skip
for _ufunc in _DUNDER:
    setattr(DeviceArray, f"__{_DUNDER[_ufunc]}__", _operator(_ufunc, reflected=False))
    setattr(DeviceArray, f"__r{_DUNDER[_ufunc]}__", _operator(_ufunc, reflected=True))


def asarray(data: Any, dtype: Any = None, *, device: str | None = None) -> DeviceArray:
    """``data`` (nested lists, NumPy arrays, DeviceArrays) as a DeviceArray.

    It goes to ``device``, else to the device of the innermost ``gpuviz.device`` scope,
    else to the first GPU (the CPU when none is visible); a host-to-device transfer is
    recorded when the target is a GPU.
    """
    runtime = get_runtime()
    if device is not None:
        from gpuviz.runtime.context import device as device_scope

        with device_scope(device):
            return asarray(data, dtype)
    if isinstance(data, DeviceArray) and dtype is None:
        target, _, _ = runtime.place("Const", gpu_kernel=data.dtype.kind in _GPU_KINDS)
        return _to_device(data, target, runtime, reason="Const")
    host = np.asarray(data.numpy() if isinstance(data, DeviceArray) else data, dtype=dtype)
    target, requested, soft = runtime.place("Const", gpu_kernel=host.dtype.kind in _GPU_KINDS)
    start = time.perf_counter_ns()
    placed = _to_device(host, target, runtime, reason="Const")
    runtime.record_op("Const", target, requested, soft, start, time.perf_counter_ns() - start)
    return placed


def empty(shape: int | tuple[int, ...], dtype: Any = np.float32, *, device: str | None = None) -> DeviceArray:
    """An uninitialised array allocated on a device (no host data, no transfer), like ``cupy.empty``."""
    runtime = get_runtime()
    if device is not None:
        from gpuviz.runtime.context import device as device_scope

        with device_scope(device):
            return empty(shape, dtype)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    kind = np.dtype(dtype)
    target, requested, soft = runtime.place("Empty", gpu_kernel=kind.kind in _GPU_KINDS)
    start = time.perf_counter_ns()
    nbytes = math.prod(dims) * kind.itemsize
    buffer = target.allocate(nbytes, _tag("Empty", kind, dims))
    runtime.record_op("Empty", target, requested, soft, start, time.perf_counter_ns() - start)
    return DeviceArray(buffer, target.view(buffer, dims, kind))
