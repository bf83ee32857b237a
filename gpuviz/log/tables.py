"""The records of an event log's side tables and of its decoded events.

``Frame`` (one frame of a recorded Python stack), ``DeviceInfo`` (a device and its allocator's
options), ``Event`` (one event with names instead of table indices), ``NO_INDEX`` (a row's
"none" for a table index) and ``MAX_DEVICES``. The log (``logdata.LogData``), its recorder and
its files all use them; they import nothing of the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["Frame", "DeviceInfo", "Event", "NO_INDEX", "MAX_DEVICES"]

NO_INDEX = -1
"""A row's ``device``, ``peer``, ``tag`` or ``stack`` when it has none."""

MAX_DEVICES = 32_767
"""The most devices one log holds: device indexes are stored as int16."""


class Frame(NamedTuple):
    """One frame of a recorded Python stack."""

    filename: str
    lineno: int
    function: str


@dataclass(frozen=True)
class DeviceInfo:
    """A device of the log: its name (``"GPU:0"``) and the options of its allocator."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)


class Event(NamedTuple):
    """One event, decoded for reading (names instead of table indices); times in ns, sizes
    and addresses in bytes."""

    seq: int
    time_ns: int
    kind: str
    flags: int
    device: str | None
    peer: str | None
    thread: int
    address: int
    size: int
    requested: int
    segment: int
    largest_free: int
    duration_ns: int
    tag: str | None
    stack: int
