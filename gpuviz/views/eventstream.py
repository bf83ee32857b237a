"""The report's event stream: one device's heap events around the moment the report opens at,
packed compactly, so that the page steps event by event with the arrow keys.

The report embeds precomputed map frames only at its scrubber's stops. Between them, the
page's script (``STEPPER_JS``) applies the stream's events, in the same rules as replay
(``gpuviz.analysis.replay``), to the heap just before the stream's first event and draws the
map of the state it reaches, as ``trace_specs(lean=True)`` and ``map_layout(lean=True)``
would (tests compare the two in Chromium, event by event).

Wire format (``FORMAT``, version ``VERSION``), one JSON object per device:

- ``columns``: the events, one entry per name of ``EVENT_COLUMNS``: ``{"type": <JS typed array
  name>, "data": <base64 of the little-endian values>}``. ``position``: log position;
  ``kind``: ``Kind`` code (``kinds`` names them); ``address``, ``size``, ``requested``: bytes;
  ``tag``: index into ``tags`` (-1 none); ``site``: index into ``sites`` (-1 none);
  ``ns``: time from the log's start in ns; ``settled``: 1 when the event ends a public
  operation (``timeline.operation_ends``), the events the arrow keys stop at.
- ``chunks`` (``CHUNK_COLUMNS``) and ``segments`` (``SEGMENT_COLUMNS``): the heap just before
  the first event; ``event``/``ns``: when a live chunk was allocated (-1 unknown).
- ``tags``: ``[hover text, trace name]`` per tag; ``sites``: call sites; ``peak``, ``t0``-relative
  times, the map's constants (colors, zoom rule, rectangle cap) and the device's name.

Byte counts travel as float64 (exact below 2**53 bytes). Size is bounded: at most
``EVENT_WINDOW`` heap events per device, centred on the opening moment (first OOM, else
the peak); outside the window the arrow keys move stop by stop.
"""

from __future__ import annotations

import base64
import html
from typing import Any

import numpy as np

from gpuviz.analysis.profile import Profile
from gpuviz.analysis.replay import HEAP_KINDS, heap_mask
from gpuviz.analysis.tables import alive_at
from gpuviz.analysis.timeline import times_inferred
from gpuviz.log.schema import Kind
from gpuviz.views.buckets import LEAN_AGGREGATED
from gpuviz.views.fragmentation import _group as group_name
from gpuviz.views.fragmentation import call_site
from gpuviz.views.mapstyle import COLORS, MIN_WIDTH, OOM_COLORS, PALETTE, ZOOM_BELOW

__all__ = ["FORMAT", "VERSION", "EVENT_WINDOW", "EVENT_COLUMNS", "CHUNK_COLUMNS", "SEGMENT_COLUMNS"]
__all__ += ["event_stream", "encode_columns", "decode_columns", "STEPPER_JS", "STEPPER_TRACE_TYPES"]

FORMAT = "gpuviz.events"
VERSION = 1
EVENT_WINDOW = 4000
"""The most heap events of one device a report embeds for stepping (about 60 bytes each)."""

_TYPES = {"Int32Array": "<i4", "Uint8Array": "u1", "Float64Array": "<f8"}
EVENT_COLUMNS: dict[str, str] = {
    "position": "Int32Array", "kind": "Uint8Array", "address": "Float64Array", "size": "Float64Array",
    "requested": "Float64Array", "tag": "Int32Array", "site": "Int32Array", "ns": "Float64Array",
    "settled": "Uint8Array",
}  # fmt: skip
CHUNK_COLUMNS: dict[str, str] = {
    "address": "Float64Array", "size": "Float64Array", "requested": "Float64Array", "tag": "Int32Array",
    "site": "Int32Array", "event": "Int32Array", "ns": "Float64Array",
}  # fmt: skip
SEGMENT_COLUMNS: dict[str, str] = {"base": "Float64Array", "size": "Float64Array"}


def encode_columns(spec: dict[str, str], values: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each column of ``values`` as ``{"type": <JS typed array name>, "data": <base64>}``, typed as
    ``spec`` names them (``Int32Array``, ``Uint8Array``, ``Float64Array``; little-endian)."""
    out = {}
    for name, js_type in spec.items():
        data = np.ascontiguousarray(np.asarray(values[name]), dtype=_TYPES[js_type]).tobytes()
        out[name] = {"type": js_type, "data": base64.b64encode(data).decode("ascii")}
    return out


def decode_columns(encoded: dict[str, dict[str, str]]) -> dict[str, np.ndarray]:
    """The columns of a stream's ``columns``/``chunks``/``segments`` as NumPy arrays."""
    return {name: np.frombuffer(base64.b64decode(c["data"]), dtype=_TYPES[c["type"]]) for name, c in encoded.items()}


class _Table:
    """Strings numbered in order of first use."""

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}

    def id(self, value: Any) -> int:
        return self.ids.setdefault(value, len(self.ids))


def event_stream(p: Profile, device: str, *, max_rectangles: int, window: int | None = None) -> dict[str, Any]:
    """``device``'s stream (see the module's docstring): its heap events, at most ``window``
    (default ``EVENT_WINDOW``) of them around ``DeviceProfile.opening``; ``max_rectangles`` as
    for its scrubber's frames."""
    window = EVENT_WINDOW if window is None else window
    if window < 1:
        raise ValueError(f"window must be at least 1 event, got {window}")
    log, dp = p.log, p.devices[device]
    cols = log.columns
    heap = np.flatnonzero((cols["device"] == log.device_index(device)) & heap_mask(cols["kind"]))
    centre = int(np.searchsorted(heap, dp.opening)) if dp.opening >= 0 else len(heap)
    lo = max(0, min(centre - window // 2, len(heap) - window))
    positions = heap[lo : lo + window]
    series = dp.series
    settled = series.settled[np.searchsorted(series.index, positions)]
    tags, sites = _Table(), _Table()
    color_by = p.options.color_by

    def tag_id(text: str | None) -> int:  # [hover text, trace name], as trace_specs words them
        group = "used" if color_by == "state" else html.escape(group_name(text, color_by))
        return tags.id((text or "(untagged)", group))

    def site_id(stack: int) -> int:
        site = call_site(log.stacks, stack)
        return sites.id(site) if site is not None else -1

    kinds = cols["kind"][positions]
    alloc = kinds == Kind.ALLOC
    tag_col = np.full(len(positions), -1, dtype=np.int32)
    site_col = np.full(len(positions), -1, dtype=np.int32)
    for i in np.flatnonzero(alloc).tolist():
        at = int(positions[i])
        tag = int(cols["tag"][at])
        tag_col[i] = tag_id(log.strings[tag] if tag >= 0 else None)
        site_col[i] = site_id(int(cols["stack"][at]))
    before = int(positions[0]) - 1 if len(positions) else len(log) - 1
    snapshot, segments = _snapshot(p, device, before, tag_id, site_id)
    events = {
        "position": positions, "kind": kinds, "address": cols["address"][positions], "size": cols["size"][positions],
        "requested": cols["requested"][positions], "tag": tag_col, "site": site_col,
        "ns": cols["time_ns"][positions] - p.t0_ns, "settled": settled,
    }  # fmt: skip
    return {
        "format": FORMAT, "version": VERSION, "device": device, "peak": dp.peak.index,
        "kinds": {k.name.lower(): int(k) for k in HEAP_KINDS},
        "columns": encode_columns(EVENT_COLUMNS, events), "chunks": encode_columns(CHUNK_COLUMNS, snapshot),
        "segments": encode_columns(SEGMENT_COLUMNS, segments),
        "tags": [list(t) for t in tags.ids], "sites": list(sites.ids),
        "colors": {**COLORS, **OOM_COLORS}, "palette": PALETTE, "zoomBelow": ZOOM_BELOW, "minWidth": MIN_WIDTH,
        "maxRectangles": max_rectangles, "aggregatedHover": LEAN_AGGREGATED,
        "complete": len(positions) == len(heap), "timesInferred": times_inferred(log),
    }  # fmt: skip


def _snapshot(
    p: Profile, device: str, before: int, tag_id: Any, site_id: Any
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The heap right after log position ``before`` as the stream's ``chunks`` and ``segments``
    columns (empty before the first event), from the replay's arrays: one ``tag_id`` (tag text
    or None) and ``site_id`` (stack) call per distinct value, not per chunk."""
    empty = np.zeros(0, dtype=np.int64)
    if before < 0:
        return {name: empty for name in CHUNK_COLUMNS}, {"base": empty, "size": empty}
    dp = p.devices[device]
    heap = dp.columns_at(before)
    used = heap.in_use
    tags, tag_of = np.unique(heap.tag, return_inverse=True)
    strings = p.log.strings
    tag_ids = np.array([tag_id(strings[t] if t >= 0 else None) for t in tags.tolist()] + [-1], dtype=np.int64)
    stacks, stack_of = np.unique(heap.stack, return_inverse=True)
    site_ids = np.array([site_id(k) for k in stacks.tolist()] + [-1], dtype=np.int64)
    # when each live chunk was allocated: the live allocation at its address (-1 unknown)
    live = alive_at(dp.allocations, before)
    addresses = live["address"].to_numpy()
    order = np.argsort(addresses, kind="stable")
    ranked = addresses[order]
    k = np.minimum(np.searchsorted(ranked, heap.address), max(len(ranked) - 1, 0))
    known = used & (ranked[k] == heap.address) if len(ranked) else np.zeros(len(used), dtype=bool)
    made = live["alloc_index"].to_numpy()[order] if len(ranked) else empty
    ns = live["alloc_ns"].to_numpy()[order] - p.t0_ns if len(ranked) else empty
    chunks = {
        "address": heap.address, "size": heap.size, "requested": heap.requested,
        "tag": np.where(used, tag_ids[tag_of.reshape(-1)], -1),
        "site": np.where(used, site_ids[stack_of.reshape(-1)], -1),
        "event": np.where(known, made[k] if len(ranked) else -1, -1),
        "ns": np.where(known, ns[k] if len(ranked) else -1, -1),
    }  # fmt: skip
    return chunks, {"base": heap.bases, "size": heap.sizes}


STEPPER_TRACE_TYPES = frozenset({"bar"})
"""The trace types ``STEPPER_JS`` builds in the page (the map's bars), for the page's plotly.js bundle."""

STEPPER_JS = """
function gpuvizDecode(encoded) {
  // a stream's typed columns: base64 of little-endian values, typed as the stream names them
  var out = {};
  Object.keys(encoded).forEach(function (name) {
    var raw = atob(encoded[name].data), bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) { bytes[i] = raw.charCodeAt(i); }
    out[name] = new window[encoded[name].type](bytes.buffer);
  });
  return out;
}
function gpuvizRound(x) {  // Python's round(): halves to even
  var r = Math.round(x);
  return (r - x === 0.5 && r % 2 !== 0) ? r - 1 : r;
}
function gpuvizStepper(stream) {
  // The heap after any event of the stream (replay's rules applied to the snapshot before its
  // first event) and its map, as gpuviz.views.fragmentation.trace_specs / map_layout draw it (lean).
  var ev = gpuvizDecode(stream.columns), snap = gpuvizDecode(stream.chunks), segs = gpuvizDecode(stream.segments);
  var kinds = stream.kinds, n = ev.position.length, chunks = null, segments = null, applied = 0;
  function free(size) { return {size: size, requested: 0, tag: -1, site: -1, event: -1, ns: -1}; }
  function reset() {
    chunks = new Map(); segments = new Map(); applied = 0;
    for (var i = 0; i < snap.address.length; i++) {
      chunks.set(snap.address[i], {size: snap.size[i], requested: snap.requested[i], tag: snap.tag[i],
                                   site: snap.site[i], event: snap.event[i], ns: snap.ns[i]});
    }
    for (var j = 0; j < segs.base.length; j++) { segments.set(segs.base[j], segs.size[j]); }
  }
  function apply(i) {
    var kind = ev.kind[i], a = ev.address[i], size = ev.size[i], old;
    if (kind === kinds.alloc) {
      chunks.set(a, {size: size, requested: ev.requested[i], tag: ev.tag[i], site: ev.site[i],
                     event: ev.position[i], ns: ev.ns[i]});
    } else if (kind === kinds.free) { chunks.set(a, free(size)); }
    else if (kind === kinds.split) {
      old = chunks.get(a).size; chunks.set(a, free(size)); chunks.set(a + size, free(old - size));
    }
    else if (kind === kinds.merge) { old = chunks.get(a).size; chunks.delete(a + old); chunks.set(a, free(size)); }
    else if (kind === kinds.segment_alloc) { segments.set(a, size); chunks.set(a, free(size)); }
    else if (kind === kinds.segment_free) { segments.delete(a); chunks.delete(a); }
    else if (kind === kinds.segment_map) {  // [a, a + size) joins the segments it touches (replay.map_range)
      var upper = segments.has(a + size) ? segments.get(a + size) : 0, below = null;
      segments.delete(a + size);
      segments.forEach(function (length, base) { if (base + length === a) { below = base; } });
      if (below === null) { segments.set(a, size + upper); }
      else { segments.set(below, segments.get(below) + size + upper); }
      chunks.set(a, free(size));
    }
    else if (kind === kinds.segment_unmap) {  // [a, a + size) leaves its segment (replay.unmap_range)
      var holder = null;
      segments.forEach(function (length, base) { if (base <= a && a < base + length) { holder = base; } });
      var end = holder + segments.get(holder);
      if (a > holder) { segments.set(holder, a - holder); } else { segments.delete(holder); }
      if (a + size < end) { segments.set(a + size, end - a - size); }
      chunks.delete(a);
    }
  }
  function heapAfter(position) {
    // segments by base, each with its chunks by address, right after log position `position`
    var lo = 0, hi = n;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (ev.position[mid] <= position) { lo = mid + 1; } else { hi = mid; } }
    if (chunks === null || lo < applied) { reset(); }
    while (applied < lo) { apply(applied); applied += 1; }
    var byNumber = function (a, b) { return a - b; };
    var heap = Array.from(segments.keys()).sort(byNumber).map(function (b) {
      return {base: b, size: segments.get(b), chunks: []};
    });
    var s = 0;
    Array.from(chunks.keys()).sort(byNumber).forEach(function (a) {
      while (s + 1 < heap.length && heap[s + 1].base <= a) { s += 1; }
      var c = chunks.get(a);
      heap[s].chunks.push({address: a, size: c.size, requested: c.requested, inUse: c.requested > 0, tag: c.tag,
                           site: c.site, event: c.event, ns: c.ns});
    });
    return heap;
  }
  function exact(heap, minWidth) {
    var traces = {};
    function add(name, row, base, x, custom) {
      var t = traces[name] || (traces[name] = {y: [], base: [], x: [], custom: []});
      t.y.push(row); t.base.push(base); t.x.push(x); t.custom.push(custom);
    }
    heap.forEach(function (seg, row) {
      seg.chunks.forEach(function (c) {
        var offset = c.address - seg.base;
        if (c.inUse) {
          var name = stream.tags[c.tag][1];
          add(name, row, offset, Math.max(c.requested, minWidth), c);
          if (c.size > c.requested) { add('waste', row, offset + c.requested, c.size - c.requested, c); }
        } else { add('free', row, offset, c.size, c); }
      });
    });
    Object.keys(traces).forEach(function (name) {
      var t = traces[name], strings = new Map();
      function id(s) { if (!strings.has(s)) { strings.set(s, strings.size); } return strings.get(s); }
      t.customdata = t.custom.map(function (c) {
        var tag = c.inUse ? id(stream.tags[c.tag][0]) : -1;
        var site = c.inUse && c.site >= 0 ? id(stream.sites[c.site]) : -1;
        var ms = c.inUse && c.event >= 0 && !stream.timesInferred ? gpuvizRound(c.ns / 1e6) : -1;
        return [c.size, c.requested, tag, c.inUse ? c.event : -1, ms, site];
      });
      t.strings = Array.from(strings.keys());
    });
    return traces;
  }
  function coverage(intervals, x) {  // bytes of the sorted, disjoint [start, start + length) below x
    var total = 0, out = 0;
    for (var i = 0; i < intervals.length && intervals[i][0] <= x; i++) {
      out = total + Math.max(Math.min(x - intervals[i][0], intervals[i][1]), 0); total += intervals[i][1];
    }
    return out;
  }
  function aggregate(heap) {
    var traces = {used: {y: [], base: [], x: [], customdata: []}, waste: {y: [], base: [], x: [], customdata: []},
                  free: {y: [], base: [], x: [], customdata: []}};
    var buckets = Math.max(1, Math.floor(stream.maxRectangles / (3 * Math.max(1, heap.length))));
    heap.forEach(function (seg, row) {
      var parts = {used: [], waste: [], free: []}, starts = [];
      seg.chunks.forEach(function (c) {
        var offset = c.address - seg.base;
        starts.push(offset);
        if (c.inUse) {
          parts.used.push([offset, c.requested]);
          if (c.size > c.requested) { parts.waste.push([offset + c.requested, c.size - c.requested]); }
        } else { parts.free.push([offset, c.size]); }
      });
      var edges = [], step = seg.size / buckets;
      for (var e = 0; e <= buckets; e++) { edges.push(e === buckets ? seg.size : e * step); }
      var below = function (x) { var k = 0; while (k < starts.length && starts[k] < x) { k += 1; } return k; };
      for (var i = 0; i < buckets; i++) {
        var start = edges[i], count = below(edges[i + 1]) - below(edges[i]);
        ['used', 'waste', 'free'].forEach(function (name) {
          var length = coverage(parts[name], edges[i + 1]) - coverage(parts[name], edges[i]);
          if (length > 0) {
            var t = traces[name];
            t.y.push(row); t.base.push(start); t.x.push(length);
            t.customdata.push([seg.base + Math.trunc(edges[i]), count, Math.trunc(length)]);
            start += length;
          }
        });
      }
    });
    return traces;
  }
  function escape(s) {  // as Python's html.escape
    return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
      .replace(/"/g, '&quot;').replace(/'/g, '&#x27;');
  }
  function frame(position, only) {
    // {data, layout, label, heap}: the map right after log position `position` (`only`: of the
    // segments at those bases alone, the report's drill-down to one segment)
    var heap = heapAfter(position), count = 0;
    if (only) { heap = heap.filter(function (s) { return only.indexOf(s.base) >= 0; }); }
    var pool = 0, inUse = 0, largest = 0, widest = 0, end = 0;
    var lanes = [], rowsInUse = [];  // gpuviz.views.overview.state_lanes: inferred preexisting segments
    heap.forEach(function (seg, row) {
      var c0 = seg.chunks[0];
      if (heap.length > 1 && seg.chunks.length === 1 && c0.inUse && stream.tags[c0.tag][0] === 'PREEXISTING') {
        lanes.push(row);
      }
    });
    heap.forEach(function (seg, row) {
      var lane = lanes.indexOf(row) >= 0, own = 0;
      pool += seg.size; if (!lane) { widest = Math.max(widest, seg.size); }
      seg.chunks.forEach(function (c) {
        count += 1;
        if (c.inUse) {
          inUse += c.size; own += c.size;
          if (!lane) { end = Math.max(end, c.address + c.size - seg.base); }
        }
        else { largest = Math.max(largest, c.size); }
      });
      rowsInUse.push(own);
    });
    var zoom = null;  // fragmentation.zoom_range without pinning
    if (heap.length && inUse < stream.zoomBelow * pool) {
      end = Math.min(widest, Math.floor(end * 1.25) + 1);
      zoom = end >= widest || end <= 0 ? null : end;
    }
    var aggregated = count * 2 > stream.maxRectangles;
    var traces = aggregated ? aggregate(heap) : exact(heap, stream.minWidth * (zoom === null ? widest : zoom));
    var first = ['free', 'waste', 'used'];
    var names = first.concat(Object.keys(traces).filter(function (name) {
      return first.indexOf(name) < 0;
    }).sort());
    var data = names.map(function (name, i) {
      var t = traces[name] || {y: [], base: [], x: [], customdata: [], strings: []};
      var suffix = aggregated && first.indexOf(name) >= 0 ? ' (aggregated)' : '';
      var spec = {type: 'bar', orientation: 'h', name: name + suffix,
                  marker: {color: stream.colors[name] || stream.palette[i % stream.palette.length],
                           line: {width: 0.5, color: 'white'}},
                  y: t.y, base: t.base.map(Math.trunc), x: t.x.map(gpuvizRound), customdata: t.customdata};
      if (aggregated) { spec.hovertemplate = stream.aggregatedHover; }
      else {
        spec.meta = name === 'waste' ? {strings: t.strings, afterRequested: true} : {strings: t.strings};
        spec.hoverinfo = 'text';
      }
      return spec;
    });
    var free = pool - inUse, fragmentation = free ? (free - largest) / free : 0;
    var metric = 'in use ' + gpuvizSize(inUse) + ' \\u00b7 pool ' + gpuvizSize(pool) + ' \\u00b7 largest free ' +
      gpuvizSize(largest) + ' \\u00b7 fragmentation ' + (fragmentation * 100).toFixed(1) + '%';
    var peak = position === stream.peak, title = stream.device + ' after event ' + position + (peak ? ' (peak)' : '');
    var ticks = {};
    if (widest > 0) {
      var tick = 1, values = [];
      while (tick * 2 <= widest / 6) { tick *= 2; }
      for (var v = 0; v <= widest; v += tick) { values.push(v); }
      ticks = {tickvals: values, ticktext: values.map(gpuvizSize)};
    }
    var layout = {
      title: {text: escape(title) + '<br><sub>' + metric + '</sub>'},
      barmode: 'overlay', bargap: 0.15, height: Math.min(900, 180 + 28 * Math.max(1, heap.length)),
      hovermode: 'closest',
      xaxis: Object.assign({title: {text: 'offset in segment'}}, ticks, {range: [0, zoom === null ? widest : zoom]}),
      yaxis: Object.assign({title: {text: 'segment'}}, gpuvizRowTicks(
                heap.map(function (s) { return s.base; }), heap.map(function (s) { return s.size; }), lanes),
              {range: [heap.length - 0.5, -0.5], type: 'linear'}, lanes.length ? {automargin: true} : {}),
      legend: {orientation: 'h', yref: 'container', y: 0, yanchor: 'bottom'},
      margin: {l: 120, r: 20, t: 80, b: 80}, uirevision: 'map',
      meta: {bases: heap.map(function (s) { return s.base; }), sizes: heap.map(function (s) { return s.size; }),
             inUse: rowsInUse, lanes: lanes}
    };
    if (zoom !== null) {
      layout.updatemenus = [{type: 'buttons', direction: 'right', x: 1, xanchor: 'right', y: 1.02, yanchor: 'bottom',
        showactive: true, active: 0, buttons: [
          {label: 'used range', method: 'relayout', args: [{'xaxis.range': [0, zoom]}]},
          {label: 'whole pool', method: 'relayout', args: [{'xaxis.range': [0, widest]}]}]}];
    }
    var seconds = (ev.ns[Math.max(0, lo(position))] / 1e9).toFixed(6);
    var when = stream.timesInferred ? '' : ' \\u00b7 t = ' + seconds + ' s';
    var label = 'event ' + position + when + (peak ? ' \\u00b7 peak' : '') +
      ' \\u00b7 ' + metric;
    return {data: data, layout: layout, label: label, heap: heap};
  }
  function lo(position) {  // the stream's index of the event at log position `position`, or -1
    for (var a = 0, b = n; a < b;) {
      var m = (a + b) >> 1;
      if (ev.position[m] < position) { a = m + 1; } else { b = m; }
    }
    return a < n && ev.position[a] === position ? a : -1;
  }
  var steps = [];
  for (var i = 0; i < n; i++) { if (ev.settled[i]) { steps.push(ev.position[i]); } }
  function covers(position) {  // whether the stream knows the heap right after `position`
    return n > 0 && position >= ev.position[0] - 1 && (stream.complete || position <= ev.position[n - 1]);
  }
  return {steps: steps, frame: frame, heapAfter: heapAfter, covers: covers};
}
"""
