"""The ops of a PyTorch profiler trace, and which of them each allocation happened in.

A trace's ``cpu_op`` events (``Operator`` in the 2021 schema) and ``user_annotation`` events
(``record_function``, ``Optimizer.step#...``, ``ProfilerStep#...``) are complete events with a
thread, a start and a duration. ``attribute`` walks each thread's allocations in time order
beside its ops (which nest) and names each allocation by the innermost op running then.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from decimal import Decimal
from typing import Any, NamedTuple

from gpuviz.base.tags import OP_FRAME
from gpuviz.log.eventlog import EventLog, Frame

__all__ = ["OpEvent", "OP_CATEGORIES", "OP_FIELDS", "op_from_fields", "decode_op", "attribute"]

OP_CATEGORIES = ("cpu_op", "user_annotation", "Operator")
# an op event as PyTorch writes it, read from its category on without decoding the whole object
OP_FIELDS = re.compile(
    rb'"(?:cpu_op|user_annotation|Operator)",\s*"name":\s*"((?:[^"\\]|\\.)*)",\s*"pid":\s*"?-?\d+"?,'
    rb'\s*"tid":\s*"?(\d+)"?,\s*"ts":\s*(\d+(?:\.\d+)?),\s*"dur":\s*(\d+(?:\.\d+)?)'
)


class OpEvent(NamedTuple):
    """One op or annotation (a complete ``X`` event of category ``cpu_op``, ``user_annotation`` or
    ``Operator``): its thread and its span in ns."""

    thread: int
    start_ns: int
    end_ns: int
    name: str


def _ns(value: Any) -> int | None:
    if type(value) is int:
        return value * 1000
    if isinstance(value, Decimal):
        return int(value * 1000)
    return None


def op_from_fields(fields: re.Match[bytes]) -> OpEvent:
    raw_name, tid, ts, dur = fields.groups()
    name = raw_name.decode("utf-8", "replace")
    if "\\" in name:
        name = json.loads('"' + name + '"')
    start = int(Decimal(ts.decode()) * 1000)
    return OpEvent(int(tid), start, start + int(Decimal(dur.decode()) * 1000), name)


def decode_op(event: Any) -> OpEvent | None:
    """The op event ``event`` (a decoded JSON object), None for any other object."""
    if type(event) is not dict or event.get("ph") != "X" or event.get("cat") not in OP_CATEGORIES:
        return None
    start, duration, name = _ns(event.get("ts")), _ns(event.get("dur", 0)), event.get("name")
    if start is None or duration is None or not isinstance(name, str):
        return None
    tid = event.get("tid", 0)
    thread = tid if type(tid) is int else int(tid) if isinstance(tid, str) and tid.isdigit() else 0
    return OpEvent(thread, start, start + duration, name)


def attribute(
    log: EventLog, allocations: list[tuple[int, int, int, int]], ops: list[OpEvent]
) -> dict[int, tuple[int, int]]:
    """Per allocation (``(thread, time_ns, order, position)``, keyed by position): (tag, stack) of
    the ops running on its thread at its time: the innermost op's name as the tag (annotations
    like ``## forward ##`` and ``ProfilerStep#N`` only when no op runs), every enclosing op and
    annotation as the stack (innermost first). Allocations outside every op are left out."""
    by_thread: dict[int, list[OpEvent]] = defaultdict(list)
    for op in ops:
        by_thread[op.thread].append(op)
    for spans in by_thread.values():
        spans.sort(key=lambda o: (o.start_ns, -o.end_ns))
    names: dict[int, tuple[int, int]] = {}
    stacks: dict[tuple[str, ...], int] = {}
    allocations = sorted(allocations)
    thread, spans, j, open_ops = None, [], 0, []  # type: ignore[var-annotated]
    for thread_of, time_ns, _, position in allocations:
        if thread_of != thread:
            thread, spans, j, open_ops = thread_of, by_thread.get(thread_of, []), 0, []
        while j < len(spans) and spans[j].start_ns <= time_ns:
            while open_ops and open_ops[-1].end_ns < spans[j].start_ns:
                open_ops.pop()
            open_ops.append(spans[j])
            j += 1
        while open_ops and open_ops[-1].end_ns < time_ns:
            open_ops.pop()
        if not open_ops:
            continue
        chain = tuple(o.name for o in reversed(open_ops))  # innermost first
        stack = stacks.get(chain)
        if stack is None:
            stack = stacks[chain] = log.intern_stack(tuple(Frame(OP_FRAME, 0, name) for name in chain))
        innermost = next(
            (o.name for o in reversed(open_ops) if not o.name.startswith(("## ", "ProfilerStep"))), chain[0]
        )
        names[position] = (log.intern_string(innermost), stack)
    return names
