"""The fragmentation map: every segment of a device at one instant, chunks drawn to scale.

At an out-of-memory event (``pinning`` given) the map also shows the failed request as a
ghost bar of its size just below the largest free chunk, highlights the free holes and
draws the pinning allocations (``moments.pinning``) in red. When bytes in use are less than
``ZOOM_BELOW`` of the pool, the x axis opens zoomed to the used range (buttons switch to the
whole pool); every chunk in use is drawn at least ``MIN_WIDTH`` of the visible range wide.

Each segment is one row (y: its base address); x is the byte offset inside the segment.
A chunk in use is drawn as its used part ``[address, address + requested)`` and its
internal waste ``[address + requested, address + size)``; a free chunk as free. When a
heap holds more chunks than ``max_rectangles``, each segment is cut into equal buckets
and every bucket is drawn as its used, waste and free bytes (what cannot be seen at that
zoom is aggregated, never dropped).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from gpuviz.analysis.heapcolumns import HeapColumns
from gpuviz.analysis.moments import Pinning
from gpuviz.analysis.profile import Profile
from gpuviz.analysis.timeline import times_inferred
from gpuviz.base.heapstate import HeapState
from gpuviz.base.tags import parse_array_tag
from gpuviz.base.units import format_size
from gpuviz.log.eventlog import Frame
from gpuviz.views.buckets import LEAN_AGGREGATED, aggregated_specs, bucket_hover, coverage
from gpuviz.views.buckets import aggregated_traces as _aggregated
from gpuviz.views.maprows import lean_rows, numbered_rows, rows_layout
from gpuviz.views.mapstyle import COLORS, MIN_WIDTH, OOM_COLORS, ZOOM_BELOW
from gpuviz.views.mapstyle import PALETTE as _PALETTE
from gpuviz.views.mapstyle import label as _label
from gpuviz.views.overview import map_meta, state_lanes

__all__ = [
    "fragmentation_map",
    "map_traces",
    "trace_specs",
    "map_layout",
    "segment_rows",
    "zoom_range",
    "map_spec",
    "map_spec_and_state",
    "device_map",
    "chunk_hover",
    "hole_hover",
    "COLORS",
    "OOM_COLORS",
    "ZOOM_BELOW",
    "MIN_WIDTH",
    "metric_text",
    "metric_words",
    "rows_layout",
    "bucket_hover",
    "coverage",
    "Allocated",
    "aggregated_specs",
    "lean_rows",
    "LEAN_AGGREGATED",
]

Allocated = Mapping[int, tuple[int, int]]
"""address -> (allocating event's log position, its time in ns from the log's start)."""


def metric_text(state: HeapState) -> str:
    """The metric strip: bytes in use, pool, largest free chunk, fragmentation."""
    return metric_words(state.bytes_in_use, state.pool_bytes, state.largest_free_chunk)


def metric_words(bytes_in_use: int, pool_bytes: int, largest_free: int) -> str:
    """The metric strip from its numbers (bytes); fragmentation as ``HeapState.fragmentation``."""
    free = pool_bytes - bytes_in_use
    fragmentation = (free - largest_free) / free if free else 0.0
    return (
        f"in use {format_size(bytes_in_use)} · pool {format_size(pool_bytes)} · "
        f"largest free {format_size(largest_free)} · fragmentation {fragmentation:.1%}"
    )


def _group(tag: str | None, color_by: str) -> str:
    if color_by == "dtype":
        parsed = parse_array_tag(tag)
        return parsed.dtype if parsed else "(untagged)"
    return tag or "(untagged)"


def call_site(stacks: Sequence[tuple[Frame, ...]] | None, stack: int) -> str | None:
    """``file:line (function)`` of the innermost recorded frame of stack ``stack``."""
    if stacks is None or not 0 <= stack < len(stacks) or not stacks[stack]:
        return None
    frame = stacks[stack][0]
    return f"{frame.filename}:{frame.lineno} ({frame.function})"


def chunk_hover(
    tag: str | None, size: int, requested: int, address: int, allocated: tuple[int, int] | None, site: str | None
) -> str:
    """What hovering a chunk in use says (the same words in every view): tag, requested and chunk
    size, address, when it was allocated, call site."""
    text = f"<b>{html.escape(tag) if tag else '(untagged)'}</b><br>requested {format_size(requested)}"
    text += f" · chunk {format_size(size)}<br>address {address:#x}"
    if allocated is not None:  # (a time below 0: the source recorded none)
        text += f"<br>allocated at event {allocated[0]}"
        text += f", t = {allocated[1] / 1e9:.3f} s" if allocated[1] >= 0 else ""
    if site is not None:
        text += f"<br>call site {html.escape(site)}"
    return text


def hole_hover(size: int, address: int) -> str:
    return f"<b>free hole</b> {format_size(size)}<br>address {address:#x}"


def _exact(
    state: HeapState,
    color_by: str,
    stacks: Sequence[tuple[Frame, ...]] | None = None,
    allocated: Allocated | None = None,
    min_width: float = 0.0,
    free_name: str = "free",
    texts: bool = True,
) -> dict[str, dict[str, list[Any]]]:
    """Each chunk's bars (used, waste or free) by trace name; ``texts``: with their hovers (lean
    traces hover from ``customdata`` instead)."""
    traces: dict[str, dict[str, list[Any]]] = {}

    def add(name: str, y: str, start: int, length: float, text: str, custom: tuple[int, ...]) -> None:
        t = traces.setdefault(name, {"y": [], "base": [], "x": [], "text": [], "custom": []})
        t["y"].append(y)
        t["base"].append(start)
        t["x"].append(length)
        t["text"].append(text)
        t["custom"].append(custom)

    for seg in state.segments:
        y = _label(seg.base)
        for c in seg.chunks:
            offset = c.address - seg.base
            if c.in_use:
                when = allocated.get(c.address) if allocated is not None else None
                info = (
                    chunk_hover(c.tag, c.size, c.requested, c.address, when, call_site(stacks, c.stack))
                    if texts
                    else ""
                )
                used = "used" if color_by == "state" else html.escape(_group(c.tag, color_by))
                custom = (c.address, c.size, c.requested)
                add(used, y, offset, max(c.requested, min_width), info, custom)
                if c.size > c.requested:
                    add("waste", y, offset + c.requested, c.size - c.requested, info, custom)
            else:
                add(
                    free_name, y, offset, c.size, hole_hover(c.size, c.address) if texts else "", (c.address, c.size, 0)
                )
    return traces


_EMPTY: dict[str, list[Any]] = {"y": [], "base": [], "x": [], "text": [], "custom": []}


def zoom_range(state: HeapState, pinning: Pinning | None = None) -> tuple[int, int] | None:
    """The x range (bytes from each segment's base) the map opens at, or None for the whole pool.

    When bytes in use are below ``ZOOM_BELOW`` of the pool, the range reaches from 0 to a quarter
    past the end of the highest chunk in use in any segment (and past the ghost bar and the
    pinning window at an OOM), capped at the largest segment; None when that is the whole pool.
    """
    if not state.segments or state.bytes_in_use >= ZOOM_BELOW * state.pool_bytes:
        return None
    lanes = set(state_lanes(state))
    widest = max(s.size for i, s in enumerate(state.segments) if i not in lanes)
    end = 0
    for i, seg in enumerate(state.segments):
        if i in lanes:
            continue
        for c in seg.chunks:
            if c.in_use:
                end = max(end, c.address + c.size - seg.base)
    if pinning is not None and pinning.largest_hole_address >= 0:
        seg = next(s for s in state.segments if s.base <= pinning.largest_hole_address < s.end)
        end = max(end, pinning.largest_hole_address - seg.base + pinning.rounded)
        widest = max(widest, int(end * 1.02))  # the failed request is drawn whole, past its segment's end
        if pinning.best is not None:
            end = max(end, pinning.best.end - pinning.best.segment)
    end = min(widest, int(end * 1.25) + 1)
    return None if end >= widest or end <= 0 else (0, end)


def _visible_span(state: HeapState, zoom: tuple[int, int] | None) -> int:
    if zoom is not None:
        return zoom[1] - zoom[0]
    lanes = set(state_lanes(state))
    return max((s.size for i, s in enumerate(state.segments) if i not in lanes), default=0)


def _oom_traces(
    state: HeapState, pinning: Pinning, rows: dict[str, int] | None, min_width: float,
    allocated: Allocated | None, stacks: Sequence[tuple[Frame, ...]] | None,
) -> list[dict[str, Any]]:  # fmt: skip
    """The pinning chunks (over their rectangles) and the ghost bar of the failed request."""

    def y_of(base: int) -> Any:
        return rows[_label(base)] if rows is not None else _label(base)

    specs = []
    best = pinning.best
    pin: dict[str, list[Any]] = {"y": [], "base": [], "x": [], "text": []}
    segment = best.segment if best is not None else 0
    for c in best.chunks if best is not None else ():
        pin["y"].append(y_of(segment))
        pin["base"].append(c.address - segment)
        pin["x"].append(max(c.size, min_width))
        when = (c.alloc_index, c.alloc_ns) if c.alloc_index >= 0 else None
        if allocated is not None and c.address in allocated:
            when = allocated[c.address]
        site = c.call_site if c.call_site is not None else call_site(stacks, c.stack)
        pin["text"].append("<b>pinning</b>: releasing it makes room<br>" + chunk_hover(
            c.tag, c.size, c.requested, c.address, when, site))  # fmt: skip
    specs.append({
        "type": "bar", "orientation": "h", "name": "pinning", "y": pin["y"], "base": pin["base"], "x": pin["x"],
        "hovertext": pin["text"], "hoverinfo": "text",
        "marker": {"color": OOM_COLORS["pinning"], "line": {"width": 1, "color": "#7b241c"}},
    })  # fmt: skip
    ghost: dict[str, Any] = {
        "type": "bar", "orientation": "h", "name": "failed request", "y": [], "base": [], "x": [],
        "offset": 0.36, "width": 0.3, "hoverinfo": "text", "hovertext": [],
        "marker": {"color": OOM_COLORS["failed request"], "line": {"width": 1.5, "color": OOM_COLORS["pinning"]},
                   "pattern": {"shape": "/", "fgcolor": OOM_COLORS["pinning"], "size": 6}},
    }  # fmt: skip
    if pinning.largest_hole_address >= 0:
        seg = next(s for s in state.segments if s.base <= pinning.largest_hole_address < s.end)
        ghost["y"] = [y_of(seg.base)]
        ghost["base"] = [pinning.largest_hole_address - seg.base]
        ghost["x"] = [pinning.rounded]
        miss = f"misses by {format_size(pinning.rounded - pinning.largest_hole)}"
        ghost["hovertext"] = [
            f"<b>failed request</b> {format_size(pinning.rounded)} ({miss})<br>largest free hole "
            f"{format_size(pinning.largest_hole)} at {pinning.largest_hole_address:#x}<br>{pinning.sentence()}"
        ]
        ghost.update(text=[f"failed request {format_size(pinning.rounded)}: {miss}"], textposition="inside",
                     insidetextanchor="start", textfont={"color": "#7b241c"}, constraintext="none")  # fmt: skip
    specs.append(ghost)
    return specs


def trace_specs(
    state: HeapState,
    *,
    color_by: str = "state",
    max_rectangles: int = 20_000,
    lean: bool = False,
    stacks: Sequence[tuple[Frame, ...]] | None = None,
    pinning: Pinning | None = None,
    allocated: Allocated | None = None,
) -> list[dict[str, Any]]:
    """The map's bars as plain plotly trace dicts: always ``free``, ``waste``, ``used`` first
    (possibly empty; chunks in use drawn last, on top) in ``"state"`` mode or when aggregated, so
    scrubber frames line up; then one trace per tag/dtype; then, with ``pinning``, the
    ``pinning`` chunks and the ``failed request`` ghost bar.

    ``allocated``: when each live chunk was allocated (hover says so). ``lean``: rows as numbers
    (``segment_rows`` labels them) and whole-byte geometry, for reports that embed many frames;
    chunk hovers then come as numeric ``customdata`` ``[size, requested, tag, event, ms, site]``
    (tag and site index ``meta.strings``, -1 none; ms: the allocation's time from the log's
    start) that the report's script turns into the same words as ``chunk_hover``, taking the
    address from the row's segment base and the bar's base -- a fraction of the bytes of text.
    """
    n_chunks = sum(len(s.chunks) for s in state.segments)
    aggregated = n_chunks * 2 > max_rectangles
    zoom = zoom_range(state, pinning)
    min_width = MIN_WIDTH * _visible_span(state, zoom)
    free_name = "free hole" if pinning is not None else "free"
    rows = {_label(seg.base): i for i, seg in enumerate(state.segments)}
    if aggregated and lean:
        specs = aggregated_specs(HeapColumns.from_state(state), max_rectangles, free_name=free_name)
        if pinning is not None:
            specs += _oom_traces(state, pinning, rows, min_width, allocated, stacks)
        return specs
    if aggregated:
        traces = _aggregated(state, max_rectangles, texts=not lean)
    else:
        traces = _exact(state, color_by, stacks, allocated, min_width, free_name, texts=not lean)
    first = [free_name, "waste", "used"]
    names = [*first, *sorted(n for n in traces if n not in first and n not in COLORS)]
    chunk_of = {c.address: c for c in state.chunks()} if lean and not aggregated else {}
    specs = []
    for i, name in enumerate(names):
        data = traces.get(name, _EMPTY)
        color = OOM_COLORS.get(name) or COLORS.get(name, _PALETTE[i % len(_PALETTE)])
        spec: dict[str, Any] = {
            "type": "bar",
            "orientation": "h",
            "name": name + (" (aggregated)" if aggregated and name in COLORS else ""),
            "marker": {"color": color, "line": {"width": 0.5, "color": "white"}},
        }
        if lean:
            spec.update(y=[rows[y] for y in data["y"]], base=[int(b) for b in data["base"]],
                        x=[round(x) for x in data["x"]])  # fmt: skip
            strings: dict[str, int] = {}
            custom = []
            for address, size, _ in data["custom"]:  # the address is the row's base + the bar's base
                c = chunk_of[address]
                when = allocated.get(address) if allocated is not None and c.in_use else None
                site = call_site(stacks, c.stack) if c.in_use else None
                tag = strings.setdefault(c.tag or "(untagged)", len(strings)) if c.in_use else -1
                site_id = strings.setdefault(site, len(strings)) if site is not None else -1
                event, ns = when or (-1, -1)
                custom.append([size, c.requested, tag, event, round(ns / 1e6) if event >= 0 <= ns else -1, site_id])
            meta: dict[str, Any] = {"strings": list(strings)}
            if name == "waste":  # its bars start after the requested bytes, not at the chunk
                meta["afterRequested"] = True
            spec.update(customdata=custom, meta=meta, hoverinfo="text")
        else:
            spec.update(y=data["y"], base=data["base"], x=data["x"], hovertext=data["text"], hoverinfo="text")
        specs.append(spec)
    if pinning is not None:
        specs += _oom_traces(state, pinning, rows if lean else None, min_width, allocated, stacks)
    return specs


def map_traces(
    state: HeapState,
    *,
    color_by: str = "state",
    max_rectangles: int = 20_000,
    lean: bool = False,
    stacks: Sequence[tuple[Frame, ...]] | None = None,
    pinning: Pinning | None = None,
    allocated: Allocated | None = None,
) -> list[go.Bar]:
    """``trace_specs`` as validated plotly ``Bar`` traces."""
    specs = trace_specs(
        state, color_by=color_by, max_rectangles=max_rectangles, lean=lean, stacks=stacks, pinning=pinning,
        allocated=allocated,
    )  # fmt: skip
    return [go.Bar(**spec) for spec in specs]


def segment_rows(state: HeapState) -> dict[str, Any]:
    """y-axis settings that label the numeric rows of lean traces with segment addresses (at
    most ``overview.MAX_LABELS`` of them, and every lane)."""
    return numbered_rows([s.base for s in state.segments], [s.size for s in state.segments], state_lanes(state))


def map_layout(
    state: HeapState, *, title: str | None = None, lean: bool = False, pinning: Pinning | None = None
) -> dict[str, Any]:
    """The map's layout as a plain dict: the metric strip in the title, one row per segment, the
    x range zoomed by ``zoom_range`` with buttons for the used range and the whole pool."""
    heading = html.escape(title or state.device) + "<br><sub>" + metric_text(state)
    if pinning is not None:
        heading += "<br>" + html.escape(pinning.sentence())
    bases, sizes, lanes = [s.base for s in state.segments], [s.size for s in state.segments], state_lanes(state)
    reach = 0
    if pinning is not None and pinning.largest_hole_address >= 0:  # the failed request, drawn whole
        seg = next(s for s in state.segments if s.base <= pinning.largest_hole_address < s.end)
        reach = pinning.largest_hole_address - seg.base + pinning.rounded
    layout = rows_layout(bases, sizes, zoom_range(state, pinning), heading + "</sub>", oom=pinning is not None,
                         lanes=lanes, reach=reach, lean=lean)  # fmt: skip
    if lean:
        layout["yaxis"] = lean_rows(bases, oom=pinning is not None, sizes=sizes, lanes=lanes)
        layout["meta"] = map_meta(bases, sizes, [s.size - sum(c.size for c in s.chunks if not c.in_use)
                                                 for s in state.segments], lanes)  # fmt: skip
    return layout


def fragmentation_map(
    state: HeapState,
    *,
    color_by: str = "state",
    max_rectangles: int = 20_000,
    title: str | None = None,
    lean: bool = False,
    stacks: Sequence[tuple[Frame, ...]] | None = None,
    pinning: Pinning | None = None,
    allocated: Allocated | None = None,
) -> go.Figure:
    """The fragmentation map of ``state`` with its metric strip as the title.

    ``stacks``: the log's stack table, to show each chunk's call site on hover (chunks from
    a replay carry their allocation's stack id). ``pinning``: the analysis at an OOM (ghost
    bar, holes, pinning chunks, its sentence in the title). ``allocated``: when each live chunk
    was allocated. ``lean``: see ``trace_specs``.
    """
    return go.Figure(
        data=map_traces(
            state, color_by=color_by, max_rectangles=max_rectangles, lean=lean, stacks=stacks, pinning=pinning,
            allocated=allocated,
        ),
        layout=map_layout(state, title=title, lean=lean, pinning=pinning),
    )  # fmt: skip


def map_spec(
    p: Profile,
    device: str,
    index: int | None = None,
    *,
    lean: bool = False,
    max_rectangles: int | None = None,
    title: str | None = None,
) -> dict[str, Any]:
    """``{"data": [...], "layout": {...}}`` (plain dicts) of ``device``'s map right after log
    position ``index`` (default: the moment views open at, ``DeviceProfile.opening``), with the
    OOM's pinning when ``index`` is an OOM, each chunk's allocation time and call site."""
    return map_spec_and_state(p, device, index, lean=lean, max_rectangles=max_rectangles, title=title)[0]


def map_spec_and_state(
    p: Profile,
    device: str,
    index: int | None = None,
    *,
    lean: bool = False,
    max_rectangles: int | None = None,
    title: str | None = None,
) -> tuple[dict[str, Any], HeapState]:
    """``map_spec`` and the HeapState it draws."""
    dp = p.devices[device]
    at = dp.opening if index is None else index
    state = dp.state_at(at)
    pinned = dp.pinning_at(at)
    allocated = dp.allocated(at, p.t0_ns, addresses=[c.address for c in state.chunks() if c.in_use])
    if times_inferred(p.log):  # hovers name the event, never an inferred time
        allocated = {address: (event, -1) for address, (event, _) in allocated.items()}
    specs = trace_specs(
        state, color_by=p.options.color_by, max_rectangles=max_rectangles or p.options.max_rectangles, lean=lean,
        stacks=p.log.stacks, pinning=pinned, allocated=allocated,
    )  # fmt: skip
    if title is None:
        what = "out of memory" if pinned is not None else ("peak" if at == dp.peak.index else "")
        title = f"{device} after event {at if at >= 0 else len(p.log) - 1}" + (f" ({what})" if what else "")
    return {"data": specs, "layout": map_layout(state, title=title, lean=lean, pinning=pinned)}, state


def device_map(
    p: Profile, device: str, index: int | None = None, *, max_rectangles: int | None = None, lean: bool = False
) -> go.Figure:
    """``map_spec`` as a validated figure: what the report, result and dashboard draw."""
    spec = map_spec(p, device, index, max_rectangles=max_rectangles, lean=lean)
    return go.Figure(data=[go.Bar(**t) for t in spec["data"]], layout=spec["layout"])
