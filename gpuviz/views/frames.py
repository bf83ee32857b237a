"""The report's scrubber frames: one device's lean map at each of many log positions.

Each frame is exactly what ``fragmentation.map_spec_and_state(lean=True)`` draws there. A heap
of more than ``max_rectangles / 2`` chunks (an aggregated map) is drawn from the replay's
arrays (``fragmentation.aggregated_specs``), without a Python object per chunk; the heaps of
all stops come from one pass over the events (``DeviceProfile.columns_at_each``). A smaller
heap, whose chunks are drawn one by one with their hovers, and an out-of-memory stop (pinning
analysis) go through ``map_spec_and_state``.

The page gets the aggregated frames' bars packed (``pack_bars``): every such trace's ``y``,
``base``, ``x`` and ``customdata`` moved into six shared columns (``BAR_COLUMNS``, base64 typed
arrays as in ``eventstream``), the trace keeping ``"bars": [first, end)`` rows of them;
``FRAMES_JS`` (``gpuvizUnpack``) puts them back as the same plain arrays before a frame is drawn.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from gpuviz.analysis.heapcolumns import HeapColumns
from gpuviz.analysis.profile import Profile
from gpuviz.log.schema import Kind
from gpuviz.views.eventstream import decode_columns, encode_columns
from gpuviz.views.fragmentation import (
    ZOOM_BELOW,
    aggregated_specs,
    call_site,
    lean_rows,
    map_spec_and_state,
    metric_text,
    metric_words,
    rows_layout,
)
from gpuviz.views.overview import (
    DETAIL_ROWS,
    OVERVIEW_ABOVE,
    column_groups,
    column_in_use,
    column_lanes,
    map_meta,
    top_allocations,
)

__all__ = ["Frame", "scrubber_frames", "lean_aggregated_spec", "columns_zoom", "BAR_COLUMNS", "pack_bars"]
__all__ += ["unpack_bars", "FRAMES_JS", "overview_spec"]

BAR_COLUMNS = ("y", "base", "x", "address", "count", "length")
"""The packed bars' columns: row, base and length of each bar (whole bytes), then its ``customdata``."""


class Frame(NamedTuple):
    """One stop's map (``{"data", "layout"}``, plain dicts) and its metric strip."""

    spec: dict[str, Any]
    metric: str


def columns_zoom(heap: HeapColumns, lanes: Sequence[int] = ()) -> tuple[int, int] | None:
    """``fragmentation.zoom_range`` (without pinning) of a heap given as arrays (``lanes``: its
    rows of inferred preexisting memory, left out)."""
    if not len(heap.bases):
        return None
    pool, in_use = heap.pool_bytes, heap.bytes_in_use
    if in_use >= ZOOM_BELOW * pool:
        return None
    other = np.ones(len(heap.bases), dtype=bool)
    other[list(lanes)] = False
    widest = int(heap.sizes[other].max())
    used = heap.in_use & other[heap.owner]
    ends = heap.address[used] + heap.size[used] - heap.bases[heap.owner[used]]
    end = int(ends.max()) if len(ends) else 0
    end = min(widest, int(end * 1.25) + 1)
    return None if end >= widest or end <= 0 else (0, end)


def lean_aggregated_spec(heap: HeapColumns, title: str, max_rectangles: int, site_of: Any = None) -> Frame:
    """The lean map of ``heap`` (more than ``max_rectangles / 2`` chunks, no OOM) titled ``title``:
    ``trace_specs`` and ``map_layout`` with ``lean=True``, from whole arrays (its bars as NumPy
    arrays: ``aggregated_specs(arrays=True)``). ``site_of(stack)`` (a call site or None): given,
    the layout's meta also names each segment's largest allocation (``top_allocations``)."""
    metric = metric_words(heap.bytes_in_use, heap.pool_bytes, heap.largest_free_chunk)
    bases = heap.bases.tolist()
    heading = html.escape(title) + "<br><sub>" + metric + "</sub>"
    sizes, lanes = heap.sizes.tolist(), column_lanes(heap)
    layout = rows_layout(bases, sizes, columns_zoom(heap, lanes), heading, lanes=lanes, lean=True)
    layout["yaxis"] = lean_rows(bases, sizes=sizes, lanes=lanes)
    layout["meta"] = map_meta(bases, sizes, column_in_use(heap), lanes)
    if site_of is not None:
        layout["meta"].update(top_allocations(heap, site_of))
    return Frame({"data": aggregated_specs(heap, max_rectangles, arrays=True), "layout": layout}, metric)


def overview_spec(heap: HeapColumns, title: str) -> Frame:
    """A stop of a map of many segments without its segments: the overview's totals only
    (``layout.meta.groups``: ``column_groups``), what the page draws there."""
    metric = metric_words(heap.bytes_in_use, heap.pool_bytes, heap.largest_free_chunk)
    heading = html.escape(title) + "<br><sub>" + metric + "</sub>"
    meta = {"groups": column_groups(heap, column_lanes(heap)), "segments": len(heap.bases)}
    return Frame({"data": [], "layout": {"title": {"text": heading}, "meta": meta}}, metric)


def _nearest_first(positions: Sequence[int], opening: int) -> list[int]:
    """Indices of ``positions`` by distance from ``opening`` (the earlier first on ties)."""
    return sorted(range(len(positions)), key=lambda i: (abs(positions[i] - opening), positions[i]))


def scrubber_frames(
    p: Profile, device: str, positions: Sequence[int], *, max_rectangles: int, detail_rows: int | None = None
) -> list[Frame]:
    """``device``'s lean map right after each log position of ``positions`` (each >= 0); the
    bars of aggregated maps as NumPy arrays (``pack_bars`` packs them, ``unpack_bars`` makes
    them lists). A map of more than ``OVERVIEW_ABOVE`` segments gets its segments (the
    drill-down's detail) at the stops nearest the opening moment while their rows add up to at
    most ``detail_rows`` (default ``overview.DETAIL_ROWS``; the opening stop always), else the
    overview's totals (``overview_spec``)."""
    detail_rows = DETAIL_ROWS if detail_rows is None else detail_rows
    dp = p.devices[device]
    kinds, devices = p.log["kind"], p.log["device"]
    own = p.log.device_index(device)
    stacks = p.log.stacks

    def site_of(stack: int) -> str | None:
        return call_site(stacks, stack)

    frames: list[Frame | None] = [None] * len(positions)
    budget = detail_rows
    opening = dp.opening if dp.opening >= 0 else (positions[-1] if len(positions) else 0)
    oom = [int(kinds[at]) == Kind.OOM and int(devices[at]) == own for at in positions]
    replayed = [at for at, pinned in zip(positions, oom, strict=True) if not pinned]
    heaps = dp.columns_at_each(replayed)  # every stop's heap in one pass over the events
    heap_of = dict(zip(replayed, range(len(replayed)), strict=True))
    for k in _nearest_first(positions, opening):
        at = positions[k]
        heap = None if oom[k] else heaps[heap_of[at]]
        if heap is None or len(heap.address) * 2 <= max_rectangles:
            spec, state = map_spec_and_state(p, device, at, lean=True, max_rectangles=max_rectangles)
            frames[k] = Frame(spec, metric_text(state))
            continue
        title = f"{device} after event {at}" + (" (peak)" if at == dp.peak.index else "")
        rows = len(heap.bases)
        if rows > OVERVIEW_ABOVE and rows > budget and budget < detail_rows:
            frames[k] = overview_spec(heap, title)
            continue
        budget -= rows
        frames[k] = lean_aggregated_spec(heap, title, max_rectangles, site_of if rows > OVERVIEW_ABOVE else None)
    return [f for f in frames if f is not None]


def _column_type(values: np.ndarray) -> str:
    small = not len(values) or (int(values.min()) >= -(2**31) and int(values.max()) < 2**31)
    return "Int32Array" if small else "Float64Array"  # whole numbers: exact in float64 below 2**53


def pack_bars(specs: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    """``specs`` (``{"data", "layout", ...}`` each) with every trace whose bars are NumPy arrays
    given ``"bars": [first, end)`` instead, and the columns those bars moved to (``BAR_COLUMNS``,
    encoded), in one pass over all of them."""
    packed: list[dict[str, Any]] = []
    parts: dict[str, list[np.ndarray]] = {name: [] for name in BAR_COLUMNS}
    rows = 0
    for spec in specs:
        data = []
        for trace in spec["data"]:
            if not isinstance(trace.get("y"), np.ndarray):
                data.append(trace)
                continue
            custom = trace["customdata"]
            for name, values in zip(BAR_COLUMNS, (trace["y"], trace["base"], trace["x"], *custom.T), strict=True):
                parts[name].append(values)
            kept = {k: v for k, v in trace.items() if k not in ("y", "base", "x", "customdata")}
            data.append({**kept, "bars": [rows, rows + len(trace["y"])]})
            rows += len(trace["y"])
        packed.append({**spec, "data": data})
    columns = {name: np.concatenate(parts[name]) if parts[name] else np.zeros(0, np.int64) for name in BAR_COLUMNS}
    types = {name: _column_type(values) for name, values in columns.items()}
    return packed, encode_columns(types, columns)


def unpack_bars(spec: dict[str, Any], columns: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    """``spec`` with its bars as lists: packed bars (``"bars"``, taken from ``columns``, as
    ``gpuvizUnpack`` does in the page) or NumPy arrays (``scrubber_frames``)."""
    decoded = decode_columns(columns) if columns is not None else {}
    data = []
    for trace in spec["data"]:
        if "bars" in trace:
            first, end = trace["bars"]
            values = [decoded[name][first:end].astype(np.int64) for name in BAR_COLUMNS]
            kept = {k: v for k, v in trace.items() if k != "bars"}
            trace = {**kept, "y": values[0], "base": values[1], "x": values[2],
                     "customdata": np.stack(values[3:], axis=1)}  # fmt: skip
        if isinstance(trace.get("y"), np.ndarray):
            trace = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in trace.items()}
        data.append(trace)
    return {**spec, "data": data}


FRAMES_JS = """
function gpuvizUnpack(frame, columns) {
  // a frame's packed bars (gpuviz.views.frames.pack_bars) back as plain arrays; columns: decoded
  frame.data.forEach(function (trace) {
    if (!trace.bars) { return; }
    var first = trace.bars[0], end = trace.bars[1], custom = [];
    function rows(name) { return Array.from(columns[name].subarray(first, end)); }
    for (var i = first; i < end; i++) { custom.push([columns.address[i], columns.count[i], columns.length[i]]); }
    trace.y = rows('y'); trace.base = rows('base'); trace.x = rows('x'); trace.customdata = custom;
    delete trace.bars;
  });
  return frame;
}
"""
"""What the report's page runs to put a frame's packed bars back (``gpuvizDecode`` decodes the columns)."""
