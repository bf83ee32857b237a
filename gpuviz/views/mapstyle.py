"""The fragmentation map's constants, shared by every map (``fragmentation``, the aggregated
buckets, the live map, the report's in-page stepper): colors, the zoom rule, the minimum width
and how a segment's row is labelled."""

from __future__ import annotations

__all__ = ["COLORS", "OOM_COLORS", "PALETTE", "ZOOM_BELOW", "MIN_WIDTH", "label"]

COLORS = {"used": "#3b6fb6", "waste": "#e8a33d", "free": "#d9dde3"}
OOM_COLORS = {"free hole": "#8fd19e", "pinning": "#c0392b", "failed request": "rgba(192,57,43,0.25)"}
ZOOM_BELOW = 0.1
"""The map opens zoomed to the used range when bytes in use are below this share of the pool."""
MIN_WIDTH = 0.002
"""Chunks in use are drawn at least this share of the visible x range wide."""
PALETTE = ["#3b6fb6", "#6a9e3f", "#9b59b6", "#16a085", "#c0392b", "#2c3e50", "#d35400", "#7f8c8d"]
"""The colors of traces per tag or dtype, in turn."""


def label(base: int) -> str:
    """A segment's row label: its base address in hex."""
    return f"{base:#x}"
