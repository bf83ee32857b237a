"""Backends: what device memory looks like as an array, and how ops and copies run on it.

``SimulatedBackend``: NumPy arrays over host memory that a backed ``SimUpstream`` hands
out (the CPU and simulated GPUs). ``CupyBackend``: CuPy arrays over real GPU memory from
``CupyUpstream``; ops run as their CuPy equivalents on that device, and CuPy's own
temporaries go through the same gpuviz allocator, so they are recorded too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from gpuviz.capture.bfc import ReferenceBFCAllocator
from gpuviz.capture.upstream import SimUpstream

__all__ = ["Backend", "SimulatedBackend", "CupyBackend", "cupy_gpu_count"]


class Backend(Protocol):
    name: str

    def view(self, address: int, nbytes: int, shape: tuple[int, ...], dtype: np.dtype, owner: object) -> Any: ...

    def offset(self, view: Any, address: int) -> int: ...

    def is_array(self, value: Any) -> bool: ...

    def shares_memory(self, result: Any, source: Any) -> bool: ...

    def to_host(self, array: Any) -> np.ndarray: ...

    def copy_into(self, destination: Any, source: Any) -> None: ...

    def run(self, func: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> Any: ...


def _host(array: Any) -> np.ndarray:
    """A NumPy array of ``array`` (CuPy arrays are copied to the host)."""
    get = getattr(array, "get", None)
    return np.asarray(get() if get is not None and not isinstance(array, np.ndarray) else array)


class SimulatedBackend:
    """NumPy arrays over the host memory that backs a simulated device."""

    name = "simulated"

    def __init__(self, upstream: SimUpstream) -> None:
        self.upstream = upstream

    def view(self, address: int, nbytes: int, shape: tuple[int, ...], dtype: np.dtype, owner: object) -> np.ndarray:
        if nbytes == 0:
            return np.empty(shape, dtype=dtype)
        region, offset = self.upstream.mapped(address, nbytes)
        view: np.ndarray = np.ndarray(shape, dtype, buffer=region, offset=offset)
        return view

    def offset(self, view: Any, address: int) -> int:
        base = view
        while isinstance(base.base, np.ndarray):
            base = base.base
        return int(view.__array_interface__["data"][0]) - int(base.__array_interface__["data"][0])

    def is_array(self, value: Any) -> bool:
        return isinstance(value, np.ndarray)

    def shares_memory(self, result: Any, source: Any) -> bool:
        # an array that owns its memory (``base`` None: a fresh op output) shares none
        return result.base is not None and bool(source.size) and bool(np.may_share_memory(result, source))

    def to_host(self, array: Any) -> np.ndarray:
        return np.array(array, copy=True)

    def copy_into(self, destination: Any, source: Any) -> None:
        if type(source) is np.ndarray and source.dtype == destination.dtype:
            destination[...] = source  # the same as ``copyto`` without casting, for less per call
        else:
            np.copyto(destination, source if type(source) is np.ndarray else _host(source), casting="no")

    def run(self, func: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> Any:
        return func(*args, **kwargs)


def _no_nvidia_driver() -> bool:
    """True where a Linux machine certainly has no NVIDIA driver (no ``/proc/driver/nvidia``,
    not WSL's ``/dev/dxg``): importing CuPy (most of a second) cannot find a GPU there."""
    return sys.platform == "linux" and not (os.path.exists("/proc/driver/nvidia") or os.path.exists("/dev/dxg"))


def cupy_gpu_count() -> int:
    """GPUs CUDA can see through CuPy (0 without CuPy, a driver or a GPU)."""
    if _no_nvidia_driver():
        return 0
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount()) if cupy.cuda.is_available() else 0
    except Exception:
        return 0


def cupy_gpu_memory(index: int) -> int:
    """Total memory of real GPU ``index`` in bytes (``cudaGetDeviceProperties``)."""
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(index)["totalGlobalMem"])


class CupyBackend:
    """CuPy arrays over real memory of GPU ``device_id`` handed out by ``allocator``."""

    name = "cupy"

    def __init__(self, device_id: int, allocator: ReferenceBFCAllocator) -> None:
        import cupy

        from gpuviz.cupy.allocator import CupyAllocator

        self._cupy = cupy
        self.device_id = device_id
        hook = CupyAllocator(
            allocator.log, upstream=lambda _: allocator.upstream, current_device=lambda: device_id
        )  # fmt: skip
        hook.allocators[device_id] = allocator  # CuPy's temporaries come from the runtime's allocator
        self._hook = hook

    def view(self, address: int, nbytes: int, shape: tuple[int, ...], dtype: np.dtype, owner: object) -> Any:
        cupy = self._cupy
        memory = cupy.cuda.memory
        pointer = memory.MemoryPointer(memory.UnownedMemory(address, nbytes, owner, self.device_id), 0)
        return cupy.ndarray(shape, dtype=dtype, memptr=pointer)  # the device comes from the pointer

    def offset(self, view: Any, address: int) -> int:
        return int(view.data.ptr) - address

    def is_array(self, value: Any) -> bool:
        return isinstance(value, self._cupy.ndarray)

    def shares_memory(self, result: Any, source: Any) -> bool:
        return bool(source.size) and self.is_array(result) and result.data.mem is source.data.mem

    def to_host(self, array: Any) -> np.ndarray:
        with self._cupy.cuda.Device(self.device_id):
            return np.asarray(array.get())

    def copy_into(self, destination: Any, source: Any) -> None:
        cupy = self._cupy
        with cupy.cuda.Device(self.device_id):
            if isinstance(source, np.ndarray):
                destination.set(np.ascontiguousarray(source))
            else:  # a CuPy array, maybe on another GPU: one device-to-device copy
                contiguous = cupy.ascontiguousarray(source)
                destination.data.copy_from_device(contiguous.data, destination.nbytes)

    def _translate(self, func: Callable[..., Any]) -> Callable[..., Any]:
        cupy = self._cupy
        owner = getattr(func, "__self__", None)
        if isinstance(owner, np.ufunc):  # ufunc.__call__ / .reduce / .accumulate ...
            ufunc = getattr(cupy, owner.__name__)
            return ufunc if func.__name__ == "__call__" else getattr(ufunc, func.__name__)  # type: ignore[no-any-return]
        if isinstance(func, np.ufunc) or getattr(func, "__module__", "").startswith("numpy"):
            translated = getattr(cupy, func.__name__, None)
            if translated is None:
                raise TypeError(f"numpy.{func.__name__} has no CuPy equivalent to run on GPU {self.device_id}")
            return translated  # type: ignore[no-any-return]
        return func  # gpuviz's own small lambdas use array methods, which CuPy arrays have

    def run(self, func: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> Any:
        cupy = self._cupy
        with cupy.cuda.Device(self.device_id), cupy.cuda.using_allocator(self._hook):
            return self._translate(func)(*args, **kwargs)
