"""The fragmentation map's overview and drill-down as figures built in Python: what the
notebook dashboard draws (the kernel draws each level when the user clicks) and what a saved
result embeds for the JupyterLab extension (every group's map, drawn without a kernel).

A heap of more than ``overview.OVERVIEW_ABOVE`` segments opens as the *overview*: one row per
group of ``overview.segment_groups`` (the same groups as the HTML report's: inferred
preexisting memory, then each size class of segment), each drawn as its bytes in use and
reserved but unused, with its segment count and totals on its label and hover. A click on a
group draws that group's segments (the map of those segments alone, every chunk's hover
naming its allocation and call site); a click on a segment draws that segment alone. A group
of more than ``overview.DENSE_ROWS`` segments is drawn as an image of at most
``densegroup.IMAGE_ROWS`` rows, each a run of consecutive segments (``densegroup``), so what is
drawn and sent does not grow with its segments. A heap of fewer segments is drawn whole (level
``map``). The heap may be given as arrays (``HeapColumns``): the overview and the images are
drawn from them, and only a drawn group's or segment's own segments become objects.

Each figure's ``layout.meta`` says what a click on it means: ``{"view": "overview", "groups":
[name, ...]}`` (row i is group i), ``{"view": "group", "group": name, "bases": [base, ...],
"sizes": [size, ...]}`` (its segments, by address) or the same with ``"view": "segment"`` and
one segment; an image of runs has ``{"view": "group", "group": name, "dense": true, "firsts":
[base, ...], "counts": [segments, ...]}`` (row i: ``counts[i]`` segments from ``firsts[i]``).
Sizes are bytes.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any, NamedTuple

from gpuviz.analysis.heapcolumns import HeapColumns
from gpuviz.analysis.moments import Pinning
from gpuviz.base.heapstate import HeapState
from gpuviz.base.units import format_size
from gpuviz.log.eventlog import Frame
from gpuviz.views.densegroup import dense_group_spec
from gpuviz.views.fragmentation import Allocated, call_site, map_layout, metric_words, trace_specs
from gpuviz.views.maprows import size_ticks
from gpuviz.views.mapstyle import COLORS
from gpuviz.views.overview import (
    DENSE_ROWS,
    OVERVIEW_ABOVE,
    SegmentGroup,
    column_in_use,
    column_lanes,
    segment_groups,
    state_lanes,
)

__all__ = ["MAP", "OVERVIEW", "GROUP", "SEGMENT", "MapView", "heap_groups", "has_overview", "resolve_view"]
__all__ += ["subset", "overview_spec", "group_heading", "view_spec", "group_label", "group_hover", "Heap"]

MAP, OVERVIEW, GROUP, SEGMENT = "map", "overview", "group", "segment"


class MapView(NamedTuple):
    """A drill-down level: ``MAP`` (every segment: few of them), ``OVERVIEW``, ``GROUP`` (the
    segments of group ``group``) or ``SEGMENT`` (the segment at ``base``, in group ``group``)."""

    level: str = OVERVIEW
    group: str = ""
    base: int = -1


Heap = HeapState | HeapColumns
"""A heap as objects or as arrays: the overview and a group of many segments are drawn from the
arrays (``HeapColumns``) without a Python object per chunk; a group's or a segment's map turns
only its own segments into objects."""


def _count(heap: Heap) -> int:
    return len(heap.bases) if isinstance(heap, HeapColumns) else len(heap.segments)


def _base(heap: Heap, row: int) -> int:
    return int(heap.bases[row]) if isinstance(heap, HeapColumns) else heap.segments[row].base


def heap_groups(heap: Heap) -> list[SegmentGroup]:
    """The overview's groups of ``heap``'s segments (``overview.segment_groups``, rows by address)."""
    if isinstance(heap, HeapColumns):
        return segment_groups(heap.sizes.tolist(), column_in_use(heap), column_lanes(heap))
    in_use = [sum(c.size for c in s.chunks if c.in_use) for s in heap.segments]
    return segment_groups([s.size for s in heap.segments], in_use, state_lanes(heap))


def has_overview(heap: Heap) -> bool:
    """Whether ``heap``'s map opens as the overview (more than ``OVERVIEW_ABOVE`` segments)."""
    return _count(heap) > OVERVIEW_ABOVE


def resolve_view(heap: Heap, view: MapView, groups: Sequence[SegmentGroup] | None = None) -> MapView:
    """``view`` as far as ``heap`` has it: a segment that is gone falls back to its group, a
    group that is gone (or a heap of few segments) to the overview (or ``MAP``)."""
    if not has_overview(heap):
        return MapView(MAP)
    groups = heap_groups(heap) if groups is None else groups
    names = {g.name: g for g in groups}
    found = names.get(view.group)
    if view.level == SEGMENT and found is not None and any(_base(heap, r) == view.base for r in found.rows):
        return view
    if view.level in (GROUP, SEGMENT) and view.group in names:
        return MapView(GROUP, view.group)
    return MapView(OVERVIEW)


def subset(heap: Heap, rows: Sequence[int]) -> HeapState:
    """``heap`` with only the segments at ``rows`` (kept by address), as objects."""
    if isinstance(heap, HeapColumns):
        return heap.subset(rows).to_state()
    return HeapState(heap.device, tuple(heap.segments[r] for r in sorted(rows)))


def group_label(group: SegmentGroup) -> str:
    """An overview row's label: the group and its segment count."""
    count = len(group.rows)
    return f"{group.name} · {count} segment{'' if count == 1 else 's'}"


def group_hover(group: SegmentGroup) -> str:
    """An overview row's hover: its segments and totals (the same words as the report's)."""
    return (
        f"<b>{len(group.rows)} segments of {html.escape(group.name)}</b><br>reserved {format_size(group.reserved)}"
        f"<br>in use {format_size(group.in_use)}<br>unused {format_size(group.reserved - group.in_use)}"
        "<br>click: its segments"
    )


def group_heading(group: SegmentGroup) -> str:
    """What a group's map says it shows, e.g. ``542 segments of 16 MiB–32 MiB``."""  # noqa: RUF002
    what = "segment" if len(group.rows) == 1 else "segments"
    return f"{len(group.rows)} {what} of {group.name}"


def overview_spec(
    heap: Heap, *, title: str | None = None, groups: Sequence[SegmentGroup] | None = None
) -> dict[str, Any]:
    """The overview figure of ``heap`` (plain dicts): one row per group, its bytes in use and
    reserved but unused (bytes on x), hover with its totals; ``layout.meta`` names the rows."""
    groups = heap_groups(heap) if groups is None else list(groups)
    rows = list(range(len(groups)))
    hover = [group_hover(g) for g in groups]
    used = [g.in_use for g in groups]

    def bar(name: str, color: str, values: list[int], base: list[int]) -> dict[str, Any]:
        marker = {"color": color, "line": {"width": 0.5, "color": "white"}}
        return {"type": "bar", "orientation": "h", "name": name, "y": rows, "x": values, "base": base,
                "hovertext": hover, "hoverinfo": "text", "marker": marker}  # fmt: skip

    top = max([g.reserved for g in groups] + [1])
    heading = html.escape(title or heap.device) + " · overview by segment size (click a row)"
    metric = metric_words(heap.bytes_in_use, heap.pool_bytes, heap.largest_free_chunk)
    layout: dict[str, Any] = {
        "title": {"text": f"{heading}<br><sub>{metric}</sub>"},
        "barmode": "overlay",
        "height": min(900, 200 + 36 * len(groups)),
        "hovermode": "closest",
        "xaxis": {"title": {"text": "bytes"}, **size_ticks(top), "range": [0, top * 1.02]},
        "yaxis": {
            "title": {"text": "segment size"},
            "tickvals": rows,
            "ticktext": [group_label(g) for g in groups],
            "range": [len(groups) - 0.5, -0.5],
            "type": "linear",
            "automargin": True,
        },
        "legend": {"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom"},
        "margin": {"l": 160, "r": 20, "t": 80, "b": 80},
        "uirevision": f"overview:{heap.device}",
        "meta": {"view": OVERVIEW, "groups": [g.name for g in groups]},
    }
    data = [bar("in use", COLORS["used"], used, [0] * len(groups)),
            bar("reserved, unused", COLORS["free"], [g.reserved - g.in_use for g in groups], used)]  # fmt: skip
    return {"data": data, "layout": layout}


def _pinning_within(state: HeapState, pinning: Pinning | None) -> Pinning | None:
    """``pinning`` where ``state`` holds the segments it draws in, else None."""
    if pinning is None:
        return None
    bases = {s.base for s in state.segments}
    hole = pinning.largest_hole_address
    if hole >= 0 and not any(s.base <= hole < s.end for s in state.segments):
        return None
    if pinning.best is not None and pinning.best.segment not in bases:
        return None
    return pinning


def _map_spec(
    state: HeapState, heading: str, *, color_by: str, max_rectangles: int, stacks: Sequence[tuple[Frame, ...]] | None,
    pinning: Pinning | None, allocated: Allocated | None,
) -> dict[str, Any]:  # fmt: skip
    pinned = _pinning_within(state, pinning)
    data = trace_specs(state, color_by=color_by, max_rectangles=max_rectangles, stacks=stacks, pinning=pinned,
                       allocated=allocated)  # fmt: skip
    return {"data": data, "layout": map_layout(state, title=heading, pinning=pinned)}


def _dense_spec(
    heap: Heap, group: SegmentGroup, heading: str, stacks: Sequence[tuple[Frame, ...]] | None
) -> dict[str, Any]:
    """A group of more than ``DENSE_ROWS`` segments as an image (``densegroup``)."""
    if isinstance(heap, HeapColumns):
        columns = heap.subset(group.rows)
    else:
        columns = HeapColumns.from_state(subset(heap, group.rows))
    lanes = set(column_lanes(heap) if isinstance(heap, HeapColumns) else state_lanes(heap))
    inside = [i for i, r in enumerate(group.rows) if r in lanes]
    return dense_group_spec(columns, heading=heading, site_of=lambda stack: call_site(stacks, stack), lanes=inside)


def view_spec(
    heap: Heap,
    view: MapView,
    *,
    title: str | None = None,
    color_by: str = "state",
    max_rectangles: int = 20_000,
    stacks: Sequence[tuple[Frame, ...]] | None = None,
    pinning: Pinning | None = None,
    allocated: Allocated | None = None,
    groups: Sequence[SegmentGroup] | None = None,
) -> tuple[dict[str, Any], MapView]:
    """The figure (plain dicts) of ``heap`` at drill-down level ``view`` (``resolve_view``:
    the level it could draw, returned beside it): the whole map (few segments), the overview,
    a group's segments or one segment, chunks drawn by ``fragmentation.trace_specs`` (hover:
    allocation, call site from ``stacks``, time from ``allocated``; ``pinning`` drawn where its
    segments are shown). A group of more than ``overview.DENSE_ROWS`` segments is drawn as an
    image of at most ``densegroup.IMAGE_ROWS`` rows (``densegroup.dense_group_spec``; no
    pinning drawn on it). ``groups``: ``heap_groups(heap)`` when the caller has them."""
    groups = (heap_groups(heap) if groups is None else list(groups)) if has_overview(heap) else []
    shown = resolve_view(heap, view, groups)
    heading = title or heap.device
    options: dict[str, Any] = {"color_by": color_by, "max_rectangles": max_rectangles, "stacks": stacks,
                               "pinning": pinning, "allocated": allocated}  # fmt: skip
    if shown.level == MAP:
        state = heap.to_state() if isinstance(heap, HeapColumns) else heap
        spec = _map_spec(state, heading, **options)
        spec["layout"]["meta"] = {"view": MAP, "bases": [s.base for s in state.segments],
                                  "sizes": [s.size for s in state.segments]}  # fmt: skip
        return spec, shown
    if shown.level == OVERVIEW:
        return overview_spec(heap, title=heading, groups=groups), shown
    group = next(g for g in groups if g.name == shown.group)
    if shown.level == GROUP and len(group.rows) > DENSE_ROWS:
        spec = _dense_spec(heap, group, f"{heading} · {group_heading(group)}", stacks)
        spec["layout"]["meta"].update(view=GROUP, group=group.name)
    else:
        if shown.level == GROUP:
            part = subset(heap, group.rows)
            spec = _map_spec(part, f"{heading} · {group_heading(group)}", **options)
        else:
            part = subset(heap, [next(r for r in group.rows if _base(heap, r) == shown.base)])
            spec = _map_spec(part, f"{heading} · segment {shown.base:#x}", **options)
        spec["layout"]["meta"] = {"view": shown.level, "group": group.name,
                                  "bases": [s.base for s in part.segments],
                                  "sizes": [s.size for s in part.segments]}  # fmt: skip
    spec["layout"]["uirevision"] = f"{shown.level}:{heap.device}:{group.name}:{shown.base}"
    return spec, shown
