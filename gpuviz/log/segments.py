"""The segment table's rules for segments that grow and shrink (``segment_map`` /
``segment_unmap``, see ``gpuviz.log.schema``), on a dict ``segment base -> size`` (bytes).

Replay, the live follower and importers apply them; ``HeapBuilder`` keeps its own sorted
segments with the same rules (and emits the events).
"""

from __future__ import annotations

__all__ = ["map_range", "unmap_range"]


def map_range(segments: dict[int, int], address: int, size: int) -> None:
    """``segment_map``: in ``segments`` (base -> size, bytes), ``[address, address+size)``
    joins the segments ending at ``address`` and starting at its end (a scan of the
    segments: few, where segments grow)."""
    upper = segments.pop(address + size, 0)
    for base, length in segments.items():
        if base + length == address:
            segments[base] = length + size + upper
            return
    segments[address] = size + upper


def unmap_range(segments: dict[int, int], address: int, size: int) -> None:
    """``segment_unmap``: ``[address, address+size)`` leaves its segment in ``segments``; what
    remains below and above stays (``KeyError`` when no segment holds ``address``)."""
    for base, length in segments.items():
        if base <= address < base + length:
            break
    else:
        raise KeyError(address)
    if address > base:
        segments[base] = address - base
    else:
        del segments[base]
    if address + size < base + length:
        segments[address + size] = base + length - address - size
