"""The fragmentation map at scale: how many row labels fit, the overview of many segments by
size class (with totals) and the lane of inferred preexisting memory.

A map of more than ``OVERVIEW_ABOVE`` segments opens, in the report, as an *overview*: one row
per size class of segment (``segment_groups``: segments of up to 2 MiB, then each power-of-two
range of sizes), each drawn as its bytes in use and reserved but unused, its hover naming its
segment count and totals; a click on a class draws that class's segments (drill-down to a
group), a click on a segment draws that segment alone. The page does this (``OVERVIEW_JS``)
from each map's ``layout.meta`` (``map_meta``: every row's base, size and bytes in use, and the
lanes), so the cost is that of what is drawn: one bar per class, or the chunks of the rows shown.

Whatever the number of rows, a map labels at most ``MAX_LABELS`` of them (``labelled_rows``:
every k-th, and every lane): plotly measures each label, and a thousand of them cost seconds.

A *lane* is a segment the importer inferred to hold memory in use before the trace began (one
``PREEXISTING`` allocation filling a segment of its own, its addresses unknown): it keeps its
row, labelled as inferred with its size, but the x axis is scaled to the other segments, so
gigabytes of inferred memory do not squash the traced segments into slivers (a scale break).
"""

from __future__ import annotations

# ruff: noqa: RUF001
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from gpuviz.analysis.heapcolumns import HeapColumns
from gpuviz.base.heapstate import HeapState
from gpuviz.base.units import format_size
from gpuviz.views.mapstyle import COLORS, label

__all__ = ["MAX_LABELS", "OVERVIEW_ABOVE", "PREEXISTING", "labelled_rows", "size_class", "SegmentGroup"]
__all__ += ["segment_groups", "lane_label", "row_ticks", "map_meta", "OVERVIEW_JS", "state_lanes", "column_lanes"]
__all__ += ["column_in_use", "column_groups", "array_groups", "DETAIL_ROWS", "DENSE_ROWS", "top_allocations"]

MAX_LABELS = 40
"""The most y-axis labels a map draws (about one per 20 px of its tallest height, 900 px)."""
OVERVIEW_ABOVE = 64
"""Above this many segments the report's map opens as the overview by size class."""
DETAIL_ROWS = 50_000
"""The most segment rows a report's scrubber embeds in all (its stops' drill-down detail, nearest
the opening moment first); the other stops of a map above ``OVERVIEW_ABOVE`` segments carry the
overview's totals only (``column_groups``), so the report's size follows what it can draw."""
DENSE_ROWS = 1000
"""Above this many segments a drill-down group is drawn as an image (a heatmap, one row per
segment) instead of a rectangle per bar; its hover still names each segment's largest allocation."""
DENSE_COLUMNS = 48
"""Cells across a dense group's image (each the share of its bytes in use)."""
PREEXISTING = "PREEXISTING"
"""The tag of memory an importer inferred to be in use before the trace began."""
_SMALL = 2 << 20  # segments up to 2 MiB: one class (PyTorch's small pool)


def labelled_rows(rows: int, lanes: Sequence[int] = ()) -> list[int]:
    """The rows (of ``rows``) that get a label: every k-th from the first, k the smallest step
    that keeps them within ``MAX_LABELS``, and every lane (always named)."""
    step = max(1, math.ceil(rows / MAX_LABELS))
    return sorted(set(range(0, rows, step)) | {r for r in lanes if 0 <= r < rows})


def lane_label(size: int) -> str:
    """The row label of an inferred preexisting segment of ``size`` bytes."""
    return f"{PREEXISTING} (inferred) {format_size(size)}"


def row_ticks(bases: Sequence[int], sizes: Sequence[int], lanes: Sequence[int] = ()) -> tuple[list[int], list[str]]:
    """``(tickvals, ticktext)`` of a map's numbered rows: ``labelled_rows``, by address or, for a
    lane, ``lane_label``."""
    rows = labelled_rows(len(bases), lanes)
    lane_set = set(lanes)
    return rows, [lane_label(sizes[r]) if r in lane_set else label(bases[r]) for r in rows]


def size_class(size: int) -> tuple[int, str]:
    """``(key, name)`` of a segment of ``size`` bytes: up to 2 MiB one class, then each range
    ``(2**(k-1), 2**k]``."""
    k = _class_key(size)
    if not k:
        return 0, f"≤ {format_size(_SMALL)}"
    return k, f"{format_size(1 << (k - 1))}–{format_size(1 << k)}"


def _class_key(size: int) -> int:
    """``size_class``'s key alone."""
    return 0 if size <= _SMALL else (size - 1).bit_length()


class SegmentGroup(NamedTuple):
    """One row of the overview: ``rows`` (the map's rows, by address), their bytes reserved and in use."""

    name: str
    rows: list[int]
    reserved: int
    in_use: int


def segment_groups(sizes: Sequence[int], in_use: Sequence[int], lanes: Sequence[int] = ()) -> list[SegmentGroup]:
    """The overview's groups of a map's rows: the lanes first (one group, ``PREEXISTING
    (inferred)``), then one per ``size_class``, smallest first, each with its totals (bytes)."""
    lane_set = set(lanes)
    classes: dict[int, tuple[str, list[int]]] = {}
    for row, size in enumerate(sizes):
        if row in lane_set:
            continue
        key = _class_key(size)
        found = classes.get(key)
        if found is None:  # each class named once
            found = classes[key] = (size_class(size)[1], [])
        found[1].append(row)
    groups = []
    if lane_set:
        rows = sorted(lane_set)
        groups.append(SegmentGroup(f"{PREEXISTING} (inferred)", rows, sum(sizes[r] for r in rows),
                                   sum(in_use[r] for r in rows)))  # fmt: skip
    for key in sorted(classes):
        name, rows = classes[key]
        groups.append(SegmentGroup(name, rows, sum(sizes[r] for r in rows), sum(in_use[r] for r in rows)))
    return groups


def map_meta(bases: Sequence[int], sizes: Sequence[int], in_use: Sequence[int], lanes: Sequence[int]) -> dict[str, Any]:
    """A lean map's ``layout.meta``: every row's base, size and bytes in use, and the lanes (what
    the page's hover, overview and drill-down read)."""
    return {"bases": list(bases), "sizes": list(sizes), "inUse": list(in_use), "lanes": list(lanes)}


OVERVIEW_JS = (
    """
function gpuvizLabelled(rows, lanes) {
  // gpuviz.views.overview.labelled_rows
  var step = Math.max(1, Math.ceil(rows / MAX_LABELS)), out = [];
  for (var r = 0; r < rows; r += step) { out.push(r); }
  lanes.forEach(function (r) { if (r >= 0 && r < rows && out.indexOf(r) < 0) { out.push(r); } });
  return out.sort(function (a, b) { return a - b; });
}
function gpuvizRowTicks(bases, sizes, lanes) {
  // gpuviz.views.overview.row_ticks
  var rows = gpuvizLabelled(bases.length, lanes);
  return {tickvals: rows, ticktext: rows.map(function (r) {
    return lanes.indexOf(r) >= 0 ? 'PREEXISTING (inferred) ' + gpuvizSize(sizes[r]) : '0x' + bases[r].toString(16);
  })};
}
function gpuvizSizeClass(size) {
  // gpuviz.views.overview.size_class
  if (size <= SMALL) { return [0, '\\u2264 ' + gpuvizSize(SMALL)]; }
  var k = 0; while (Math.pow(2, k) < size) { k += 1; }
  return [k, gpuvizSize(Math.pow(2, k - 1)) + '\\u2013' + gpuvizSize(Math.pow(2, k))];
}
function gpuvizGroups(meta) {
  // gpuviz.views.overview.segment_groups: [{name, rows, reserved, inUse}]
  var classes = {}, keys = [], groups = [], lanes = meta.lanes || [];
  meta.sizes.forEach(function (size, row) {
    if (lanes.indexOf(row) >= 0) { return; }
    var c = gpuvizSizeClass(size);
    if (!classes[c[0]]) { classes[c[0]] = {name: c[1], rows: []}; keys.push(c[0]); }
    classes[c[0]].rows.push(row);
  });
  function group(name, rows) {
    var reserved = 0, inUse = 0;
    rows.forEach(function (r) { reserved += meta.sizes[r]; inUse += meta.inUse[r]; });
    return {name: name, rows: rows, reserved: reserved, inUse: inUse};
  }
  var byNumber = function (a, b) { return a - b; };
  if (lanes.length) { groups.push(group('PREEXISTING (inferred)', lanes.slice().sort(byNumber))); }
  keys.sort(byNumber).forEach(function (k) { groups.push(group(classes[k].name, classes[k].rows)); });
  return groups;
}
function gpuvizCount(g) { return g.rows ? g.rows.length : g.count; }
function gpuvizOverview(frame) {
  // the overview figure of a map with many segments: one row per group, in use and unused bytes
  // (groups: the frame's own totals where the report embeds no segments at this stop)
  var meta = frame.layout.meta, groups = meta.groups || gpuvizGroups(meta);
  var names = groups.map(function (g) {
    return g.name + ' \u00b7 ' + gpuvizCount(g) + ' segment' + (gpuvizCount(g) === 1 ? '' : 's');
  });
  var click = meta.bases || meta.lazy ? '<br>click: its segments' : '';
  var hover = groups.map(function (g) {
    return '<b>' + gpuvizCount(g) + ' segments of ' + g.name + '</b><br>reserved ' + gpuvizSize(g.reserved) +
      '<br>in use ' + gpuvizSize(g.inUse) + '<br>unused ' + gpuvizSize(g.reserved - g.inUse) + click;
  });
  var rows = groups.map(function (g, i) { return i; });
  function bar(name, color, values, base) {
    return {type: 'bar', orientation: 'h', name: name, y: rows, x: values, base: base, hovertext: hover,
            hoverinfo: 'text', marker: {color: color, line: {width: 0.5, color: 'white'}}};
  }
  var used = groups.map(function (g) { return g.inUse; });
  var data = [bar('in use', COLORS.used, used, groups.map(function () { return 0; })),
              bar('reserved, unused', COLORS.free, groups.map(function (g) { return g.reserved - g.inUse; }), used)];
  var how = meta.bases || meta.lazy ? ' (click a row)' :
    ' (totals only at this stop: segments at the stops nearest the opening)';
  var layout = {
    title: {text: frame.layout.title.text.replace('<br>', ' \u00b7 overview by segment size' + how + '<br>')},
    barmode: 'overlay', height: Math.min(900, 200 + 36 * groups.length), hovermode: 'closest',
    xaxis: {title: {text: 'bytes'}}, yaxis: {title: {text: 'segment size'}, tickvals: rows, ticktext: names,
      range: [groups.length - 0.5, -0.5], type: 'linear', automargin: true},
    legend: {orientation: 'h', yref: 'container', y: 0, yanchor: 'bottom'}, margin: {l: 160, r: 20, t: 80, b: 80},
    meta: {overview: meta.bases || meta.lazy ? groups : []}
  };
  var top = Math.max.apply(null, groups.map(function (g) { return g.reserved; }).concat([1])), tick = 1, values = [];
  while (tick * 2 <= top / 5) { tick *= 2; }
  for (var v = 0; v <= top; v += tick) { values.push(v); }
  layout.xaxis.tickvals = values; layout.xaxis.ticktext = values.map(gpuvizSize); layout.xaxis.range = [0, top * 1.02];
  return {data: data, layout: layout};
}
function gpuvizTopWords(meta, r) {
  // a segment's largest allocation (gpuviz.views.overview.top_allocations), for hovers
  var t = (meta.top || [])[r], s = meta.strings || [];
  if (!t || t[0] < 0) { return 'no allocation in use'; }
  return 'largest allocation <b>' + gpuvizEscape(s[t[0]]) + '</b> ' + gpuvizSize(t[2]) +
    (t[1] >= 0 ? '<br>call site ' + gpuvizEscape(s[t[1]]) : '');
}
function gpuvizDense(frame, rows, layout) {
  // many segments: an image (heatmap), one row per segment, COLUMNS cells over the x axis, each
  // the share of its bytes in use (in use drawn from the segment's start, as the aggregated bars);
  // the hover names the segment's largest allocation and its call site
  var meta = frame.layout.meta, widest = layout.xaxis.range[1], width = widest / DENSE_COLUMNS;
  var x = [], z = [], text = [];
  for (var j = 0; j < DENSE_COLUMNS; j++) { x.push((j + 0.5) * width); }
  rows.forEach(function (r) {
    var size = meta.sizes[r], used = meta.inUse[r], line = [];
    for (var j = 0; j < DENSE_COLUMNS; j++) {
      var lo = j * width, hi = Math.min(lo + width, size);
      line.push(lo >= size ? null : Math.max(0, Math.min(used, hi) - lo) / (hi - lo));
    }
    z.push(line);
    var words = '<b>segment 0x' + meta.bases[r].toString(16) + '</b> ' + gpuvizSize(size) + ', in use ' +
      gpuvizSize(used) + '<br>' + gpuvizTopWords(meta, r);
    text.push(new Array(DENSE_COLUMNS).fill(words));
  });
  return [{type: 'heatmap', name: 'segments', x: x, y: rows.map(function (r, i) { return i; }), z: z, text: text,
           hovertemplate: '%{text}<extra></extra>', zmin: 0, zmax: 1, showscale: false, xgap: 0, ygap: 0,
           colorscale: [[0, COLORS.free], [1, COLORS.used]]}];
}
function gpuvizSubset(frame, rows, heading) {
  // the map of `frame` restricted to `rows` (renumbered by address), labels capped
  var meta = frame.layout.meta, index = new Map(), lanes = [];
  rows.forEach(function (r, i) { index.set(r, i); if ((meta.lanes || []).indexOf(r) >= 0) { lanes.push(i); } });
  var dense = rows.length > DENSE_ROWS;
  var data = dense ? [] : frame.data.map(function (t) {
    var out = Object.assign({}, t), keep = [];
    (t.y || []).forEach(function (y, i) { if (index.has(y)) { keep.push(i); } });
    ['base', 'x', 'customdata', 'hovertext'].forEach(function (k) {
      if (Array.isArray(t[k])) { out[k] = keep.map(function (i) { return t[k][i]; }); }
    });
    if (meta.top && Array.isArray(t.customdata) && !t.meta) {  // aggregated bars: name the largest allocation
      out.hovertext = keep.map(function (i) {
        var c = t.customdata[i];
        return c[1] + ' chunks from 0x' + c[0].toString(16) + ', ' + gpuvizSize(c[2]) + ' ' + t.name + '<br>' +
          gpuvizTopWords(meta, t.y[i]);
      });
      out.hovertemplate = '%{hovertext}<extra></extra>';
    }
    out.y = keep.map(function (i) { return index.get(t.y[i]); });
    return out;
  });
  var bases = rows.map(function (r) { return meta.bases[r]; });
  var sizes = rows.map(function (r) { return meta.sizes[r]; });
  var layout = JSON.parse(JSON.stringify(frame.layout)), widest = 0;
  sizes.forEach(function (s, i) { if (lanes.indexOf(i) < 0) { widest = Math.max(widest, s); } });
  if (!widest) { widest = Math.max.apply(null, sizes.concat([1])); }
  layout.yaxis = Object.assign(layout.yaxis, gpuvizRowTicks(bases, sizes, lanes),
    {range: [rows.length - 0.5 + (layout.yaxis.range[0] - Math.floor(layout.yaxis.range[0]) - 0.5), -0.5]});
  layout.meta = {bases: bases, sizes: sizes, inUse: rows.map(function (r) { return meta.inUse[r]; }), lanes: lanes,
                 rows: rows};
  layout.height = Math.min(900, 180 + 28 * rows.length);
  if (!layout.xaxis.range || layout.xaxis.range[1] > widest || rows.length === 1) { layout.xaxis.range = [0, widest]; }
  layout.title = {text: layout.title.text.replace('<br>', ' \\u00b7 ' + gpuvizEscape(heading) + '<br>')};
  layout.uirevision = 'map:' + heading;
  if (dense) { data = gpuvizDense(frame, rows, layout); layout.meta.dense = true; layout.yaxis.ticks = ''; }
  return {data: data, layout: layout};
}
function gpuvizMapView(frame, view) {
  // what the map shows of `frame` at drill-down level `view` ({level, group, base}):
  // the whole map (few segments), the overview, one group's segments or one segment
  var meta = frame.layout.meta;
  if (meta && meta.groups) { view.level = 'overview'; return gpuvizOverview(frame); }  // totals only
  if (!meta || !meta.bases || meta.bases.length <= OVERVIEW_ABOVE) { view.level = 'map'; return frame; }
  if (view.level === 'segment') {
    var row = meta.bases.indexOf(view.base);
    if (row >= 0) { return gpuvizSubset(frame, [row], 'segment 0x' + view.base.toString(16)); }
    view.level = 'group';
  }
  if (view.level === 'group') {
    var groups = gpuvizGroups(meta), g = groups.filter(function (x) { return x.name === view.group; })[0];
    if (g) {
      var what = g.rows.length === 1 ? ' segment of ' : ' segments of ';
      return gpuvizSubset(frame, g.rows, g.rows.length + what + g.name);
    }
  }
  view.level = 'overview';
  return gpuvizOverview(frame);
}
""".replace("MAX_LABELS", str(MAX_LABELS))
    .replace("OVERVIEW_ABOVE", str(OVERVIEW_ABOVE))
    .replace("DENSE_ROWS", str(DENSE_ROWS))
    .replace("DENSE_COLUMNS", str(DENSE_COLUMNS))
    .replace("SMALL", str(_SMALL))
    .replace("COLORS.used", repr(COLORS["used"]))
    .replace("COLORS.free", repr(COLORS["free"]))
)
"""The page's side: ``gpuvizMapView`` draws a map frame as the overview, a group or one segment
(uses ``gpuvizSize`` and ``gpuvizEscape`` of the report's script)."""


def state_lanes(state: HeapState) -> list[int]:
    """The rows of ``state``'s map that are lanes: a segment filled by one ``PREEXISTING`` chunk
    (memory an importer inferred, addresses unknown), when other segments exist beside it."""
    if len(state.segments) < 2:
        return []
    return [
        i
        for i, seg in enumerate(state.segments)
        if len(seg.chunks) == 1 and seg.chunks[0].in_use and seg.chunks[0].tag == PREEXISTING
    ]


def column_lanes(heap: HeapColumns) -> list[int]:
    """``state_lanes`` of a heap given as arrays."""
    if len(heap.bases) < 2 or PREEXISTING not in heap.strings:
        return []
    tag = list(heap.strings).index(PREEXISTING)
    counts = np.bincount(heap.owner, minlength=len(heap.bases))
    alone = np.flatnonzero(counts == 1)
    first = np.searchsorted(heap.owner, alone)
    keep = heap.in_use[first] & (heap.tag[first] == tag)
    return [int(r) for r in alone[keep]]


def column_in_use(heap: HeapColumns) -> list[int]:
    """Bytes in use (chunk sizes) of each segment of ``heap``."""
    weights = np.where(heap.in_use, heap.size, 0)
    return [int(b) for b in np.bincount(heap.owner, weights=weights, minlength=len(heap.bases))]


def column_groups(heap: HeapColumns, lanes: Sequence[int] = ()) -> list[dict[str, Any]]:
    """``segment_groups`` of a heap given as arrays, as the page's overview reads them:
    ``{"name", "count", "reserved", "inUse"}`` per group (bytes), lanes first, then by size class."""
    used = np.bincount(heap.owner, weights=np.where(heap.in_use, heap.size, 0), minlength=len(heap.sizes))
    return array_groups(heap.sizes, np.rint(used).astype(np.int64), lanes)


def array_groups(
    sizes: np.ndarray, in_use: np.ndarray, lanes: Sequence[int] = (), *, rows: bool = False
) -> list[dict[str, Any]]:
    """``segment_groups`` from per-segment arrays (bytes): ``{"name", "count", "reserved",
    "inUse"}`` per group, and its ``rows`` when ``rows``."""
    sizes, in_use = np.asarray(sizes, dtype=np.int64), np.asarray(in_use, dtype=np.int64)
    # size_class's key: 0 up to 2 MiB, else (size - 1).bit_length() (exact below 2**53 bytes)
    keys = np.where(sizes <= _SMALL, 0, np.frexp(np.maximum(sizes - 1, 1).astype(np.float64))[1])
    lane = np.zeros(len(sizes), dtype=bool)
    lane[list(lanes)] = True
    picks = [(f"{PREEXISTING} (inferred)", lane)] if lane.any() else []
    for key in np.unique(keys[~lane]).tolist():
        picks.append((size_class(1 if key == 0 else 1 << (int(key) - 1) | 1)[1], (keys == key) & ~lane))
    groups = []
    for name, pick in picks:
        group: dict[str, Any] = {"name": name, "count": int(pick.sum()), "reserved": int(sizes[pick].sum()),
                                 "inUse": int(in_use[pick].sum())}  # fmt: skip
        if rows:
            group["rows"] = np.flatnonzero(pick).tolist()
        groups.append(group)
    return groups


def top_allocations(heap: HeapColumns, site_of: Any) -> dict[str, list[Any]]:
    """Per segment of ``heap``, its largest allocation in use (the lowest-addressed of equals;
    what a dense map's hover names):
    ``top``: ``[tag, site, bytes]`` per row (indices into ``strings``, -1 none; bytes 0 when the
    segment holds none). ``site_of(stack)``: the call site of a stack id, or None."""
    rows = len(heap.bases)
    picked = np.flatnonzero(heap.in_use)  # by address: their owners ascending
    owners, sizes = heap.owner[picked], heap.size[picked]
    starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]]) if len(picked) else picked
    largest = np.maximum.reduceat(sizes, starts) if len(picked) else sizes
    # the first (lowest-addressed) chunk of each segment whose size is its segment's largest
    ties = picked[sizes == np.repeat(largest, np.diff(np.r_[starts, len(picked)]))]
    last = ties[np.r_[True, heap.owner[ties][1:] != heap.owner[ties][:-1]]] if len(ties) else ties
    tag = np.full(rows, -1, dtype=np.int64)
    site = np.full(rows, -1, dtype=np.int64)
    size = np.zeros(rows, dtype=np.int64)
    owner = heap.owner[last]
    size[owner] = heap.size[last]
    # strings numbered in order of first use: the distinct tags, then the distinct call sites
    tags, tag_of = np.unique(heap.tag[last], return_inverse=True)
    stacks, stack_of = np.unique(heap.stack[last], return_inverse=True)
    strings: dict[str, int] = {}
    tag_ids = [strings.setdefault(heap.strings[t] if t >= 0 else "(untagged)", len(strings)) for t in tags.tolist()]
    found = [site_of(k) for k in stacks.tolist()]
    site_ids = [strings.setdefault(w, len(strings)) if w is not None else -1 for w in found]
    if len(last):
        tag[owner] = np.asarray(tag_ids, dtype=np.int64)[tag_of.reshape(-1)]
        site[owner] = np.asarray(site_ids, dtype=np.int64)[stack_of.reshape(-1)]
    return {"strings": list(strings), "top": np.stack((tag, site, size), axis=1).tolist()}
