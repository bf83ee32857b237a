"""The HTML report: one self-contained file with the summary, every view, a time scrubber
for each device's fragmentation map and the sortable placement table.

plotly.js is embedded (``plotlyjs="inline"``, works offline) or loaded from the CDN
(``plotlyjs="cdn"``, a smaller file). Every user-provided string is escaped: HTML text
with ``html.escape``, and the figure JSON inside ``<script>`` with ``</`` written as ``<\\/``.
"""

from __future__ import annotations

import html
import json
from typing import Any

import plotly
import plotly.graph_objects as go
from plotly.utils import PlotlyJSONEncoder

from gpuviz.analysis.profile import DeviceProfile, Profile
from gpuviz.base.units import format_bytes
from gpuviz.views.fragmentation import map_layout, metric_text, trace_specs
from gpuviz.views.tables import TABLE_CSS, call_site_html, placement_html, summary_html
from gpuviz.views.timeline import timeline

__all__ = ["report_html", "FRAME_RECTANGLES", "figure_json", "to_script_json"]

FRAME_RECTANGLES = 1500
"""The most rectangles one scrubber frame draws (the rest is aggregated)."""

_CSS = """
body { font: 14px/1.5 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.scrubber { display: flex; align-items: center; gap: 12px; margin: 6px 0; }
.scrubber input { flex: 1; }
"""

_FUNCTIONS = """
function gpuvizSortTable(table) {
  table.querySelectorAll('th').forEach(function (th, column) {
    th.addEventListener('click', function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var ascending = th.dataset.order !== 'asc'; th.dataset.order = ascending ? 'asc' : 'desc';
      rows.sort(function (a, b) {
        var x = a.cells[column].dataset.value || a.cells[column].textContent;
        var y = b.cells[column].dataset.value || b.cells[column].textContent;
        var nx = parseFloat(x), ny = parseFloat(y);
        var order = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
        return ascending ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
}
function gpuvizScrubber(id, first) {
  // Only the first frame is parsed at load; the rest is inert JSON, parsed on first use.
  var input = document.getElementById(id + '-slider'), label = document.getElementById(id + '-label');
  var frames = null;
  function show(f) { Plotly.react(id, f.data, f.layout); label.textContent = f.label; }
  input.addEventListener('input', function () {
    if (frames === null) { frames = JSON.parse(document.getElementById(id + '-frames').textContent); }
    show(frames[parseInt(input.value, 10)]);
  });
  show(first);
}
"""
_ON_LOAD = "document.querySelectorAll('table.gpuviz-placement').forEach(gpuvizSortTable);"


def to_script_json(value: Any) -> str:
    """JSON safe to place inside a ``<script>`` element."""
    text = json.dumps(value, cls=PlotlyJSONEncoder, separators=(",", ":"))
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def figure_json(figure: go.Figure) -> dict[str, Any]:
    """A figure's ``data`` and ``layout`` as plotly.py writes them (NumPy arrays left in)."""
    data = figure.to_plotly_json()
    return {"data": data["data"], "layout": data.get("layout", {})}


def _plot(div_id: str, figure: go.Figure) -> str:
    spec = to_script_json(figure_json(figure))
    return (
        f'<div id="{div_id}" class="gpuviz-plot"></div>'
        f"<script>(function(){{var s={spec};"
        f"Plotly.newPlot('{div_id}',s.data,s.layout,{{responsive:true}});}})();</script>"
    )


def _scrubber(div_id: str, p: Profile, device: DeviceProfile) -> str:
    frames = []
    positions = device.scrub_index.tolist()
    for index in positions:
        state = device.state_at(index)
        seconds = (int(p.log["time_ns"][index]) - p.t0_ns) / 1e9
        frames.append(
            {  # plain dicts: validating 40 figures with plotly would dominate the report's build time
                "data": trace_specs(state, max_rectangles=FRAME_RECTANGLES, lean=True),
                "layout": map_layout(state, lean=True),
                "label": f"event {index} · t = {seconds:.6f} s · {metric_text(state)}",
            }
        )
    start = positions.index(device.peak.index) if device.peak.index in positions else max(len(positions) - 1, 0)
    first = to_script_json(frames[start]) if frames else '{"data":[],"layout":{},"label":""}'
    return (
        f'<div class="scrubber"><span>time</span><input type="range" id="{div_id}-slider" min="0" '
        f'max="{max(len(positions) - 1, 0)}" value="{start}" step="1" aria-label="time scrubber">'
        f'<span id="{div_id}-label"></span></div><div id="{div_id}" class="gpuviz-plot"></div>'
        f'<script type="application/json" id="{div_id}-frames">{to_script_json(frames)}</script>'
        f"<script>gpuvizScrubber('{div_id}', {first});</script>"
    )


def report_html(
    p: Profile, *, plotlyjs: str = "inline", title: str = "gpuviz report", source: str | None = None
) -> str:
    """The whole report as one HTML document."""
    if plotlyjs == "inline":
        script = f"<script>{plotly.offline.get_plotlyjs()}</script>"
    elif plotlyjs == "cdn":
        script = f'<script src="https://cdn.plot.ly/plotly-{plotly.offline.get_plotlyjs_version()}.min.js"></script>'
    else:
        raise ValueError(f"plotlyjs must be 'inline' or 'cdn', not {plotlyjs!r}")
    body = [f"<h1>{html.escape(title)}</h1>"]
    facts = f"{len(p.log)} events · devices: {html.escape(', '.join(p.log.device_names) or 'none')}"
    if source:
        facts = f"{html.escape(source)} · " + facts
    body.append(f"<p>{facts}</p>")
    body.append(
        '<h2>Summary</h2><div class="gpuviz">' + summary_html(p.diagnosis, group_by=p.options.group_by) + "</div>"
    )
    for number, (name, device) in enumerate(p.devices.items()):
        body.append(f"<h2>{html.escape(name)}: peak {format_bytes(device.peak.bytes)}</h2>")
        body.append("<h3>Fragmentation map</h3>")
        body.append(_scrubber(f"map{number}", p, device))
        body.append("<h3>Timeline</h3>")
        figure = timeline(
            device.series, t0_ns=p.t0_ns, points=p.options.points, transfers=p.transfers, marks=p.marks,
            ooms=p.ooms[p.ooms["device"] == name] if len(p.ooms) else None,
            segments=p.segments[p.segments["device"] == name] if len(p.segments) else None, peak=device.peak,
        )  # fmt: skip
        body.append(_plot(f"timeline{number}", figure))
    body.append('<h2>Placement</h2><div class="gpuviz">')
    body.append(placement_html(p.placements) if len(p.placements) else "<p>No ops were recorded.</p>")
    body.append("</div>")
    if len(p.call_sites):
        body.append('<h2>Call sites</h2><div class="gpuviz">' + call_site_html(p.call_sites) + "</div>")
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}{TABLE_CSS}</style>{script}"
        f"<script>{_FUNCTIONS}</script></head><body>" + "\n".join(body) + f"<script>{_ON_LOAD}</script></body></html>"
    )
