"""Protocol-buffer wire encoding for tests that write XSpaces and pprof profiles by hand."""

from __future__ import annotations

import struct

__all__ = ["varint", "field", "double"]


def varint(n: int) -> bytes:
    """``n`` as a base-128 varint (negative numbers as their 64-bit two's complement)."""
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def field(number: int, value: int | bytes) -> bytes:
    """Field ``number``: a varint for an int, length-delimited for bytes."""
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


def double(number: int, value: float) -> bytes:
    """Field ``number`` as a 64-bit float."""
    return varint(number << 3 | 1) + struct.pack("<d", value)
