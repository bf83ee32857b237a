"""The tag of an array allocation: ``"<op>:<dtype>[<shape>]"``, e.g. ``"MatMul:float32[2,2]"``.

Written by the device runtime, read by analysis (bytes per dtype, per op).
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["ArrayTag", "array_tag", "parse_array_tag", "OP_FRAME"]

OP_FRAME = "<op>"
"""The file name of a stack frame that stands for an op or annotation a profiler recorded (its
name is the frame's function): how an importer keeps the ops enclosing an allocation."""

_PATTERN = re.compile(r"^(?P<op>[^:\[\]]+):(?P<dtype>[A-Za-z0-9_]+)\[(?P<shape>[0-9,]*)\]$")


class ArrayTag(NamedTuple):
    op: str
    dtype: str
    shape: tuple[int, ...]


def array_tag(op: str, dtype: str, shape: tuple[int, ...]) -> str:
    return f"{op}:{dtype}[{','.join(str(n) for n in shape)}]"


def parse_array_tag(tag: str | None) -> ArrayTag | None:
    """The parts of an array tag, or None for any other tag."""
    if tag is None:
        return None
    match = _PATTERN.match(tag)
    if match is None:
        return None
    shape = tuple(int(n) for n in match["shape"].split(",")) if match["shape"] else ()
    return ArrayTag(match["op"], match["dtype"], shape)
