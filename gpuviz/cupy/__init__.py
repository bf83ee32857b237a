"""gpuviz under CuPy: ``gpuviz.cupy.install()`` routes every CuPy device allocation through
a gpuviz BFC allocator per device and records CuPy's host<->device copies.

    import gpuviz.cupy
    gpuviz.cupy.install(memory_limit="8GiB")   # or: with gpuviz.cupy.installed() as session:
    ...                                         # CuPy code
    log = gpuviz.cupy.uninstall()               # the event log of the run

CuPy is an optional extra (``pip install gpuviz[cuda12]`` or ``[cuda13]``); importing
gpuviz never needs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpuviz.capture.upstream import Upstream
from gpuviz.log.eventlog import EventLog

__all__ = ["install", "uninstall", "installed", "current", "CupySession"]

logger = logging.getLogger("gpuviz")


@dataclass
class CupySession:
    """What ``install`` set up: the log, the allocator, the copy hooks, and what to restore."""

    log: EventLog
    allocator: Any
    hooks: Any
    previous_allocator: Any
    cupti: Any = None
    options: dict[str, Any] = field(default_factory=dict)


_session: list[CupySession] = []


def current() -> CupySession | None:
    """The active installation, if any."""
    return _session[0] if _session else None


def install(
    device: int | None = None,
    *,
    memory_limit: int | str | None = None,
    memory_fraction: float | None = None,
    growth: bool = True,
    garbage_collection: bool = True,
    stacks: bool = False,
    transfers: bool = True,
    cupti: bool | None = None,
    log: EventLog | None = None,
    upstream: Callable[[int], Upstream] | None = None,
    current_device: Callable[[], int] | None = None,
) -> CupySession:
    """Route CuPy's device allocations through gpuviz and record its copies.

    Args:
        device: make this the current CuPy device first (None: leave it).
        memory_limit / memory_fraction: per-device cap (default: ``CUPY_GPU_MEMORY_LIMIT``
            when set, else the device's total memory).
        growth, garbage_collection: the BFC options (growth: segments as needed; GC:
            return wholly free segments to CUDA and retry before an OOM).
        stacks: record the user's call site (first frame outside CuPy and gpuviz).
        transfers: wrap CuPy's copy entry points to record transfers.
        cupti: also collect CUPTI memcpy records (None: when available).
        log: record into this log (default: a new one).
        upstream, current_device: where segments come from (default: ``CupyUpstream``,
            cudaMalloc) and which device CuPy allocates for (default: CuPy's current
            device). Tests pass a simulated upstream here.
    """
    import cupy

    from gpuviz.cupy.allocator import CupyAllocator, limit_from_environment
    from gpuviz.cupy.cupti import CuptiTransfers, cupti_status
    from gpuviz.cupy.transfers import TransferHooks
    from gpuviz.cupy.upstream import CupyUpstream

    if _session:
        raise RuntimeError("gpuviz.cupy is already installed; call gpuviz.cupy.uninstall() first")
    usable, why = cupti_status()
    if cupti and not usable:
        raise RuntimeError(why)  # before anything is installed: nothing to undo
    if memory_limit is None and memory_fraction is None:
        memory_limit, memory_fraction = limit_from_environment()
    if device is not None:
        cupy.cuda.Device(device).use()
    target = log if log is not None else EventLog()
    allocator = CupyAllocator(
        target,
        upstream=upstream or CupyUpstream,
        current_device=current_device or cupy.cuda.runtime.getDevice,
        memory_limit=memory_limit,
        memory_fraction=memory_fraction,
        growth=growth,
        garbage_collection=garbage_collection,
        stacks=stacks,
    )
    previous = cupy.cuda.get_allocator()
    try:  # cached blocks of CuPy's own pool would otherwise stay reserved beside gpuviz's
        cupy.get_default_memory_pool().free_all_blocks()
    except Exception as error:  # no driver: the pool holds nothing anyway
        logger.debug("gpuviz.cupy: could not empty CuPy's default pool: %s", error)
    cupy.cuda.set_allocator(allocator)
    hooks = TransferHooks(target, stacks=stacks, skip=(allocator.cupy_dir,))
    if transfers:
        hooks.install()
    session = CupySession(target, allocator, hooks, previous)
    if usable and cupti is not False:
        session.cupti = CuptiTransfers(target)
        session.cupti.start()
    _session.append(session)
    return session


def uninstall() -> EventLog:
    """Restore CuPy's previous allocator and copy functions; return the event log.

    Memory allocated while installed stays valid and goes back to gpuviz's allocator when
    CuPy releases it.
    """
    import cupy

    if not _session:
        raise RuntimeError("gpuviz.cupy is not installed")
    session = _session.pop()
    if session.cupti is not None:
        session.cupti.stop()
    session.hooks.uninstall()
    cupy.cuda.set_allocator(session.previous_allocator)
    return session.log


@contextmanager
def installed(**options: Any) -> Iterator[CupySession]:
    """``with gpuviz.cupy.installed(memory_limit="4GiB") as session:`` install and uninstall."""
    session = install(**options)
    try:
        yield session
    finally:
        uninstall()
