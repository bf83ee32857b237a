"""Capturing CuPy's host<->device copies as transfer events.

Python-level entry points are wrapped: ``cupy.ndarray.get`` (device to host; also reached
by ``cupy.asnumpy``, ``tolist``, ``item``, ``float(a)`` and the like, since CuPy's own
code dispatches through the subclass attribute), ``cupy.ndarray.set`` (host to device)
and ``cupy._core.array``, the function behind ``cupy.array``/``asarray``/``asanyarray``
(host to device when given host data). A copy that fails (no driver, say) records
nothing: only copies that happened are events. Durations are measured around the call,
so an asynchronous copy (``blocking=False``) counts its launch only; CUPTI, when present,
gives the device-side truth (``gpuviz.cupy.cupti``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gpuviz.capture.events import record_transfer
from gpuviz.capture.recorder import capture_stack
from gpuviz.log.eventlog import NO_INDEX, EventLog
from gpuviz.log.schema import Direction

__all__ = ["TransferHooks"]


class TransferHooks:
    """Wraps CuPy's copy entry points while installed; ``uninstall`` restores them exactly."""

    def __init__(self, log: EventLog, *, stacks: bool = False, skip: tuple[str, ...] = ()) -> None:
        import cupy

        self._cupy = cupy
        self.log = log
        self.stacks = stacks
        self.skip = skip
        self._saved: list[tuple[Any, str, bool, Any]] = []

    def _stack(self) -> int:
        return capture_stack(self.log, skip=self.skip) if self.stacks else NO_INDEX

    def _record(self, direction: Direction, device_id: int, nbytes: int, start: int, reason: str, stack: int) -> None:
        gpu = self.log.add_device(f"GPU:{device_id}")
        host = self.log.add_device("CPU:0")
        source, destination = (gpu, host) if direction == Direction.D2H else (host, gpu)
        record_transfer(
            self.log, direction=direction, source=source, destination=destination, nbytes=nbytes, start_ns=start,
            duration_ns=time.perf_counter_ns() - start, tag=reason, stack=stack,
        )  # fmt: skip

    def install(self) -> None:
        if self._saved:
            return
        cupy = self._cupy
        original_get = cupy.ndarray.get
        original_set = cupy.ndarray.set
        original_array = cupy._core.array
        hooks = self

        def get(self: Any, *args: Any, **kwargs: Any) -> Any:
            stack = hooks._stack()
            start = time.perf_counter_ns()
            result = original_get(self, *args, **kwargs)
            hooks._record(Direction.D2H, int(self.device.id), int(self.nbytes), start, "get", stack)
            return result

        def set(self: Any, arr: Any, *args: Any, **kwargs: Any) -> Any:
            stack = hooks._stack()
            start = time.perf_counter_ns()
            result = original_set(self, arr, *args, **kwargs)
            hooks._record(Direction.H2D, int(self.device.id), int(self.nbytes), start, "set", stack)
            return result

        def array(obj: Any, *args: Any, **kwargs: Any) -> Any:
            from_host = not isinstance(obj, cupy.ndarray) and (
                isinstance(obj, (np.ndarray, list, tuple, np.generic)) or hasattr(obj, "__array__")
            )
            stack = hooks._stack() if from_host else NO_INDEX
            start = time.perf_counter_ns()
            result = original_array(obj, *args, **kwargs)
            if from_host:
                hooks._record(Direction.H2D, int(result.device.id), int(result.nbytes), start, "array", stack)
            return result

        for owner, name, replacement in ((cupy.ndarray, "get", get), (cupy.ndarray, "set", set),
                                         (cupy._core, "array", array)):  # fmt: skip
            self._saved.append((owner, name, name in vars(owner), getattr(owner, name)))
            setattr(owner, name, replacement)

    def uninstall(self) -> None:
        for owner, name, had_own, original in reversed(self._saved):
            if had_own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)  # the original lives on a base class
        self._saved.clear()

    @property
    def installed(self) -> bool:
        return bool(self._saved)

    @staticmethod
    def wrapped(func: Callable[..., Any]) -> bool:
        return getattr(func, "__module__", "") == __name__
