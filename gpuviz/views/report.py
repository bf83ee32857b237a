"""The HTML report: one self-contained file with the summary, every view, a time scrubber
for each device's fragmentation map and the sortable placement table.

plotly.js is embedded (``plotlyjs="inline"``, works offline), loaded from the CDN
(``plotlyjs="cdn"``, a smaller file) or from a file beside the page (``"directory"``): the
cartesian partial bundle where it draws every trace (``gpuviz.views.plotlyjs``). Every
user-provided string is escaped: HTML text with ``html.escape``, and the figure JSON inside
``<script>`` with ``</`` written as ``<\\/``.
"""

from __future__ import annotations

import html
import json
from typing import Any, NamedTuple

import numpy as np
import plotly.graph_objects as go
from plotly.utils import PlotlyJSONEncoder

from gpuviz.analysis.advice import Advice
from gpuviz.analysis.profile import DeviceProfile, Profile
from gpuviz.analysis.tables import devices_present
from gpuviz.analysis.timeline import devices_by_peak, times_inferred
from gpuviz.base.units import format_size
from gpuviz.log.schema import Kind
from gpuviz.views.active import active_grouping, active_spec
from gpuviz.views.advice import advice_html
from gpuviz.views.eventstream import STEPPER_JS, STEPPER_TRACE_TYPES, event_stream
from gpuviz.views.frames import FRAMES_JS, pack_bars, scrubber_frames, unpack_bars
from gpuviz.views.overview import OVERVIEW_ABOVE, OVERVIEW_JS, array_groups
from gpuviz.views.plotlyjs import Bundle, bundle_for, check_plotlyjs, plotlyjs_script, trace_types
from gpuviz.views.tables import TABLE_CSS, call_site_html, placement_html, summary_html
from gpuviz.views.timeline import timeline

__all__ = ["report_html", "FRAME_RECTANGLES", "figure_json", "to_script_json", "scrub_positions"]
__all__ += ["plot_div", "ReportDocument", "report_document"]

FRAME_RECTANGLES = 1500
"""The most rectangles one scrubber frame draws (the rest is aggregated)."""

_CSS = """
body { font: 14px/1.5 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.scrubber { display: flex; align-items: center; gap: 12px; margin: 6px 0; }
.scrubber input { flex: 1; }
"""

_FUNCTIONS = """
function gpuvizSize(n) {
  // the same words as gpuviz.base.units.format_size
  if (n < 0) { return '-' + gpuvizSize(-n); }
  var units = [[1099511627776, 'TiB'], [1073741824, 'GiB'], [1048576, 'MiB'], [1024, 'KiB']];
  for (var i = 0; i < units.length; i++) {
    if (n >= units[i][0]) {
      // halves round to even, as Python's format does (tenths: exact for whole bytes below 2**49)
      var v = n / units[i][0];
      var t = v < 9.95 ? (gpuvizRound(n * 10 / units[i][0]) / 10).toFixed(1) : String(gpuvizRound(v));
      if (t === '1024' && i > 0) { return gpuvizSize(units[i][0] * 1024); }
      return t + ' ' + units[i][1];
    }
  }
  return Math.round(n) + ' B';
}
function gpuvizEscape(s) { return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;'); }
function gpuvizHover(data, layout) {
  // lean map traces carry [size, requested, tag, event, ms, site] per chunk; the address is the
  // row's segment base plus the bar's base. The same words as gpuviz.views.fragmentation's
  // chunk_hover / hole_hover.
  var bases = (layout.meta || {}).bases ||
    ((layout.yaxis || {}).ticktext || []).map(function (t) { return parseInt(t, 16); });
  data.forEach(function (trace) {
    if (!trace.meta || !trace.meta.strings || !trace.customdata) { return; }
    var strings = trace.meta.strings;
    trace.hovertext = trace.customdata.map(function (c, i) {
      var address = '0x' + (bases[trace.y[i]] + trace.base[i] - (trace.meta.afterRequested ? c[1] : 0)).toString(16);
      if (c[2] < 0) { return '<b>free hole</b> ' + gpuvizSize(c[0]) + '<br>address ' + address; }
      var text = '<b>' + gpuvizEscape(strings[c[2]]) + '</b><br>requested ' + gpuvizSize(c[1]) +
        ' \u00b7 chunk ' + gpuvizSize(c[0]) + '<br>address ' + address;
      if (c[3] >= 0) {  // (no time where the source recorded none)
        text += '<br>allocated at event ' + c[3] + (c[4] >= 0 ? ', t = ' + (c[4] / 1e3).toFixed(3) + ' s' : '');
      }
      if (c[5] >= 0) { text += '<br>call site ' + gpuvizEscape(strings[c[5]]); }
      return text;
    });
  });
  return data;
}
function gpuvizSortTable(table) {
  table.querySelectorAll('th').forEach(function (th, column) {
    th.addEventListener('click', function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var ascending = th.dataset.order !== 'asc'; th.dataset.order = ascending ? 'asc' : 'desc';
      rows.sort(function (a, b) {
        // numeric cells sort by their data-value (bytes, ns), text cells by their text
        var numeric = a.cells[column].dataset.value !== undefined && b.cells[column].dataset.value !== undefined;
        var x = numeric ? a.cells[column].dataset.value : a.cells[column].textContent;
        var y = numeric ? b.cells[column].dataset.value : b.cells[column].textContent;
        var order = numeric ? parseFloat(x) - parseFloat(y) : x.localeCompare(y);
        return ascending ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
}
function gpuvizScrubber(id, first, positions) {
  // Only the first frame is parsed at load; the rest is inert JSON, parsed on first use, with
  // the bars of aggregated maps packed in typed columns (gpuviz.views.frames.pack_bars).
  // Frames share layout.uirevision, so a zoom or pan survives scrubbing. The slider moves stop
  // by stop (positions: their log positions); the arrow keys (on the slider, or on the map after
  // a click) step event by event where the report embeds the device's events (gpuvizStepper),
  // else stop by stop.
  var input = document.getElementById(id + '-slider'), label = document.getElementById(id + '-label');
  var plot = document.getElementById(id), events = document.getElementById(id + '-events');
  var frames = null, bars = null, stepper = null, steps = null, shown = null, view = {level: 'overview'};
  var nav = document.getElementById(id + '-nav');
  function show(f, position) {
    // many segments: the overview by size class, a group's segments or one segment (gpuvizMapView)
    shown = {frame: f, position: position};
    var drawn = gpuvizMapView({data: gpuvizHover(f.data, f.layout), layout: f.layout}, view);
    if (view.level === 'segment' && events) {
      // one segment: its chunks one by one (each hover names its allocation), from the embedded events
      stepper = stepper || gpuvizStepper(JSON.parse(events.textContent));
      if (stepper.covers(position)) {
        var one = stepper.frame(position, [view.base]);
        one.layout.title = drawn.layout.title;
        drawn = {data: gpuvizHover(one.data, one.layout), layout: one.layout};
      }
    }
    Plotly.react(id, drawn.data, drawn.layout);
    label.textContent = f.label; plot.dataset.position = String(position); plot.gpuvizHeap = f.heap || null;
    plot.dataset.view = view.level;
    if (nav) {
      nav.innerHTML = '';
      var crumbs = view.level === 'map' ? [] : [['overview', 'overview']];
      if (view.level === 'group' || view.level === 'segment') { crumbs.push(['group', view.group]); }
      if (view.level === 'segment') { crumbs.push(['segment', '0x' + view.base.toString(16)]); }
      crumbs.forEach(function (c, i) {
        var a = document.createElement(i + 1 < crumbs.length ? 'a' : 'span');
        a.textContent = c[1]; if (i) { nav.appendChild(document.createTextNode(' \u203a ')); }
        if (i + 1 < crumbs.length) {
          a.href = '#'; a.addEventListener('click', function (e) { e.preventDefault(); view.level = c[0]; redraw(); });
        }
        nav.appendChild(a);
      });
    }
  }
  function redraw() { if (shown) { show(shown.frame, shown.position); } }
  plot.addEventListener('gpuviz-drill', function (e) { Object.assign(view, e.detail); redraw(); });
  function go(value) {
    if (frames === null) {
      frames = JSON.parse(document.getElementById(id + '-frames').textContent);
      bars = gpuvizDecode(JSON.parse(document.getElementById(id + '-bars').textContent));
    }
    input.value = String(value);
    show(gpuvizUnpack(frames[parseInt(input.value, 10)], bars), positions[parseInt(input.value, 10)]);
  }
  function step(direction) {
    if (steps === null) {
      stepper = stepper || (events ? gpuvizStepper(JSON.parse(events.textContent)) : null);
      steps = Array.from(new Set(positions.concat(stepper ? stepper.steps : [])));
      steps.sort(function (a, b) { return a - b; });
    }
    var at = parseInt(plot.dataset.position, 10), below = steps.filter(function (s) { return s < at; }).length;
    var k = direction > 0 ? (steps[below] === at ? below + 1 : below) : below - 1;
    if (k < 0 || k >= steps.length) { return; }
    var stop = positions.indexOf(steps[k]);
    if (stop >= 0) { go(stop); return; }
    input.value = String(Math.max(positions.filter(function (p) { return p < steps[k]; }).length - 1, 0));
    show(stepper.frame(steps[k]), steps[k]);
  }
  function keydown(e) {
    var direction = e.key === 'ArrowRight' ? 1 : e.key === 'ArrowLeft' ? -1 : 0;
    if (!direction) { return; }
    e.preventDefault();
    step(direction);
  }
  plot.gpuvizShowAt = function (position) {
    // the heap right after log position `position` (a click on the active-memory view): exactly,
    // where the embedded events reach it, else at the last stop at or before it
    var stop = Math.max(positions.filter(function (p) { return p <= position; }).length - 1, 0);
    if (positions[stop] !== position && events) {
      stepper = stepper || gpuvizStepper(JSON.parse(events.textContent));
      if (stepper.covers(position)) {
        input.value = String(stop); show(stepper.frame(position), position); return;
      }
    }
    go(stop);
  };
  input.addEventListener('input', function () { go(input.value); });
  input.addEventListener('keydown', keydown);
  plot.addEventListener('keydown', keydown);
  show(first, positions[parseInt(input.value, 10)]);
  plot.on('plotly_click', function (event) {
    // drill down: a size class of the overview to its segments, a segment to itself
    var point = event.points && event.points[0], layout = plot.layout || {}, meta = layout.meta || {};
    if (!point) { return; }
    if (meta.overview) {
      var g = meta.overview[Math.round(point.y)];
      if (!g) { return; }
      view.level = 'group'; view.group = g.name;
      // the overview drawn at load has no segments: its stop's frame (parsed now) has them
      if (((shown.frame.layout || {}).meta || {}).lazy) { go(input.value); } else { redraw(); }
    } else if (meta.bases && view.level !== 'map') {
      var base = meta.bases[Math.round(point.y)];
      if (base !== undefined) { view.level = 'segment'; view.base = base; redraw(); }
    }
  });
}
"""
_ON_LOAD = "document.querySelectorAll('table.gpuviz-placement, table.gpuviz-sortable').forEach(gpuvizSortTable);"


def to_script_json(value: Any) -> str:
    """JSON safe to place inside a ``<script>`` element: every ``<`` is written ``\\u003c``, so
    no user string can close the element or open another."""
    text = json.dumps(value, cls=PlotlyJSONEncoder, separators=(",", ":"))
    return text.replace("<", "\\u003c")


def figure_json(figure: go.Figure) -> dict[str, Any]:
    """A figure's ``data`` and ``layout`` as plotly.py writes them (NumPy arrays left in)."""
    data = figure.to_plotly_json()
    return {"data": data["data"], "layout": data.get("layout", {})}


def plot_div(div_id: str, figure: go.Figure, *, lazy: bool = False) -> str:
    """A ``<div>`` with the figure drawn into it by an inline script (plotly.js loaded before).

    ``lazy``: drawn only when the div comes within 200 px of the viewport (a figure below the
    fold costs the page's load nothing); until then the figure is inert JSON and the div keeps
    the figure's height. When drawn, the div gets a ``gpuviz-drawn`` event."""
    spec = to_script_json(figure_json(figure))
    if lazy:
        height = int(figure.layout.height or 450)
        return (
            f'<div id="{div_id}" class="gpuviz-plot gpuviz-lazy" style="min-height:{height}px"></div>'
            f'<script type="application/json" id="{div_id}-figure">{spec}</script>'
            f"<script>{LAZY_PLOT_JS}gpuvizLazyPlot('{div_id}');</script>"
        )
    return (
        f'<div id="{div_id}" class="gpuviz-plot"></div>'
        f"<script>(function(){{var s={spec};"
        f"Plotly.newPlot('{div_id}',s.data,s.layout,{{responsive:true}});}})();</script>"
    )


LAZY_PLOT_JS = """
function gpuvizLazyPlot(id) {
  var div = document.getElementById(id);
  var observer = new IntersectionObserver(function (entries) {
    if (!entries.some(function (e) { return e.isIntersecting; })) { return; }
    observer.disconnect();
    var s = JSON.parse(document.getElementById(id + '-figure').textContent);
    Plotly.newPlot(id, s.data, s.layout, {responsive: true}).then(function () {
      div.dispatchEvent(new Event('gpuviz-drawn'));
    });
  }, {rootMargin: '200px'});
  observer.observe(div);
}
"""
"""What a lazy ``plot_div`` runs (the function is defined again by each lazy div: a few hundred bytes)."""


def scrub_positions(device: DeviceProfile) -> list[int]:
    """The report scrubber's stops: ``scrub_stops`` and the opening moment. Between them the arrow
    keys step event by event (``eventstream``)."""
    stops = set(device.scrub_index.tolist())
    if device.opening >= 0:
        stops.add(device.opening)
    return sorted(stops)


def _frame_label(p: Profile, device: DeviceProfile, index: int, text: str) -> str:
    seconds = (int(p.log["time_ns"][index]) - p.t0_ns) / 1e9
    when = "" if times_inferred(p.log) else f" · t = {seconds:.6f} s"
    kind = int(p.log["kind"][index])
    if kind == Kind.MARK:  # (only a mark's tag is read: other events may have none, tag -1)
        what = f" · mark {p.log.strings[int(p.log['tag'][index])]}"
    else:
        what = " · OUT OF MEMORY" if kind == Kind.OOM else " · peak" if index == device.peak.index else ""
    return f"event {index}{when}{what} · {text}"


def _scrubber(div_id: str, p: Profile, name: str, device: DeviceProfile, types: set[str]) -> str:
    """The map with its scrubber; adds the trace types of its frames to ``types``."""
    positions = scrub_positions(device)
    # plain dicts: validating dozens of figures with plotly would dominate the report's build time
    frames = [
        {**frame.spec, "label": _frame_label(p, device, index, frame.metric)}
        for index, frame in zip(
            positions, scrubber_frames(p, name, positions, max_rectangles=FRAME_RECTANGLES), strict=True
        )
    ]
    start = positions.index(device.opening) if device.opening in positions else max(len(positions) - 1, 0)
    types.update(trace_types(frames))
    first = to_script_json(_opening(frames[start])) if frames else '{"data":[],"layout":{},"label":""}'
    packed, bars = pack_bars(frames)
    stream = event_stream(p, name, max_rectangles=FRAME_RECTANGLES) if len(device.series) else None
    events = f'<script type="application/json" id="{div_id}-events">{to_script_json(stream)}</script>' if stream else ""
    return (
        f'<div class="scrubber"><span>time</span><input type="range" id="{div_id}-slider" min="0" '
        f'max="{max(len(positions) - 1, 0)}" value="{start}" step="1" aria-label="time scrubber">'
        f'<span id="{div_id}-label"></span></div><div id="{div_id}-nav" class="gpuviz-nav"></div>'
        f'<div id="{div_id}" class="gpuviz-plot" tabindex="0"></div>'
        f'<script type="application/json" id="{div_id}-frames">{to_script_json(packed)}</script>'
        f'<script type="application/json" id="{div_id}-bars">{to_script_json(bars)}</script>'
        f"{events}<script>gpuvizScrubber('{div_id}', {first}, {to_script_json(positions)});</script>"
    )


def _opening(frame: dict[str, Any]) -> dict[str, Any]:
    """The frame drawn at load (its bars as lists: ``unpack_bars``): a map of more than
    ``OVERVIEW_ABOVE`` segments as its overview's totals, without its bars (``meta.lazy``: its
    segments are parsed from the frames' JSON on the first drill-down)."""
    meta = frame["layout"].get("meta") or {}
    if len(meta.get("bases", ())) <= OVERVIEW_ABOVE:
        return unpack_bars(frame)
    groups = array_groups(np.asarray(meta["sizes"]), np.asarray(meta["inUse"]), meta["lanes"], rows=True)
    layout = {
        "title": frame["layout"]["title"],
        "meta": {"groups": groups, "segments": len(meta["bases"]), "lazy": True},
    }
    return {"data": [], "layout": layout, "label": frame["label"]}


def _active(div_id: str, map_id: str, p: Profile, device: str) -> str:
    """The active-memory view (by call site where the log has stacks, else by tag); a click on it
    moves the map ``map_id`` to that moment."""
    spec = active_spec(p, device, group_by=active_grouping(p.options.group_by, has_stacks=bool(p.log.stacks)))
    return (
        f'<div id="{div_id}" class="gpuviz-plot"></div><script>(function(){{var s={to_script_json(spec)};'
        f"Plotly.newPlot('{div_id}',s.data,s.layout,{{responsive:true}}).then(function(gd){{"
        "gd.on('plotly_click',function(e){var pt=e.points&&e.points[0];"
        f"if(pt){{document.getElementById('{map_id}').gpuvizShowAt(pt.customdata);}}}});}});}})();</script>"
    )


class ReportDocument(NamedTuple):
    """A report page and the plotly.js bundle it loads (in ``"directory"`` mode: the file to
    place beside it, ``bundle.file_name``)."""

    html: str
    bundle: Bundle


def report_html(
    p: Profile,
    *,
    plotlyjs: str = "inline",
    title: str = "gpuviz report",
    source: str | None = None,
    advice: Advice | None = None,
) -> str:
    """The whole report as one HTML document."""
    return report_document(p, plotlyjs=plotlyjs, title=title, source=source, advice=advice).html


def report_document(
    p: Profile,
    *,
    plotlyjs: str = "inline",
    title: str = "gpuviz report",
    source: str | None = None,
    advice: Advice | None = None,
) -> ReportDocument:
    """The whole report as one HTML document, with the plotly.js bundle it loads: the cartesian
    one unless a figure has a trace type it lacks (``gpuviz.views.plotlyjs.bundle_for``).
    ``advice``: ``scenarios.advise``'s result, shown after the summary."""
    check_plotlyjs(plotlyjs)
    types = set(STEPPER_TRACE_TYPES)  # the stepper draws its frames in the page
    body = [f"<h1>{html.escape(title)}</h1>"]
    facts = f"{len(p.log)} events · devices: {html.escape(', '.join(devices_present(p.log)) or 'none')}"
    if source:
        facts = f"{html.escape(source)} · " + facts
    body.append(f"<p>{facts}</p>")
    body.append(
        '<h2>Summary</h2><div class="gpuviz">'
        + summary_html(p.diagnosis, group_by=p.options.group_by, t0_ns=p.t0_ns)
        + "</div>"
    )
    if advice is not None:
        body.append('<h2>Advice (replayed)</h2><div class="gpuviz">' + advice_html(advice) + "</div>")
    inferred = times_inferred(p.log)
    order = devices_by_peak({name: device.peak.bytes for name, device in p.devices.items()})
    for number, (name, device) in enumerate((name, p.devices[name]) for name in order):
        body.append(f"<h2>{html.escape(name)}: peak {format_size(device.peak.bytes)}</h2>")
        body.append("<h3>Fragmentation map</h3>")
        body.append(_scrubber(f"map{number}", p, name, device, types))
        body.append("<h3>Active memory</h3>" + _active(f"active{number}", f"map{number}", p, name))
        types.add("scatter")
        body.append("<h3>Timeline</h3>")
        figure = timeline(
            device.series, t0_ns=p.t0_ns, points=p.options.points, transfers=p.transfers, marks=p.marks,
            ooms=p.ooms[p.ooms["device"] == name] if len(p.ooms) else None,
            segments=p.segments[p.segments["device"] == name] if len(p.segments) else None, peak=device.peak,
            times_inferred=inferred,
        )  # fmt: skip
        types.update(trace_types([figure]))
        body.append(plot_div(f"timeline{number}", figure))
    body.append('<h2>Placement</h2><div class="gpuviz">')
    body.append(placement_html(p.placements) if len(p.placements) else "<p>No ops were recorded.</p>")
    body.append("</div>")
    if len(p.call_sites):
        body.append('<h2>Call sites</h2><div class="gpuviz">' + call_site_html(p.call_sites) + "</div>")
    bundle = bundle_for(types)
    document = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}{TABLE_CSS}</style>{plotlyjs_script(plotlyjs, bundle)}"
        f"<script>{_FUNCTIONS}{STEPPER_JS}{FRAMES_JS}{OVERVIEW_JS}</script></head><body>"
        + "\n".join(body)
        + f"<script>{_ON_LOAD}</script></body></html>"
    )
    return ReportDocument(document, bundle)
