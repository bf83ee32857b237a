"""PyTorch on gpuviz's allocator: ``gpuviz.torch.use_bfc()`` swaps PyTorch's CUDA caching allocator for
gpuviz's BFC allocator, loaded as a shared library through
``torch.cuda.memory.CUDAPluggableAllocator``, and records its decisions into an EventLog.

    import gpuviz.torch
    session = gpuviz.torch.use_bfc(memory_limit="8GiB")   # before PyTorch's first CUDA allocation
    ...                                                  # PyTorch code
    session.flush()                                      # rows recorded so far -> session.log

The library is ``gpuviz.capture._pluggable`` (built at install time where a C compiler
exists): ``gpuviz_malloc(size, device, stream)`` / ``gpuviz_free(ptr, size, device, stream)``
over cudaMalloc/cudaFree with TensorFlow's BFC policy (the native core of
``NativeBFCAllocator``). Its rows carry no tags or stacks (PyTorch's hook passes none).
PyTorch is optional: importing this module never needs it.
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from gpuviz.base import native as registry
from gpuviz.base.units import parse_bytes
from gpuviz.capture.marks import default_log
from gpuviz.log.eventlog import EventLog

__all__ = ["TorchSession", "library", "use_bfc"]

_MODULE = "gpuviz.capture._pluggable"


def library() -> ModuleType:
    """The compiled ``gpuviz.capture._pluggable`` module (its ``__file__`` is what PyTorch loads)."""
    module = registry.load(_MODULE)
    if module is None:
        raise RuntimeError(f"gpuviz's pluggable allocator library ({_MODULE}) is {registry.why_not(_MODULE)}")
    return module


@dataclass
class TorchSession:
    """PyTorch's allocations going through gpuviz's BFC: ``flush()`` moves recorded rows into ``log``."""

    log: EventLog
    devices: dict[int, int]  # CUDA device -> the log's device index
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)

    def flush(self) -> None:
        """Move the rows the library recorded since the last flush into ``log`` (thread-safe).

        Rows the library could not keep (no host memory for them; the allocations stood) are
        counted: each flush that finds some says how many in ``log.problems`` and logs it."""
        rows, lost = library().drain()
        if lost:
            problem = (
                f"{lost} events of PyTorch's allocations were not recorded: the allocator library found no host "
                f"memory for their rows (the allocations were made; the log misses them)"
            )
            self.log.problems.append(problem)
            logging.getLogger("gpuviz").error("gpuviz: %s", problem)
        if rows:
            staged, limit = self.log.row_sink()
            staged.extend(rows)
            if len(staged) >= limit:
                self.log.flush_staged()

    def stats(self, device: int = 0) -> dict[str, int]:
        """The device's allocator counters (bytes; ``invalid_frees``: frees of unknown pointers)."""
        stats: dict[str, int] = library().stats(device)
        return stats

    def stop(self) -> None:
        """Stop flushing in the background (PyTorch keeps the allocator: it cannot be swapped back)."""
        self._stop.set()
        self.flush()


def configure_device(
    device: int,
    log: EventLog,
    *,
    memory_limit: int | str | None = None,
    growth: bool = True,
    garbage_collection: bool = False,
    simulated_capacity: int = 0,
    simulated_base: int = 1 << 40,
) -> int:
    """Set up the library's allocator of CUDA ``device`` to record as ``GPU:<device>`` in ``log``;
    the log's device index. ``simulated_capacity`` > 0 puts it on a simulated device (no GPU)."""
    limit = 0 if memory_limit is None else parse_bytes(memory_limit, name="memory_limit")
    index = log.add_device(
        f"GPU:{device}",
        allocator="bfc",
        upstream="cudaMalloc (PyTorch)" if not simulated_capacity else "simulated",
        memory_limit=limit or None,
        growth=growth,
        garbage_collection=garbage_collection,
    )
    library().configure(
        device,
        index,
        memory_limit=limit,
        growth=growth,
        garbage_collection=garbage_collection,
        simulated_capacity=simulated_capacity,
        simulated_base=simulated_base,
    )
    return index


def _import_torch() -> Any:
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise RuntimeError("gpuviz.torch.use_bfc() needs PyTorch (pip install torch)") from None


def use_bfc(
    *,
    log: EventLog | None = None,
    memory_limit: int | str | None = None,
    growth: bool = True,
    garbage_collection: bool = False,
    flush_interval_s: float = 0.1,
) -> TorchSession:
    """Make PyTorch allocate CUDA memory with gpuviz's BFC allocator, recording into ``log``
    (default: gpuviz's default log). Call it before PyTorch's first CUDA allocation: PyTorch
    refuses to change its allocator afterwards."""
    torch = _import_torch()
    path = library().__file__
    session = TorchSession(log if log is not None else default_log(), {})
    for device in range(torch.cuda.device_count()):
        session.devices[device] = configure_device(
            device, session.log, memory_limit=memory_limit, growth=growth, garbage_collection=garbage_collection
        )
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "gpuviz_malloc", "gpuviz_free")
    torch.cuda.memory.change_current_allocator(allocator)

    def flush_periodically() -> None:
        while not session._stop.wait(flush_interval_s):
            session.flush()

    threading.Thread(target=flush_periodically, name="gpuviz-torch-flush", daemon=True).start()
    return session
