"""A minimal reader of the protocol-buffers wire format (no generated code, no protoc).

Enough to walk messages field by field: varints, 64-bit and 32-bit fixed values and
length-delimited fields (strings, bytes, nested messages, packed repeated). Groups
(wire types 3/4) are rejected. A field that runs past the end of its message raises
``WireError`` naming the byte offset, which is how a truncated file shows.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator

__all__ = ["WireError", "fields", "read_varint", "as_int64", "as_double", "VARINT", "FIXED64", "LEN", "FIXED32"]
__all__ += ["WireData"]

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5
WireData = bytes | mmap.mmap  # a message in memory, or a memory-mapped file holding one
_DOUBLE = struct.Struct("<d")


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message (or were cut short)."""


def read_varint(data: WireData, pos: int, end: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` and the position after it."""
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise WireError(f"varint runs past the end of its message at byte {pos}")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError(f"varint longer than 10 bytes at byte {pos}")


def fields(data: WireData, start: int = 0, end: int | None = None) -> Iterator[tuple[int, int, int, int]]:
    """``(field number, wire type, value, position)`` of each field in ``data[start:end]``.

    For ``VARINT``/``FIXED64``/``FIXED32`` the value is the raw unsigned integer; for ``LEN``
    it is the end offset of the payload, which starts at ``position``.
    """
    stop = len(data) if end is None else end
    pos = start
    while pos < stop:
        key = data[pos]  # one-byte keys and values (the common case) skip read_varint
        if key < 0x80:
            pos += 1
        else:
            key, pos = read_varint(data, pos, stop)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError(f"field number 0 at byte {pos}")
        if wire in (VARINT, LEN):
            if pos < stop and data[pos] < 0x80:
                value = data[pos]
                pos += 1
            else:
                value, pos = read_varint(data, pos, stop)
            if wire == VARINT:
                yield number, wire, value, pos
                continue
            payload_end = pos + value
            if payload_end > stop:
                raise WireError(f"field {number} of {value} bytes at byte {pos} runs past the end of its message")
            yield number, wire, payload_end, pos
            pos = payload_end
        elif wire == FIXED64:
            if pos + 8 > stop:
                raise WireError(f"64-bit field {number} at byte {pos} runs past the end of its message")
            yield number, wire, int.from_bytes(data[pos : pos + 8], "little"), pos + 8
            pos += 8
        elif wire == FIXED32:
            if pos + 4 > stop:
                raise WireError(f"32-bit field {number} at byte {pos} runs past the end of its message")
            yield number, wire, int.from_bytes(data[pos : pos + 4], "little"), pos + 4
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wire} (field {number}) at byte {pos}")


def as_int64(value: int) -> int:
    """A varint read as a two's-complement int64 (proto ``int64``)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def as_double(value: int) -> float:
    """A FIXED64 value read as a proto ``double``."""
    return float(_DOUBLE.unpack(value.to_bytes(8, "little"))[0])
