"""A run's result as JSON data: what the JupyterLab extension renders.

``result(profile)`` gives a JSON-able dict (format ``gpuviz-result``, version 1), shown in
notebooks as ``application/vnd.gpuviz.v1+json`` beside the static HTML fallback, and
saved as ``RUN.gpuviz.json`` files that JupyterLab opens with the same renderer. The
extension's ``labextension/src/format.ts`` declares the same constants and layout; a
test ties the two together.

Layout::

    {"format": "gpuviz-result", "version": 1, "title": str,
     "summary": [str, ...],                                  # plain-text lines
     "figures": [{"name": str, "title": str, "figure": {"data": [...], "layout": {...}},
                  # optional: a map's drill-down (a heap of many segments, whose figure is the overview)
                  "drill": {"groups": [{"name": str, "figure": {...}}]}}],
     "tables":  [{"name": str, "title": str, "columns": [str], "rows": [[str|int|float|None]],
                  # optional (readers of older results do without them):
                  "headers": [str],             # human column headers
                  "kinds": [str],               # per column: text, bytes, ns, count, share, address
                  "total": [str|int|float|None] | None,  # a totals row, same kinds
                  "highlight": [int]}]}         # rows to highlight (soft placement, pinning)

Values stay raw (bytes, ns) so that tables sort by value; the extension formats them by kind.
Each device's map is drawn at the moment views open at: its first OOM (with the pinning
analysis), else its peak. A heap of more than ``overview.OVERVIEW_ABOVE`` segments is drawn as
the overview by size class (``gpuviz.views.drilldown``), and ``drill`` holds each group's map
(its segments, each chunk's hover naming its allocation and call site, within
``DRILL_RECTANGLES`` rectangles in all): row i of the overview opens ``drill.groups[i]``,
and a segment's row of a group's map opens that segment alone (``layout.meta``: its ``bases``
and ``sizes``), all without a kernel. A group of more than ``overview.DENSE_ROWS`` segments is
embedded as an image of at most ``densegroup.IMAGE_ROWS`` rows of runs of segments (its meta has
no ``bases``: its rows do not open single segments), so the result's size follows what is drawn.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
from plotly.utils import PlotlyJSONEncoder

from gpuviz.analysis.integrity import integrity_lines
from gpuviz.analysis.profile import Profile
from gpuviz.analysis.tables import devices_present
from gpuviz.analysis.timeline import times_inferred
from gpuviz.base.units import format_size
from gpuviz.views.drilldown import GROUP, MapView, has_overview, heap_groups, overview_spec, view_spec
from gpuviz.views.fragmentation import device_map
from gpuviz.views.oom import pinning_lines
from gpuviz.views.overview import DENSE_ROWS
from gpuviz.views.report import FRAME_RECTANGLES, figure_json
from gpuviz.views.timeline import timeline

__all__ = ["MIME_TYPE", "FORMAT", "FORMAT_VERSION", "FILE_EXTENSION", "result", "result_json", "result_table"]

MIME_TYPE = "application/vnd.gpuviz.v1+json"
FORMAT = "gpuviz-result"
FORMAT_VERSION = 1
FILE_EXTENSION = ".gpuviz.json"
OOM_LINES = 20
"""The most out-of-memory events a result's summary names one by one (its OOM table has them all)."""
LIVE_ROWS = 200
"""The most rows of a "live at the OOM / at the peak" table in a result."""
DRILL_RECTANGLES = 4 * FRAME_RECTANGLES
"""The most rectangles the groups' maps of one drill-down draw together (each at least
``GROUP_RECTANGLES``; what a group's share cannot draw is aggregated), so a result's size
follows what is drawn, not the number of segments."""
GROUP_RECTANGLES = 500
"""The fewest rectangles one group's map of a drill-down may draw."""


def _map_figure(p: Profile, name: str, at: int, title: str) -> dict[str, Any]:
    """A result's map of device ``name`` after log position ``at``: the whole map, or for many
    segments the overview with each group's map in ``drill`` (drawn from the heap's arrays: only
    the segments of groups drawn chunk by chunk become objects)."""
    device = p.devices[name]
    heap = device.columns_at(at)
    if not has_overview(heap):
        figure = device_map(p, name, at, max_rectangles=FRAME_RECTANGLES)
        return {"name": f"map:{name}", "title": title, "figure": figure_json(figure)}
    pinned = device.pinning_at(at)
    groups = heap_groups(heap)
    drawn = np.isin(heap.owner, [r for g in groups if len(g.rows) <= DENSE_ROWS for r in g.rows]) & heap.in_use
    allocated = device.allocated(at, p.t0_ns, addresses=heap.address[drawn].tolist())
    if times_inferred(p.log):  # hovers name the event, never an inferred time
        allocated = {address: (event, -1) for address, (event, _) in allocated.items()}
    share = max(GROUP_RECTANGLES, DRILL_RECTANGLES // len(groups))
    heading = f"{name} after event {at if at >= 0 else len(p.log) - 1}"
    drill = [
        {"name": group.name, "figure": view_spec(
            heap, MapView(GROUP, group.name), title=heading, color_by=p.options.color_by,
            max_rectangles=share, stacks=p.log.stacks, pinning=pinned, allocated=allocated, groups=groups,
        )[0]}
        for group in groups
    ]  # fmt: skip
    overview = overview_spec(heap, title=heading, groups=groups)
    return {"name": f"map:{name}", "title": title, "figure": overview, "drill": {"groups": drill}}


def _summary(p: Profile) -> list[str]:
    lines = [f"warning: {line}" for line in integrity_lines(p.log)]
    lines.append(f"{len(p.log)} events · devices: {', '.join(devices_present(p.log)) or 'none'}")
    lines += [d.answer.text for d in p.diagnosis.devices if d.answer is not None]  # what held the memory
    lines += [f"hint: {hint}" for hint in p.diagnosis.hints]
    for d in p.diagnosis.devices:
        lines.append(
            f"{d.device}: peak in use {format_size(d.peak.bytes)} at event {d.peak.seq}, "
            f"peak pool {format_size(d.peak_pool_bytes)}, in use at end {format_size(d.bytes_in_use_at_end)}, "
            f"fragmentation at peak {d.fragmentation_at_peak:.1%}, internal waste at peak "
            f"{format_size(d.waste_at_peak)}"
        )
        if d.pinning is not None:
            lines.append(f"{d.device}: out of memory requesting {format_size(d.pinning.request_bytes)}:")
            lines += pinning_lines(d.pinning, p.t0_ns)
    for row in p.ooms.head(OOM_LINES).to_dict("records"):
        lines.append(
            f"out of memory on {row['device']}: {format_size(int(row['requested']))} requested, "
            f"{format_size(int(row['free']))} free, largest free chunk {format_size(int(row['largest_free']))}"
        )
    if len(p.ooms) > OOM_LINES:
        lines.append(f"... and {len(p.ooms) - OOM_LINES:,} more out-of-memory events (all in their table)")
    return lines


_COLUMNS: dict[str, tuple[str, str]] = {  # column -> (header, kind)
    "op": ("op", "text"), "requested": ("requested", "bytes"), "device": ("device", "text"),
    "count": ("count", "count"), "soft": ("soft placed", "count"), "op_ns": ("op time", "ns"),
    "bytes_allocated": ("allocated", "bytes"), "bytes_transferred": ("transferred", "bytes"),
    "transfer_ns": ("transfer time", "ns"), "call_site": ("call site", "text"), "allocations": ("allocations", "count"),
    "transfers": ("transfers", "count"), "tag": ("tag", "text"), "shape": ("shape", "text"),
    "dtype": ("dtype", "text"), "size": ("chunk", "bytes"), "age_ns": ("age", "ns"), "address": ("address", "address"),
    "alloc_index": ("allocated at event", "count"),
    "seq": ("event", "count"), "free": ("free", "bytes"), "largest_free": ("largest free chunk", "bytes"),
    "what": ("what", "text"), "bytes": ("bytes", "bytes"), "share": ("share", "share"), "each": ("each", "bytes"),
}  # fmt: skip


_NO_TOTAL = ("age_ns", "alloc_index", "seq", "free", "largest_free", "each")


def _table(
    name: str, title: str, frame: pd.DataFrame, *, kinds: dict[str, str] | None = None, total: bool = True,
    highlight: list[int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A table of raw values with human headers, a kind per column, totals of the numeric
    columns (bytes, ns, count) and the rows to highlight."""
    rows = [[None if pd.isna(v) else v for v in row] for row in frame.itertuples(index=False, name=None)]
    columns = [str(c) for c in frame.columns]
    kind = [(kinds or {}).get(c) or _COLUMNS.get(c, (c, "text"))[1] for c in columns]
    summed = [
        int(frame[c].sum()) if k in ("bytes", "ns", "count") and c not in _NO_TOTAL else ("total" if i == 0 else None)
        for i, (c, k) in enumerate(zip(columns, kind, strict=True))
    ]
    return {
        "name": name,
        "title": title,
        "columns": columns,
        "rows": rows,
        "headers": [_COLUMNS.get(c, (c.replace("_", " "), ""))[0] for c in columns],
        "kinds": kind,
        "total": summed if total and len(frame) else None,
        "highlight": highlight or [],
    }


result_table = _table
"""A table in the result layout (``name``, ``title``, a DataFrame of raw values; ``kinds``,
``total``, ``highlight``): what other results (a run's) build their tables with."""


def result(p: Profile, *, title: str = "gpuviz") -> dict[str, Any]:
    """The result of ``p`` in the ``gpuviz-result`` layout (JSON-able: plain lists, numbers, strings)."""
    figures = []
    gpus_first = sorted(p.devices.items(), key=lambda item: not item[0].startswith("GPU"))
    for name, device in gpus_first:
        at = device.opening
        where = "out-of-memory error" if device.pinning_at(at) is not None else "peak"
        figures.append(_map_figure(p, name, at, f"{name}: heap at the {where}"))
        series = timeline(
            device.series, t0_ns=p.t0_ns, points=p.options.points, transfers=p.transfers, marks=p.marks,
            ooms=p.ooms[p.ooms["device"] == name] if len(p.ooms) else None,
            segments=p.segments[p.segments["device"] == name] if len(p.segments) else None, peak=device.peak,
        )  # fmt: skip
        figures.append({"name": f"timeline:{name}", "title": f"{name}: timeline", "figure": figure_json(series)})
    tables = []
    for d in p.diagnosis.devices:
        if d.pinning is not None and d.pinning.best is not None:
            pinned = pd.DataFrame(
                [(c.tag, c.size, c.requested, c.address, c.alloc_index, c.age_ns, c.call_site)
                 for c in d.pinning.best.chunks],
                columns=["tag", "size", "requested", "address", "alloc_index", "age_ns", "call_site"],
            )  # fmt: skip
            caption = f"{d.device}: pinning allocations at the out-of-memory error ({d.pinning.sentence()})"
            tables.append(_table(f"pinning:{d.device}", caption, pinned, highlight=list(range(len(pinned)))))
        moment = "out-of-memory error" if d.moment == "OOM" else "peak"
        if len(d.live) and len(d.live_groups) < len(d.live):  # who held it first: alike allocations as one row
            groups = d.live_groups.rename(columns={"size": "each"})
            groups = groups[["count", "each", "what", "call_site", "bytes", "share"]]
            caption = f"{d.device}: who held the memory at the {moment} ({len(d.live):,} allocations in "
            tables.append(_table(f"live-groups:{d.device}", caption + f"{len(groups):,} groups, most bytes first)",
                                 groups))  # fmt: skip
        if len(d.live):
            live = d.live.head(LIVE_ROWS).drop(columns=["alloc_index"])
            caption = f"{d.device}: live at the {moment} ({len(d.live)} allocation{'s' if len(d.live) != 1 else ''}"
            tables.append(_table(f"live:{d.device}", caption + ", largest first)", live))
    if len(p.ooms):
        ooms = p.ooms[["seq", "device", "requested", "free", "largest_free"]]
        tables.append(_table("ooms", f"Out-of-memory events ({len(ooms):,})", ooms))
    if len(p.placements):
        soft = [i for i, n in enumerate(p.placements["soft"].tolist()) if n]
        tables.append(_table("placement", "Placement", p.placements, kinds={"requested": "text"}, highlight=soft))
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
