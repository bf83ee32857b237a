"""Marks: user and front-end annotations (a point, or a named span with begin and end).

``mark("step 3")`` and ``with span("forward"):`` write to the given log, else to the
innermost log activated with ``with activate(log):``, else to the process default log.
With ``GPUVIZ_LOG_DIR`` set, the default log records to this process's file in that
directory (``run_log``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpuviz.base.ranks import CLOCK_OFFSET, LOG_DIR_VARIABLE, RankInfo, clock_offset_ns, rank_file_name, rank_from_env
from gpuviz.base.scopes import ThreadStack
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import MarkPhase

__all__ = ["mark", "span", "activate", "current_log", "default_log", "run_log"]

_active: ThreadStack[EventLog] = ThreadStack()
_default: list[EventLog] = []
_default_lock = threading.Lock()


def default_log() -> EventLog:
    """The process-wide log that the device runtime and unqualified marks record into."""
    with _default_lock:
        if not _default:
            directory = os.environ.get(LOG_DIR_VARIABLE)
            _default.append(run_log(directory) if directory else EventLog())
        return _default[0]


def run_log(directory: str | Path, info: RankInfo | None = None) -> EventLog:
    """A new log recording to this process's file in the run ``directory`` (created if missing).

    The file is named from ``info`` (default: ``rank_from_env()``), e.g. ``node3-rank12.arrow``,
    and ``log.meta["run"]`` holds rank, local_rank, world_size and host, and ``clock_offset_ns``:
    wall clock minus event clock, read now (``gpuviz.base.ranks.CLOCK_OFFSET``).
    """
    info = info if info is not None else rank_from_env()
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    run = {**info.as_meta(), CLOCK_OFFSET: clock_offset_ns()}  # the wall-clock anchor of the log's times
    return EventLog(folder / rank_file_name(info), meta={"run": run})


def set_default_log(log: EventLog) -> None:
    with _default_lock:
        _default[:] = [log]


def current_log() -> EventLog:
    """The innermost log activated on this thread, else the default log."""
    active = _active.top()
    return active if active is not None else default_log()


@contextmanager
def activate(log: EventLog) -> Iterator[EventLog]:
    """Make ``log`` the target of unqualified marks on this thread for the ``with`` block."""
    with _active.pushed(log):
        yield log


def mark(label: str, *, log: EventLog | None = None) -> None:
    """Record a point annotation ``label`` (e.g. ``"step 3"``)."""
    (log if log is not None else current_log()).mark(label)


@contextmanager
def span(label: str, *, log: EventLog | None = None) -> Iterator[None]:
    """Record a named span: a begin mark now and an end mark when the block exits."""
    target = log if log is not None else current_log()
    target.mark(label, phase=MarkPhase.BEGIN)
    try:
        yield
    finally:
        target.mark(label, phase=MarkPhase.END)
