"""Recorders: the observers an allocator reports its decisions to.

The allocator (the policy) calls ``emit`` for every decision; a ``Recorder`` stamps the
event with time, thread and optionally the caller's stack and appends it to an EventLog;
a ``NullRecorder`` drops it. Recording on or off is the choice of observer, not a flag
inside the policy.

A recorded event costs one timestamp, one thread id and one packed row, ~0.3-0.5 us in
CPython (``_make_emit``). Only the Python reference allocator records through a ``Recorder``'s
``emit``: the native allocator (``gpuviz.capture.native``, the default) writes its rows itself,
in C, into the same staging arena, and takes only the recorder's log, device, tag and stack
interning. This class has no C twin: one would speed up only the Python reference, which runs
where the native allocator does not (measured in benchmarks/native/capture.py).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Protocol

from gpuviz.base import native as registry
from gpuviz.log.eventlog import NO_INDEX, EventLog, Frame
from gpuviz.log.schema import ROW_STRUCT

__all__ = [
    "STACK_DEPTH",
    "NullRecorder",
    "Observer",
    "Recorder",
    "capture_stack",
    "recorder_description",
]

STACK_DEPTH = 8
_pack = ROW_STRUCT.pack
EmitFn = Callable[[int, int, int, int, int, int, int, int], None]
"""emit(kind, address, size, requested, segment, largest_free, tag, stack)"""
_now = time.perf_counter_ns
_thread = threading.get_ident
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class Observer(Protocol):
    stacks: bool

    def emit(
        self, kind: int, address: int, size: int, requested: int, segment: int, largest_free: int, tag: int, stack: int
    ) -> None: ...

    def tag_id(self, tag: str | None) -> int: ...

    def stack_id(self) -> int: ...


def capture_stack(log: EventLog, *, depth: int = STACK_DEPTH, skip: tuple[str, ...] = ()) -> int:
    """Intern the caller's stack (innermost first, frames inside gpuviz or ``skip`` left out)."""
    frame: FrameType | None = sys._getframe(1)
    frames: list[Frame] = []
    prefixes = (_PACKAGE_DIR, *skip)
    while frame is not None and len(frames) < depth:
        code = frame.f_code
        filename = code.co_filename
        if not filename.startswith(prefixes):
            frames.append(Frame(filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return log.intern_stack(tuple(frames))


def recorder_description() -> str:
    """How allocator events are recorded, in words (for ``gpuviz info``): in C by the native
    allocator where it is in use, else by this module's Python recorder."""
    core = "gpuviz.capture._bfcnative"
    if registry.available(core):
        return "C (the native allocator writes its rows)"
    return f"Python ({registry.why_not(core) or 'the native allocator is not loaded'})"


def _make_emit(log: EventLog, device: int) -> EmitFn:
    staged, limit = log.row_sink()
    extend = staged.extend
    flush = log.flush_staged

    def emit(
        kind: int, address: int, size: int, requested: int, segment: int, largest_free: int, tag: int, stack: int
    ) -> None:
        extend(
            _pack(
                _now(),
                kind,
                0,
                device,
                NO_INDEX,
                _thread(),
                address,
                size,
                requested,
                segment,
                largest_free,
                0,
                tag,
                stack,
            )
        )
        if len(staged) >= limit:
            flush()

    return emit


class Recorder:
    """Appends an allocator's events for one device to an EventLog.

    Each event is stamped with ``time.perf_counter_ns()`` and the recording thread, packed
    with ``ROW_STRUCT`` and added to the log's staging buffer in one call.
    """

    def __init__(
        self,
        log: EventLog,
        device: int,
        *,
        stacks: bool = False,
        skip: tuple[str, ...] = (),
    ) -> None:
        self.log = log
        self.device = device
        self.stacks = stacks
        self.skip = skip
        self.emit: EmitFn = _make_emit(log, device)  # a closure: no attribute lookups per event

    def tag_id(self, tag: str | None) -> int:
        return NO_INDEX if tag is None else self.log.intern_string(tag)

    def stack_id(self) -> int:
        return capture_stack(self.log, skip=self.skip) if self.stacks else NO_INDEX


class NullRecorder:
    """Records nothing (recording off)."""

    stacks = False

    def emit(
        self, kind: int, address: int, size: int, requested: int, segment: int, largest_free: int, tag: int, stack: int
    ) -> None:
        return None

    def tag_id(self, tag: str | None) -> int:
        return NO_INDEX

    def stack_id(self) -> int:
        return NO_INDEX
