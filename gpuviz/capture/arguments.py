"""Validation of an allocator's arguments, shared by every allocator class.

An allocator calls these before it changes anything, so a bad argument raises a clear
error and leaves the heap, the stats and the log exactly as they were:

    allocation_size(nbytes)   an int (or NumPy integer) >= 0; TypeError / ValueError otherwise
    address_argument(address) an int (or NumPy integer); TypeError otherwise
    tag_argument(tag)         a str or None; TypeError otherwise
    log_int(value)            a byte count as the log stores it: int64, saturated at 2**63 - 1

Sizes beyond what any device can hold (``2**63``, ``10**30``) are valid arguments: they
fail with ``OutOfMemoryError`` like every request above the limit, and their ``oom`` event
records the size saturated to ``LOG_INT_MAX`` (the exception keeps the exact numbers).
"""

from __future__ import annotations

import operator

__all__ = ["LOG_INT_MAX", "address_argument", "allocation_size", "log_int", "tag_argument"]

LOG_INT_MAX = (1 << 63) - 1
"""The largest value of the log's int64 columns (address, size, requested, ...)."""


def _integer(value: object) -> int | None:
    """``value`` as an int when it is an integer (int, NumPy integer; never bool), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def allocation_size(nbytes: object) -> int:
    """The byte count of an ``allocate`` request; ``TypeError``/``ValueError`` say what is wrong."""
    value = _integer(nbytes)
    if value is None:
        raise TypeError(
            f"allocation size must be an integer number of bytes, not {type(nbytes).__name__} ({nbytes!r:.40})"
        )
    if value < 0:
        raise ValueError(f"allocation size must not be negative, got {value}")
    return value


def address_argument(address: object, *, what: str = "free") -> int:
    """The address given to ``free`` (or a size query); ``TypeError`` when it is not an integer."""
    value = _integer(address)
    if value is None:
        raise TypeError(
            f"{what}: the address must be an integer (the value allocate returned),"
            f" not {type(address).__name__} ({address!r:.40})"
        )
    return value


def tag_argument(tag: object) -> str | None:
    """The tag of an allocation; ``TypeError`` when it is neither a string nor None."""
    if tag is not None and type(tag) is not str:
        raise TypeError(f"tag must be a string or None, not {type(tag).__name__}")
    return tag


def log_int(value: int) -> int:
    """``value`` (a non-negative byte count) as the log's int64 columns hold it, saturated."""
    return value if value <= LOG_INT_MAX else LOG_INT_MAX
