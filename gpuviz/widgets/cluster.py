"""The notebook view of a distributed run: the ranks x time heatmap (bytes in use or
fragmentation), the per-rank table with outliers highlighted, and a selection that opens one
rank's full views (the ``Dashboard`` that ``%gpuviz show FILE`` shows, opened at that device's
first OOM, else its peak) below them.

``ClusterView`` is one anywidget (its ES module below). It reads ``header``, ``metric``,
``heatmap_json``, ``table_html`` and ``rows`` (the dropdown's labels, one per table row) and
writes ``metric`` (the switch) and ``selected`` (a table row: picked in the dropdown, or by a
click on a heatmap row or a table row). ``ClusterDashboard`` puts it above the selected rank's
``Dashboard`` and opens only that rank's file when the selection changes.
"""

from __future__ import annotations

import html
from typing import Any

import anywidget
import ipywidgets as widgets
import traitlets

from gpuviz.analysis.cluster import DEFAULT_THRESHOLD, ClusterSummary, alignment, cluster_summary
from gpuviz.analysis.profile import ViewOptions
from gpuviz.analysis.run import RankLog, Run, load_run
from gpuviz.base.errors import GpuvizError
from gpuviz.views.cluster import CLUSTER_CSS, cluster_heatmap, cluster_table_html, cluster_text
from gpuviz.widgets.dashboard import Dashboard
from gpuviz.widgets.frontend import ESM_HELPERS
from gpuviz.widgets.plots import PlotlyLibrary, plotly_library, to_json

__all__ = ["ClusterDashboard", "ClusterView", "show_run"]

_CSS = """
.gpuviz-cluster-view { font-family: sans-serif; font-size: 13px; }
.gpuviz-cluster-view .gpuviz-controls { display: flex; gap: 12px; align-items: center; margin: 4px 0; }
.gpuviz-cluster-view .gpuviz-cluster-table { max-height: 360px; overflow: auto; }
""" + CLUSTER_CSS.replace("table.gpuviz-cluster", ".gpuviz-cluster-view table.gpuviz-cluster")

_ESM = (
    ESM_HELPERS
    + """
async function render({ model, el }) {
  el.classList.add("gpuviz-cluster-view");
  const header = element("div", "gpuviz-header", el);
  const controls = element("div", "gpuviz-controls", el);
  const metric = element("select", "gpuviz-metric", controls);
  for (const [value, text] of [["bytes_in_use", "bytes in use"], ["fragmentation", "fragmentation"]]) {
    const option = element("option", "", metric);
    option.value = value;
    option.textContent = text;
  }
  const rank = element("select", "gpuviz-rank", controls);
  const heatmap = element("div", "gpuviz-plot gpuviz-heatmap", el);
  const table = element("div", "gpuviz-cluster-table", el);
  const count = (name) => { el.dataset[name] = String(Number(el.dataset[name] || 0) + 1); };
  const select = (row) => {
    if (!(row >= 0)) return;
    model.set("selected", row);
    model.save_changes();
    count("selections");
  };
  const fromModel = () => {
    header.innerHTML = model.get("header");
    metric.value = model.get("metric");
    const labels = model.get("rows");
    const first = document.createElement("option");
    first.textContent = "open a rank's views…";
    first.value = "";
    rank.replaceChildren(first, ...labels.map((text, row) => {
      const option = document.createElement("option");
      option.textContent = text;
      option.value = String(row);
      return option;
    }));
    rank.value = model.get("selected") >= 0 ? String(model.get("selected")) : "";
    table.innerHTML = model.get("table_html");
  };
  const Plotly = await plotly();
  let listening = false;
  const draw = async () => {
    const text = model.get("heatmap_json");
    if (!text) return;
    const figure = JSON.parse(text);
    await Plotly.react(heatmap, figure.data || [], figure.layout || {}, CONFIG);
    count("heatmapDraws");
    if (!listening) {  // a click on a cell selects its row (rows are table rows, in order)
      heatmap.on("plotly_click", (event) => select(Number(event.points[0].pointNumber[0])));
      listening = true;
    }
  };
  fromModel();
  await draw();
  for (const name of ["header", "metric", "rows", "selected", "table_html"]) model.on("change:" + name, fromModel);
  model.on("change:heatmap_json", draw);
  metric.addEventListener("change", () => { model.set("metric", metric.value); model.save_changes(); });
  rank.addEventListener("change", () => { if (rank.value !== "") select(Number(rank.value)); });
  table.addEventListener("click", (event) => {
    const row = event.target.closest("tr[data-row]");
    if (row) select(Number(row.dataset.row));
  });
  return () => Plotly.purge(heatmap);
}
export default { render };
"""
)


class ClusterView(anywidget.AnyWidget):
    """The heatmap, the metric switch, the rank dropdown and the per-rank table of one summary."""

    _esm = _ESM
    _css = _CSS
    library = traitlets.Instance(PlotlyLibrary).tag(sync=True, **widgets.widget_serialization)
    header = traitlets.Unicode("").tag(sync=True)
    metric = traitlets.Unicode("bytes_in_use").tag(sync=True)
    heatmap_json = traitlets.Unicode("").tag(sync=True)
    table_html = traitlets.Unicode("").tag(sync=True)
    rows = traitlets.List(traitlets.Unicode()).tag(sync=True)
    selected = traitlets.Int(-1).tag(sync=True)  # a row of the summary's table; -1: none

    def __init__(self, summary: ClusterSummary, *, header: str = "", align: str = "auto") -> None:
        alignment(summary, align)  # a bad value is refused before anything is drawn
        super().__init__(library=plotly_library())
        self.summary = summary
        self.align = align
        labels = [f"{row['device']}{'  ⚠ ' + row['outlier'] if row['outlier'] else ''}"
                  for row in summary.table.to_dict("records")]  # fmt: skip
        self.set_trait("header", header)
        self.set_trait("rows", labels)
        self.set_trait("table_html", cluster_table_html(summary))
        self._draw(self.metric)
        self.observe(lambda change: self._draw(change["new"]), names="metric")

    def _draw(self, metric: str) -> None:
        if metric not in ("bytes_in_use", "fragmentation"):
            raise traitlets.TraitError(f"metric must be bytes_in_use or fragmentation, not {metric!r}")
        self.heatmap_json = to_json(cluster_heatmap(self.summary, metric, align=self.align).to_plotly_json())


class ClusterDashboard(widgets.VBox):  # type: ignore[misc]  # ipywidgets has no type hints
    """A run's ``ClusterView`` above the full views of the selected rank.

    ``select(row)`` (what the front-end's dropdown and clicks do through ``view.selected``)
    opens the file of table row ``row`` (that file only) as ``rank_log`` and shows its
    ``Dashboard`` (``rank_dashboard``) on that row's device, closing the one shown before (so
    only one rank's log is held). A file that cannot be read leaves the previous selection
    shown and says why in ``view.header``.
    """

    def __init__(
        self,
        run: Run,
        summary: ClusterSummary | None = None,
        options: ViewOptions | None = None,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        title: str = "gpuviz run",
        align: str = "auto",
    ) -> None:
        self.run = run
        self.summary = summary if summary is not None else cluster_summary(run, threshold=threshold)
        self.options = options or ViewOptions()
        self.title = title
        self.rank_log: RankLog | None = None
        self.rank_dashboard: Dashboard | None = None
        self._quiet = False  # True while ``select`` itself moves the selection
        self._row = -1  # the table row whose rank is shown
        self._positions = {path.name: position for position, path in enumerate(run.paths)}
        self._header = self._facts()
        self.view = ClusterView(self.summary, header=self._header, align=align)
        self.detail = widgets.VBox()
        super().__init__([self.view, self.detail])
        self.view.observe(self._on_selected, names="selected")

    def _facts(self) -> str:
        lines = cluster_text(self.summary).splitlines()
        return f"<b>{html.escape(self.title)}</b> · {html.escape(lines[0])}<br>{html.escape(lines[-1])}"

    def _on_selected(self, change: dict[str, Any]) -> None:
        if change["new"] >= 0 and not self._quiet:
            self.select(int(change["new"]))

    def select(self, row: int) -> Dashboard:
        """Open table row ``row``'s rank (its file only) and show its full views on its device."""
        table = self.summary.table
        if not 0 <= row < len(table):
            raise IndexError(f"row {row} is not a row of the run's table (0..{len(table) - 1})")
        file, device = str(table["file"].iloc[row]), str(table["device"].iloc[row])
        if file not in self._positions:
            raise ValueError(f"{file} is not a file of this run")
        try:
            rank_log = self.run.open(self._positions[file])
        except (OSError, GpuvizError, ValueError) as error:
            self.view.header = self._header + f"<br><b>cannot open {html.escape(file)}</b>: {html.escape(str(error))}"
            self._show_selected(self._row)
            raise
        dashboard = Dashboard(rank_log.log, self.options.with_(device=device), title=f"{device} ({file})")
        previous = self.rank_dashboard
        self.rank_log, self.rank_dashboard = rank_log, dashboard
        self.view.header = self._header
        self._row = row
        self._show_selected(row)
        self.detail.children = (dashboard,)
        if previous is not None:  # one rank's log held at a time: the previous one's widget goes
            previous.close()
        return dashboard

    def _show_selected(self, row: int) -> None:
        """Move the front-end's selection to ``row`` without opening it (again)."""
        if self.view.selected != row:
            self._quiet = True
            try:
                self.view.selected = row
            finally:
                self._quiet = False

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """The widget view, with the table as static HTML for front-ends without a kernel."""
        shown = super()._repr_mimebundle_(**kwargs) or {}  # ipywidgets: the data only
        data, metadata = shown if isinstance(shown, tuple) else (shown, {})
        bundle: dict[str, Any] = dict(data)
        bundle["text/html"] = f"<style>{CLUSTER_CSS}</style><div>{self._header}</div>{cluster_table_html(self.summary)}"
        bundle["text/plain"] = f"<gpuviz ClusterDashboard: {len(self.summary.table)} devices of {len(self.run)} files>"
        return bundle, dict(metadata)


def show_run(
    source: str | Run, options: ViewOptions | None = None, *, threshold: float = DEFAULT_THRESHOLD, align: str = "auto"
) -> ClusterDashboard:
    """The ``ClusterDashboard`` of the run in directory (or glob, or run manifest) ``source``; a
    notebook shows it when it is a cell's value. ``align``: how the heatmap lines ranks up in
    time (``gpuviz.views.cluster.cluster_grid``)."""
    run = source if isinstance(source, Run) else load_run(source)
    name = str(source).rstrip("/").rsplit("/", 1)[-1] if not isinstance(source, Run) else "run"
    return ClusterDashboard(run, options=options, threshold=threshold, title=f"gpuviz run: {name}", align=align)
