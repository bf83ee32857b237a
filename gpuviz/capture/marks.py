"""Marks: user and front-end annotations (a point, or a named span with begin and end).

``mark("step 3")`` and ``with span("forward"):`` write to the given log, else to the
innermost log activated with ``with activate(log):``, else to the process default log.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from gpuviz.base.scopes import ThreadStack
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import MarkPhase

__all__ = ["mark", "span", "activate", "current_log", "default_log"]

_active: ThreadStack[EventLog] = ThreadStack()
_default: list[EventLog] = []
_default_lock = threading.Lock()


def default_log() -> EventLog:
    """The process-wide log that the device runtime and unqualified marks record into."""
    with _default_lock:
        if not _default:
            _default.append(EventLog())
        return _default[0]


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
