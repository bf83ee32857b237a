"""The dashboard's front-end: one anywidget view (ES module below) drawing the controls, the
three plotly figures (map, timeline, active memory) and the HTML panes from the model's traits.

Traits it reads: ``header``, ``devices``/``device``, ``stops`` (``[label, position]``),
``position``/``max_position``/``scrubbable``, ``slider_label``, ``map_json``, ``map_view``,
``timeline_json``, ``active_json``, ``pinning_html``, ``summary_html``, ``placement_html``. It writes
``device``, ``clicked`` (a log position clicked in the active-memory view), ``position``
(the slider; the arrow keys step one event, Page Up/Down ten; the stops) and ``map_view`` (the
map's drill-down level: a click on an overview row opens its group, a click on a group's
segment opens that segment, the breadcrumbs above the map go back; what a click means comes
from the drawn figure's ``layout.meta``, ``gpuviz.views.drilldown``). Custom message
``{"extend": {figure, traces, x, y}}`` appends points to a drawn figure. Counters in the
element's ``data-*`` attributes (``mapDraws``, ``timelineDraws``, ``extends``) let tests see
what was drawn.
"""

from __future__ import annotations

__all__ = ["DASHBOARD_ESM", "DASHBOARD_CSS", "ESM_HELPERS"]

DASHBOARD_CSS = """
.gpuviz-dashboard { font-family: sans-serif; font-size: 13px; }
.gpuviz-dashboard .gpuviz-controls { display: flex; gap: 12px; align-items: center; margin: 4px 0; }
.gpuviz-dashboard .gpuviz-slider { flex: 1; }
.gpuviz-dashboard .gpuviz-slider-label { min-width: 40%; font-variant-numeric: tabular-nums; }
/* the map keeps its own height: stretched to the pinning list's height, it was drawn as short as that list */
.gpuviz-dashboard .gpuviz-row { display: flex; gap: 8px; align-items: flex-start; }
.gpuviz-dashboard .gpuviz-map { flex: 3; min-width: 0; }
.gpuviz-dashboard .gpuviz-pinning { flex: 1; overflow: auto; max-height: 600px; }
.gpuviz-dashboard .gpuviz-pinning:empty { display: none; }
.gpuviz-dashboard details { margin-top: 6px; }
.gpuviz-dashboard .gpuviz-nav { margin: 2px 0; min-height: 1.2em; }
.gpuviz-dashboard .gpuviz-nav a { cursor: pointer; color: #3b6fb6; text-decoration: underline; }
"""

ESM_HELPERS = """
const CONFIG = {responsive: true, displaylogo: false};

function plotly() {  // the PlotlyLibrary model loads it; wait for it
  return new Promise((resolve) => {
    const check = () => (globalThis.Plotly ? resolve(globalThis.Plotly) : setTimeout(check, 20));
    check();
  });
}

function element(tag, className, parent) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (parent) parent.appendChild(node);
  return node;
}

"""
"""What every gpuviz widget's ES module starts with: the plot config, waiting for plotly.js
(the PlotlyLibrary model loads it), and making elements."""

DASHBOARD_ESM = (
    ESM_HELPERS
    + """
async function render({ model, el }) {
  el.classList.add("gpuviz-dashboard");
  const header = element("div", "gpuviz-header", el);
  const controls = element("div", "gpuviz-controls", el);
  const device = element("select", "gpuviz-device", controls);
  const stops = element("select", "gpuviz-stops", controls);
  const sliderRow = element("div", "gpuviz-controls", el);
  const slider = element("input", "gpuviz-slider", sliderRow);
  slider.type = "range";
  slider.step = "1";
  slider.setAttribute("aria-label", "event");
  const label = element("span", "gpuviz-slider-label", sliderRow);
  const nav = element("div", "gpuviz-nav", el);
  const row = element("div", "gpuviz-row", el);
  const divs = {map: element("div", "gpuviz-plot gpuviz-map", row)};
  const pinning = element("div", "gpuviz-pinning", row);
  divs.timeline = element("div", "gpuviz-plot gpuviz-timeline", el);
  divs.active = element("div", "gpuviz-plot gpuviz-active", el);
  const summaryBox = element("details", "", el);
  element("summary", "", summaryBox).textContent = "Summary";
  const summary = element("div", "", summaryBox);
  summaryBox.open = true;
  const placementBox = element("details", "", el);
  element("summary", "", placementBox).textContent = "Placement";
  const placement = element("div", "", placementBox);

  const count = (name) => { el.dataset[name] = String(Number(el.dataset[name] || 0) + 1); };
  const texts = () => {
    header.innerHTML = model.get("header");
    label.textContent = model.get("slider_label");
    pinning.innerHTML = model.get("pinning_html");
    summary.innerHTML = model.get("summary_html");
    placement.innerHTML = model.get("placement_html");
  };
  const options = (select, pairs, value) => {
    select.replaceChildren(...pairs.map(([text, v]) => {
      const option = document.createElement("option");
      option.textContent = text;
      option.value = String(v);
      return option;
    }));
    select.value = String(value);
  };
  const controlsFromModel = () => {
    const names = model.get("devices");
    options(device, names.map((n) => [n, n]), model.get("device"));
    device.style.display = names.length ? "" : "none";
    const list = model.get("stops");
    options(stops, [["jump to…", ""], ...list], "");
    stops.style.display = list.length ? "" : "none";
    slider.max = String(model.get("max_position"));
    slider.value = String(model.get("position"));
    slider.disabled = !model.get("scrubbable");
  };
  const Plotly = await plotly();
  let drillable = false;
  const watchMap = () => {
    if (drillable || !divs.map.on) return;
    drillable = true;
    divs.map.on("plotly_click", (event) => {
      const point = event.points && event.points[0];
      const meta = (divs.map.layout || {}).meta || {};
      if (!point) return;
      if (meta.view === "overview") {  // a row of the overview: its group's segments
        const group = (meta.groups || [])[Math.round(Number(point.y))];
        if (group !== undefined) setView({level: "group", group, base: -1});
      } else if (meta.view === "group") {  // a segment's row: that segment alone
        const base = meta.dense  // an image of many segments: a row's first segment
          ? (meta.firsts || [])[Math.round(Number(point.y))]
          : (meta.bases || []).find((b) => "0x" + b.toString(16) === String(point.y));
        if (base !== undefined) setView({level: "segment", group: meta.group, base});
      }
    });
  };
  // One draw at a time per plot (Plotly.react is asynchronous: two at once could interleave); a
  // change that arrives while a draw runs is drawn when it ends, from the model's latest figure.
  const busy = {}, again = {};
  const draw = (name) => {
    if (busy[name]) { again[name] = true; return; }
    const text = model.get(name + "_json");
    if (!text) return;
    const figure = JSON.parse(text);
    const layout = figure.layout || {};
    if (name === "map") {  // its box's width; its height is its own
      const width = Math.floor(divs.map.getBoundingClientRect().width);
      if (width > 0) layout.width = width;
    }
    busy[name] = true;
    Promise.resolve(Plotly.react(divs[name], figure.data || [], layout, CONFIG))
      .then(() => { if (name === "map") watchMap(); count(name + "Draws"); })
      .finally(() => {
        busy[name] = false;
        if (again[name]) { again[name] = false; draw(name); }
      });
  };
  // the map's drill-down: breadcrumbs from map_view, clicks on the map set it (the kernel draws)
  const setView = (view) => { model.set("map_view", view); model.save_changes(); };
  const crumbs = () => {
    const view = model.get("map_view") || {};
    const trail = view.level === "group" || view.level === "segment" ? [["overview", {level: "overview"}]] : [];
    if (view.level === "group") trail.push([view.group, null]);
    if (view.level === "segment") {
      trail.push([view.group, {level: "group", group: view.group, base: -1}]);
      trail.push(["segment 0x" + Number(view.base).toString(16), null]);
    }
    if (view.level === "overview") trail.push(["overview of the segments (click a row)", null]);
    nav.replaceChildren();
    trail.forEach(([text, target], i) => {
      if (i) nav.appendChild(document.createTextNode(" \u203a "));
      const item = element(target ? "a" : "span", "", nav);
      item.textContent = text;
      if (target) item.addEventListener("click", () => setView({group: "", base: -1, ...target}));
    });
  };
  texts();
  controlsFromModel();
  crumbs();
  model.on("change:map_view", crumbs);
  // the map shares its row with the pinning list, which comes and goes: drawn again at its box's
  // width (draw sets it), not with Plotly.Plots.resize, which drops a layout's height when it has no
  // width of its own: the map's height would follow the row's other content and clip its segments.
  const resized = new ResizeObserver(() => { if (divs.map.data) draw("map"); });
  resized.observe(divs.map);
  for (const name of Object.keys(divs)) {
    draw(name);
    model.on("change:" + name + "_json", () => draw(name));
  }
  for (const name of ["header", "slider_label", "pinning_html", "summary_html", "placement_html"]) {
    model.on("change:" + name, texts);
  }
  for (const name of ["devices", "device", "stops", "max_position", "position", "scrubbable"]) {
    model.on("change:" + name, controlsFromModel);
  }
  const move = (position) => {
    const clamped = Math.max(0, Math.min(Number(model.get("max_position")), position));
    slider.value = String(clamped);
    model.set("position", clamped);
    model.save_changes();
  };
  slider.addEventListener("input", () => move(Number(slider.value)));
  // arrow keys step one event; handled here so that JupyterLab's shortcuts never take them
  el.dataset.lmSuppressShortcuts = "true";
  slider.addEventListener("keydown", (event) => {
    const steps = {ArrowLeft: -1, ArrowDown: -1, ArrowRight: 1, ArrowUp: 1, PageDown: -10, PageUp: 10};
    if (!(event.key in steps)) return;
    event.preventDefault();
    event.stopPropagation();
    move(Number(model.get("position")) + steps[event.key]);
  });
  stops.addEventListener("change", () => { if (stops.value !== "") move(Number(stops.value)); });
  // a click on the active-memory view: the map shows that moment (customdata: its log position)
  let clickable = false;
  const watchClicks = () => {
    if (clickable || !divs.active.on) return;
    clickable = true;
    divs.active.on("plotly_click", (event) => {
      const point = event.points && event.points[0];
      if (!point) return;
      model.set("clicked", Number(point.customdata)); model.save_changes();
    });
  };
  model.on("change:active_json", () => setTimeout(watchClicks, 0));
  setTimeout(watchClicks, 0);
  device.addEventListener("change", () => { model.set("device", device.value); model.save_changes(); });
  model.on("msg:custom", (message) => {
    const extend = message.extend;
    if (extend && divs[extend.figure].data) {
      Plotly.extendTraces(divs[extend.figure], {x: extend.x, y: extend.y}, extend.traces);
      count("extends");
    }
  });
  return () => { resized.disconnect(); for (const div of Object.values(divs)) Plotly.purge(div); };
}
export default { render };
"""
)
