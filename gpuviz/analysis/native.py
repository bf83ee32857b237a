"""The analysis passes compiled in ``gpuviz.analysis._replaykernel`` (and the live follower's in
``gpuviz.analysis._livekernel``), where a C compiler built them.

Each compiled pass has a NumPy or Python twin that gives exactly the same result (tests hold
them together); ``GPUVIZ_NATIVE=0`` makes every caller use the twin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuviz.base import native as registry

__all__ = ["kernel_function"]


def kernel_function(name: str, module: str = "_replaykernel") -> Callable[..., Any] | None:
    """The compiled pass ``name`` of ``gpuviz.analysis.<module>``, or None without the compiled
    module (or with ``GPUVIZ_NATIVE=0``)."""
    full = f"gpuviz.analysis.{module}"
    if not registry.available(full):
        return None
    function: Callable[..., Any] | None = getattr(registry.load(full), name, None)
    return function
