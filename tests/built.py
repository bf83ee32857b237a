"""Whether an optional compiled module was built (no C compiler at install time: it was not)."""

from __future__ import annotations

import importlib


def built(module: str) -> bool:
    """True when ``module`` (a dotted name) imports."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
