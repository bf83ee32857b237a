"""The fragmentation map's axes: numbered or category rows (at most ``overview.MAX_LABELS``
labelled, lanes named), binary size ticks, the x range (lanes left out, a failed request
reached) and the zoom buttons."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuviz.base.units import format_size
from gpuviz.views.mapstyle import label as _label
from gpuviz.views.overview import row_ticks

__all__ = ["rows_layout", "lean_rows", "numbered_rows", "size_ticks"]


def numbered_rows(bases: Sequence[int], sizes: Sequence[int], lanes: Sequence[int] = ()) -> dict[str, Any]:
    tickvals, ticktext = row_ticks(bases, sizes, lanes)
    return {"tickvals": tickvals, "ticktext": ticktext, "range": [len(bases) - 0.5, -0.5], "type": "linear"}


def size_ticks(span: int) -> dict[str, Any]:
    """x-axis ticks in binary units over ``[0, span]`` bytes (plotly's own are decimal)."""
    if span <= 0:
        return {}
    raw = span / 6
    step = 1
    while step * 2 <= raw:
        step *= 2
    values = list(range(0, span + 1, step))
    return {"tickvals": values, "ticktext": [format_size(v) for v in values]}


def lean_rows(
    bases: Sequence[int], *, oom: bool = False, sizes: Sequence[int] | None = None, lanes: Sequence[int] = ()
) -> dict[str, Any]:
    """The y axis of a lean map over segments at ``bases`` (of ``sizes`` bytes; ``lanes``: rows
    of inferred preexisting memory): numbered rows, at most ``overview.MAX_LABELS`` labelled, by
    address (with room for the ghost bar below the last row at an OOM)."""
    axis: dict[str, Any] = {"title": {"text": "segment"}, **numbered_rows(bases, sizes or [0] * len(bases), lanes)}
    if oom:
        axis["range"] = [axis["range"][0] + 0.2, axis["range"][1]]
    if lanes:
        axis["automargin"] = True
    return axis


def rows_layout(
    bases: Sequence[int], sizes: Sequence[int], zoom: tuple[int, int] | None, heading: str, *, oom: bool = False,
    lanes: Sequence[int] = (), reach: int = 0, lean: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """A map layout over segments at ``bases`` of ``sizes`` bytes (one category row each, by
    address, at most ``overview.MAX_LABELS`` labelled), titled ``heading``, opening at ``zoom``
    (buttons for it and the whole pool). The x axis spans the widest segment that is not a lane
    (``lanes``: rows of inferred preexisting memory, drawn past the axis' end), and at least to
    ``reach`` bytes (a failed request drawn whole). ``lean``: the caller sets the y axis
    (``lean_rows``), so the category rows are not built."""
    rows = max(1, len(bases))
    yaxis: dict[str, Any] = {}
    if not lean:
        categories = [_label(base) for base in bases]
        tickvals, ticktext = row_ticks(bases, sizes, lanes)
        yaxis = {
            "title": {"text": "segment"}, "type": "category", "autorange": "reversed",
            "categoryorder": "array", "categoryarray": categories,  # by address
            "tickmode": "array", "tickvals": [categories[r] for r in tickvals], "ticktext": ticktext,
            "automargin": bool(lanes),
        }  # fmt: skip
    lane_set = set(lanes)
    widest = max((s for i, s in enumerate(sizes) if i not in lane_set), default=0) or max(sizes, default=0)
    if reach > widest:
        widest = int(reach * 1.02)
    xaxis: dict[str, Any] = {"title": {"text": "offset in segment"}, **size_ticks(widest)}
    xaxis["range"] = [0, zoom[1]] if zoom is not None else [0, widest]
    layout: dict[str, Any] = {
        "title": {"text": heading},
        "barmode": "overlay",
        "bargap": 0.35 if oom else 0.15,
        "height": min(900, (220 if oom else 180) + 28 * rows),
        "hovermode": "closest",
        "xaxis": xaxis,
        "yaxis": yaxis,
        "legend": {"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom"},
        "margin": {"l": 120, "r": 20, "t": 100 if oom else 80, "b": 80},
        "uirevision": "map",  # zoom and pan survive redraws (scrubbing)
    }
    if zoom is not None:
        layout["updatemenus"] = [{
            "type": "buttons", "direction": "right", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom",
            "showactive": True, "active": 0,
            "buttons": [
                {"label": "used range", "method": "relayout", "args": [{"xaxis.range": [0, zoom[1]]}]},
                {"label": "whole pool", "method": "relayout", "args": [{"xaxis.range": [0, widest]}]},
            ],
        }]  # fmt: skip
    return layout
