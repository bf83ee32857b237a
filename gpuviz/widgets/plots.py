"""plotly.js for the dashboard, sent to the front-end once per kernel, and JSON for figures.

Why not plotly's ``FigureWidget``: importing it imports ``plotly.io._renderers`` and with it
nbformat and jsonschema (seconds in a fresh kernel), each instance ships a 5 MB bundle and
is its own set of comms, and every change is sent as a validated figure. Here one
``PlotlyLibrary`` widget (created at the first dashboard of a kernel, never displayed)
carries the copy of plotly.js that plotly.py ships; its module runs when the front-end
creates the model and sets ``globalThis.Plotly``, which every dashboard view waits for.
Figures travel as the JSON text the views' plain dicts make (``to_json``).
"""

from __future__ import annotations

import json
import threading
from functools import cache
from pathlib import Path
from typing import Any

import anywidget
import numpy as np
import plotly

__all__ = ["PlotlyLibrary", "plotly_library", "to_json"]


@cache
def _bundle() -> str:
    """plotly.js, evaluated only when the page has none yet."""
    source = (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_text(encoding="utf-8")
    return "if (!globalThis.Plotly) {\n" + source + "\n}\nexport default { initialize() {} };\n"


class PlotlyLibrary(anywidget.AnyWidget):
    """A model without a view whose module loads plotly.js into the page."""

    _esm = _bundle()


_library: list[PlotlyLibrary] = []
_library_lock = threading.Lock()


def plotly_library() -> PlotlyLibrary:
    """The kernel's one ``PlotlyLibrary`` (created, and so sent, at the first call)."""
    with _library_lock:
        if not _library:
            _library.append(PlotlyLibrary())
        return _library[0]


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def to_json(figure: dict[str, Any]) -> str:
    """A plain figure dict (NumPy values allowed) as JSON text."""
    return json.dumps(figure, default=_plain, separators=(",", ":"))
