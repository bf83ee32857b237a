"""Capture: the allocators, upstreams and recorders that write events into an EventLog.

``BFCAllocator`` is the native allocator wherever it was built (``NativeBFCAllocator``), else
``ReferenceBFCAllocator``, the executable reference in Python; both are importable here by name
(each loaded when first asked for). Capture never imports analysis, views, IPython,
ipywidgets or plotly.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuviz.capture.bfc import ReferenceBFCAllocator
    from gpuviz.capture.native import BFCAllocator, NativeBFCAllocator

__all__ = ["BFCAllocator", "NativeBFCAllocator", "ReferenceBFCAllocator"]

_WHERE = {
    "BFCAllocator": "gpuviz.capture.native",
    "NativeBFCAllocator": "gpuviz.capture.native",
    "ReferenceBFCAllocator": "gpuviz.capture.bfc",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'gpuviz.capture' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
