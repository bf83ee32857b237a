"""Recording transfers and op placements (the non-allocator events)."""

from __future__ import annotations

import threading

from gpuviz.log.eventlog import NO_INDEX, EventLog
from gpuviz.log.schema import Direction, Kind

__all__ = ["record_transfer", "record_placement"]

_TRANSFER = int(Kind.TRANSFER)
_PLACEMENT = int(Kind.PLACEMENT)
_get_ident = threading.get_ident


def record_transfer(
    log: EventLog,
    *,
    direction: Direction,
    source: int,
    destination: int,
    nbytes: int,
    start_ns: int,
    duration_ns: int,
    tag: str | None = None,
    stack: int = NO_INDEX,
) -> None:
    """A copy of ``nbytes`` from device index ``source`` to ``destination`` that began at
    ``start_ns`` and took ``duration_ns`` (measured or modelled)."""
    tag_id = NO_INDEX if tag is None else log.intern_string(tag)
    log.append(
        (start_ns, _TRANSFER, int(direction), source, destination, threading.get_ident(),
         0, nbytes, 0, -1, -1, duration_ns, tag_id, stack)
    )  # fmt: skip


def record_placement(
    log: EventLog,
    op: str,
    device: int,
    requested: int,
    soft: bool,
    start_ns: int,
    duration_ns: int,
    stack: int = NO_INDEX,
) -> None:
    """Op ``op`` ran on device index ``device``; ``requested`` is the device index its scope
    asked for (-1: none); ``soft`` when soft placement moved it to another device. (Arguments
    may be positional: the runtime records one per op.)"""
    log.append(
        (start_ns, _PLACEMENT, int(soft), device, requested, _get_ident(),
         0, 0, 0, -1, -1, duration_ns, log.intern_string(op), stack)
    )  # fmt: skip
