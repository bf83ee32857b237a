"""The live dashboard: fragmentation map, timeline, placement table and summary of an
EventLog, in ipywidgets with plotly ``FigureWidget``s.

``live=True`` refreshes from a background thread while the log grows: at most
``rate_hz`` times a second, and never more often than keeps refresh time under
``budget`` (5 %) of wall time, so drawing costs the workload little. The time slider
scrubs the fragmentation map through history (replay); the device selector switches
devices.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from gpuviz.analysis.profile import Profile, ViewOptions, profile
from gpuviz.log.eventlog import EventLog
from gpuviz.views.fragmentation import fragmentation_map
from gpuviz.views.static import static_html
from gpuviz.views.tables import TABLE_CSS, call_site_html, placement_html, summary_html
from gpuviz.views.timeline import timeline

__all__ = ["Dashboard"]


def _replace(widget: go.FigureWidget, figure: go.Figure) -> None:
    """Show ``figure`` in ``widget`` (traces and layout replaced)."""
    with widget.batch_update():
        widget.data = ()
        widget.add_traces(list(figure.data))
        widget.layout = figure.layout


class Dashboard(widgets.VBox):  # type: ignore[misc]
    """All views of ``log`` in one widget. ``refresh()`` redraws from the log."""

    def __init__(
        self,
        log: EventLog,
        options: ViewOptions | None = None,
        *,
        live: bool = False,
        rate_hz: float = 5.0,
        budget: float = 0.05,
        title: str = "gpuviz",
    ) -> None:
        if rate_hz <= 0 or not 0 < budget <= 1:
            raise ValueError("rate_hz must be > 0 and budget in (0, 1]")
        self.event_log = log
        self.options = options or ViewOptions()
        self.rate_hz = rate_hz
        self.budget = budget
        self.title = title
        self.profile: Profile | None = None
        self.refresh_count = 0
        self.refresh_seconds = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen = -1
        self.header = widgets.HTML()
        self.device_select = widgets.Dropdown(description="device", options=[])
        self.slider = widgets.IntSlider(description="event", min=0, max=0, continuous_update=True,
                                        layout=widgets.Layout(width="60%"))  # fmt: skip
        self.map = go.FigureWidget()
        self.timeline = go.FigureWidget()
        self.placement = widgets.HTML()
        self.summary = widgets.HTML()
        tabs = widgets.Tab(
            children=[widgets.VBox([self.slider, self.map]), self.timeline, self.placement, self.summary]
        )
        for i, name in enumerate(("Fragmentation map", "Timeline", "Placement", "Summary")):
            tabs.set_title(i, name)
        super().__init__([self.header, widgets.HBox([self.device_select]), tabs])
        self.add_class("gpuviz-dashboard")
        self.device_select.observe(self._on_device, names="value")
        self.slider.observe(self._on_slider, names="value")
        self.refresh()
        if live:
            self.start_live()

    # ------------------------------------------------------------------ drawing
    def refresh(self) -> None:
        """Recompute the profile of the log and redraw everything."""
        with self._lock:
            start = time.perf_counter()
            self._seen = len(self.event_log)
            p = profile(self.event_log, self.options, strict=False)
            self.profile = p
            devices = list(p.devices)
            if list(self.device_select.options) != devices:
                self.device_select.options = devices
            chosen = self.device_select.value if self.device_select.value in devices else p.device
            if chosen is not None and self.device_select.value != chosen:
                self.device_select.value = chosen  # triggers _on_device -> _draw_device
            else:
                self._draw_device(chosen)
            tables = placement_html(p.placements) if len(p.placements) else "<p>No ops recorded yet.</p>"
            if len(p.call_sites):
                tables += "<h4>Call sites</h4>" + call_site_html(p.call_sites)
            self.placement.value = f"<style>{TABLE_CSS}</style><div class='gpuviz'>{tables}</div>"
            self.summary.value = (
                f"<style>{TABLE_CSS}</style><div class='gpuviz'>"
                + summary_html(p.diagnosis, group_by=self.options.group_by)
                + "</div>"
            )
            self.header.value = f"<b>{self.title}</b> · {len(self.event_log)} events · devices: " + ", ".join(
                devices or ["none yet"]
            )
            self.refresh_count += 1
            self.refresh_seconds += time.perf_counter() - start

    def _draw_device(self, device: str | None) -> None:
        p = self.profile
        if p is None or device is None or device not in p.devices:
            return
        dp = p.devices[device]
        n = len(dp.series)
        at_end = self.slider.value >= self.slider.max
        self.slider.max = max(n - 1, 0)
        if at_end or self.slider.value > self.slider.max:
            self.slider.value = self.slider.max
        self._draw_map(device, self.slider.value)
        transfers = p.transfers
        figure = timeline(
            dp.series, t0_ns=p.t0_ns, points=self.options.points, transfers=transfers, marks=p.marks,
            ooms=p.ooms[p.ooms["device"] == device] if len(p.ooms) else None,
            segments=p.segments[p.segments["device"] == device] if len(p.segments) else None, peak=dp.peak,
        )  # fmt: skip
        _replace(self.timeline, figure)

    def _draw_map(self, device: str, position: int) -> None:
        p = self.profile
        if p is None or device not in p.devices or not len(p.devices[device].series):
            return
        dp = p.devices[device]
        index = int(dp.series.index[min(position, len(dp.series) - 1)])
        state = dp.state_at(index)
        figure = fragmentation_map(
            state, color_by=self.options.color_by, max_rectangles=self.options.max_rectangles,
            title=f"{device} after event {index}", stacks=p.log.stacks,
        )  # fmt: skip
        _replace(self.map, figure)

    def _on_device(self, change: dict[str, Any]) -> None:
        self.slider.value = 10**12  # show the newest state of the new device
        self._draw_device(change["new"])

    def _on_slider(self, change: dict[str, Any]) -> None:
        device = self.device_select.value
        if device is not None:
            self._draw_map(device, int(change["new"]))

    # --------------------------------------------------------------------- live
    def start_live(self) -> None:
        """Refresh from a background thread while the log grows."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpuviz-dashboard", daemon=True)
        self._thread.start()

    def stop_live(self) -> None:
        """Stop refreshing (and draw the final state once)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()
        self.refresh()

    def _run(self) -> None:
        last_cost = 0.0
        while not self._stop.wait(max(1.0 / self.rate_hz, last_cost / self.budget)):
            if len(self.event_log) == self._seen:
                continue
            start = time.perf_counter()
            try:
                self.refresh()
            except Exception:  # a refresh must never kill the thread; the next one retries
                import logging

                logging.getLogger("gpuviz").exception("dashboard refresh failed")
            last_cost = time.perf_counter() - start

    # ------------------------------------------------------------------ display
    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle: dict[str, Any] = dict(super()._repr_mimebundle_(**kwargs) or {})
        if self.profile is not None:
            bundle["text/html"] = static_html(self.profile, title=self.title)
        bundle["text/plain"] = f"<gpuviz Dashboard: {len(self.event_log)} events>"
        return bundle
