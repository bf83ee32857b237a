"""plotly.js for the dashboard, sent to the front-end once per kernel, and JSON for figures.

Why not plotly's ``FigureWidget``: importing it imports ``plotly.io._renderers`` and with it
nbformat and jsonschema (seconds in a fresh kernel), each instance ships a 5 MB bundle and
is its own set of comms, and every change is sent as a validated figure. Here one
``PlotlyLibrary`` widget (created at the first dashboard of a kernel, never displayed)
carries plotly.js's cartesian partial bundle (``gpuviz.views.plotlyjs``: 1.5 MB instead of
plotly.py's 4.8 MB, every trace type the widgets draw, ``TRACE_TYPES``); its module runs when
the front-end creates the model and sets ``globalThis.Plotly`` (unless the page has one),
which every dashboard view waits for. Figures travel as the JSON text the views' plain dicts
make (``to_json``, which refuses a figure with a trace type that bundle lacks).
"""

from __future__ import annotations

import json
import threading
from functools import cache
from typing import Any

import anywidget
import numpy as np

from gpuviz.views.plotlyjs import Bundle, bundle_for, trace_types

__all__ = ["PlotlyLibrary", "plotly_library", "to_json", "TRACE_TYPES", "library_bundle"]

TRACE_TYPES = frozenset({"scatter", "bar", "heatmap"})
"""The trace types gpuviz's widgets draw (timeline, map, run heatmap)."""


def library_bundle() -> Bundle:
    """The plotly.js bundle ``PlotlyLibrary`` sends: the cartesian one (the full one only when
    the vendored bundle is not plotly.py's plotly.js version)."""
    return bundle_for(TRACE_TYPES)


@cache
def _bundle() -> str:
    """plotly.js, evaluated only when the page has none yet."""
    source = library_bundle().source()
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
    """A plain figure dict (NumPy values allowed) as JSON text; ``ValueError`` naming the trace
    types that the notebook's plotly.js bundle would not draw (a blank plot otherwise)."""
    missing = trace_types([figure]) - TRACE_TYPES
    if missing:
        raise ValueError(
            f"the notebook's plotly.js draws {', '.join(sorted(TRACE_TYPES))} traces, not {', '.join(sorted(missing))}"
        )
    return json.dumps(figure, default=_plain, separators=(",", ":"))
