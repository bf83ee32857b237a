"""``Plots``: the dashboard's two plotly figures (map and timeline) in one small anywidget.

Why not plotly's ``FigureWidget``: importing it imports ``plotly.io._renderers`` and with it
nbformat and jsonschema (seconds in a fresh kernel), each instance ships a 5 MB bundle, and
every change is sent as a validated figure. Here the figures travel as JSON strings that the
views already produced (``map_json``, ``timeline_json``; drawn with ``Plotly.react``, which
keeps zoom and pan through ``layout.uirevision``), and new timeline points as small custom
messages (``extend``: ``Plotly.extendTraces``). plotly.js is the copy plotly.py ships,
evaluated once per page.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import anywidget
import numpy as np
import plotly
import traitlets

__all__ = ["Plots", "to_json"]

_RENDER = """
const CONFIG = {responsive: true, displaylogo: false};
function render({ model, el }) {
  const Plotly = globalThis.Plotly;
  const divs = {};
  for (const name of ["map", "timeline"]) {
    const div = document.createElement("div");
    div.className = "gpuviz-plot gpuviz-" + name;
    el.appendChild(div);
    divs[name] = div;
  }
  const draw = (name) => {
    const text = model.get(name + "_json");
    if (!text) return;
    const figure = JSON.parse(text);
    Plotly.react(divs[name], figure.data || [], figure.layout || {}, CONFIG).then(() => {
      el.dataset[name + "Draws"] = String(Number(el.dataset[name + "Draws"] || 0) + 1);
    });
  };
  for (const name of Object.keys(divs)) {
    draw(name);
    model.on("change:" + name + "_json", () => draw(name));
  }
  model.on("msg:custom", (message) => {
    const extend = message.extend;
    if (extend && divs[extend.figure].data) {
      Plotly.extendTraces(divs[extend.figure], {x: extend.x, y: extend.y}, extend.traces);
      el.dataset.extends = String(Number(el.dataset.extends || 0) + 1);
    }
  });
  return () => { for (const div of Object.values(divs)) Plotly.purge(div); };
}
export default { render };
"""


@cache
def _bundle() -> str:
    """plotly.js (evaluated only when the page has none yet) followed by the renderer."""
    source = (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_text(encoding="utf-8")
    return "if (!globalThis.Plotly) {\n" + source + "\n}\n" + _RENDER


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def to_json(figure: dict[str, Any]) -> str:
    """A plain figure dict (NumPy values allowed) as JSON text."""
    return json.dumps(figure, default=_plain, separators=(",", ":"))


class Plots(anywidget.AnyWidget):
    """The fragmentation map and the timeline, as plotly figures in JSON."""

    _esm = _bundle()
    map_json = traitlets.Unicode("").tag(sync=True)
    timeline_json = traitlets.Unicode("").tag(sync=True)

    def extend(self, figure: str, traces: list[int], x: list[list[float]], y: list[list[float]]) -> None:
        """Append points to traces of a drawn figure (``Plotly.extendTraces``)."""
        self.send({"extend": {"figure": figure, "traces": traces, "x": x, "y": y}})
