"""The analysis passes compiled in ``gpuviz.analysis._replaykernel`` (and the live follower's in
``gpuviz.analysis._livekernel``), where a C compiler built them.

Each compiled pass has a NumPy or Python twin that gives exactly the same result (tests hold
them together); ``GPUVIZ_NATIVE=0`` makes every caller use the twin.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

__all__ = ["kernel_function"]


def kernel_function(name: str, module: str = "_replaykernel") -> Callable[..., Any] | None:
    """The compiled pass ``name`` of ``gpuviz.analysis.<module>``, or None without the compiled
    module (or with ``GPUVIZ_NATIVE=0``)."""
    if os.environ.get("GPUVIZ_NATIVE", "1") == "0":
        return None
    try:  # importlib: a compiled module has no imports of its own for the layering check to follow
        function: Callable[..., Any] = getattr(importlib.import_module(f"gpuviz.analysis.{module}"), name)
    except (ImportError, AttributeError):  # built without a C compiler
        return None
    return function
