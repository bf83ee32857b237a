"""A run's result as JSON data: what the JupyterLab extension renders.

``result(profile)`` gives a JSON-able dict (format ``gpuviz-result``, version 1), shown in
notebooks as ``application/vnd.gpuviz.v1+json`` beside the static HTML fallback, and
saved as ``RUN.gpuviz.json`` files that JupyterLab opens with the same renderer. The
extension's ``labextension/src/format.ts`` declares the same constants and layout; a
test ties the two together.

Layout::

    {"format": "gpuviz-result", "version": 1, "title": str,
     "summary": [str, ...],                                  # plain-text lines
     "figures": [{"name": str, "title": str, "figure": {"data": [...], "layout": {...}}}],
     "tables":  [{"name": str, "title": str, "columns": [str], "rows": [[str|int|float|None]]}]}
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
from plotly.utils import PlotlyJSONEncoder

from gpuviz.analysis.profile import Profile
from gpuviz.base.units import format_bytes
from gpuviz.views.fragmentation import fragmentation_map
from gpuviz.views.report import FRAME_RECTANGLES, figure_json
from gpuviz.views.timeline import timeline

__all__ = ["MIME_TYPE", "FORMAT", "FORMAT_VERSION", "FILE_EXTENSION", "result", "result_json"]

MIME_TYPE = "application/vnd.gpuviz.v1+json"
FORMAT = "gpuviz-result"
FORMAT_VERSION = 1
FILE_EXTENSION = ".gpuviz.json"


def _summary(p: Profile) -> list[str]:
    lines = [f"{len(p.log)} events · devices: {', '.join(p.log.device_names) or 'none'}"]
    lines += [f"hint: {hint}" for hint in p.diagnosis.hints]
    for d in p.diagnosis.devices:
        lines.append(
            f"{d.device}: peak in use {format_bytes(d.peak.bytes)} at event {d.peak.seq}, "
            f"peak pool {format_bytes(d.peak_pool_bytes)}, in use at end {format_bytes(d.bytes_in_use_at_end)}, "
            f"fragmentation at peak {d.fragmentation_at_peak:.1%}, internal waste at peak "
            f"{format_bytes(d.waste_at_peak)}"
        )
    for row in p.ooms.to_dict("records"):
        lines.append(
            f"out of memory on {row['device']}: {format_bytes(int(row['requested']))} requested, "
            f"{format_bytes(int(row['free']))} free, largest free chunk {format_bytes(int(row['largest_free']))}"
        )
    return lines


def _table(name: str, title: str, frame: pd.DataFrame) -> dict[str, Any]:
    rows = [[None if pd.isna(v) else v for v in row] for row in frame.itertuples(index=False, name=None)]
    return {"name": name, "title": title, "columns": [str(c) for c in frame.columns], "rows": rows}


def result(p: Profile, *, title: str = "gpuviz") -> dict[str, Any]:
    """The result of ``p`` in the ``gpuviz-result`` layout (JSON-able: plain lists, numbers, strings)."""
    figures = []
    gpus_first = sorted(p.devices.items(), key=lambda item: not item[0].startswith("GPU"))
    for name, device in gpus_first:
        state = device.state_at(device.peak.index) if device.peak.index >= 0 else device.state_at(-1)
        at_peak = fragmentation_map(state, max_rectangles=FRAME_RECTANGLES, lean=True)
        figures.append({"name": f"map:{name}", "title": f"{name}: heap at the peak", "figure": figure_json(at_peak)})
        series = timeline(
            device.series, t0_ns=p.t0_ns, points=p.options.points, transfers=p.transfers, marks=p.marks,
            ooms=p.ooms[p.ooms["device"] == name] if len(p.ooms) else None,
            segments=p.segments[p.segments["device"] == name] if len(p.segments) else None, peak=device.peak,
        )  # fmt: skip
        figures.append({"name": f"timeline:{name}", "title": f"{name}: timeline", "figure": figure_json(series)})
    tables = []
    if len(p.placements):
        tables.append(_table("placement", "Placement", p.placements))
    if len(p.call_sites):
        tables.append(_table("call sites", "Call sites", p.call_sites))
    data = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "title": title,
        "summary": _summary(p),
        "figures": figures,
        "tables": tables,
    }
    # through JSON once: NumPy arrays and scalars in figures and tables become plain values
    parsed: dict[str, Any] = json.loads(json.dumps(data, cls=PlotlyJSONEncoder))
    return parsed


def result_json(p: Profile, *, title: str = "gpuviz") -> str:
    """``result(p)`` as compact JSON text (what a ``.gpuviz.json`` file holds)."""
    return json.dumps(result(p, title=title), separators=(",", ":"))
