"""Where the rich display of a lower layer's object comes from, loaded when first asked for.

An ``EventLog`` or a what-if ``Comparison`` displays through a renderer that the views layer
registers when it is imported; the lower layers never import views. So that ``import gpuviz``
need not import the views (and plotly, pandas) just in case something is displayed, the
package names here which module registers each renderer (``defer``), and the object's
``_repr_mimebundle_`` imports that module the first time it is displayed (``load``).
"""

from __future__ import annotations

import importlib

__all__ = ["defer", "load"]

_deferred: dict[str, str] = {}  # kind of object -> module that registers its renderer when imported


def defer(kind: str, module: str) -> None:
    """Importing ``module`` registers the renderer of objects of ``kind`` (e.g. ``"EventLog"``)."""
    _deferred[kind] = module


def load(kind: str) -> None:
    """Import the module deferred for ``kind``, if any (once)."""
    module = _deferred.pop(kind, None)
    if module is not None:
        importlib.import_module(module)
