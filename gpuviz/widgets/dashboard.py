"""The dashboard: fragmentation map, timeline, placement table and summary of an EventLog, in
ipywidgets with the two plots in one small anywidget (``Plots``).

``live=True`` follows the log from a background thread while it grows (never the kernel's
main thread): at most ``rate_hz`` times a second, and never more often than keeps the
thread's own time under ``budget`` (5 %) of wall time. Each live update costs what is new
since the last one (``LiveFollower``): new timeline points are appended to the drawn trace,
and the map is sent again only when the heap changed. When the run ends (``stop_live``) the
full views are drawn once: the profile, the map at the first OOM (else the peak) with what
pinned memory there, the timeline with its annotations, the tables.

The slider steps through the device's allocator events one by one (arrow keys step by one)
and is labelled with the event number and its time; ``stops`` jumps to every OOM, the peak,
every mark and evenly spaced instants. The device selector switches devices.
"""

from __future__ import annotations

import html
import logging
import threading
import time
from typing import Any

import ipywidgets as widgets
import numpy as np

from gpuviz.analysis.live import LiveFollower, LivePoints
from gpuviz.analysis.moments import oom_indices, opening_index, pinning, scrub_stops
from gpuviz.analysis.profile import Profile, ViewOptions, profile
from gpuviz.analysis.timeline import resample, timeline_series
from gpuviz.base.heapstate import HeapState
from gpuviz.base.units import format_size
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import KIND_NAMES, Kind
from gpuviz.views.fragmentation import map_layout, trace_specs
from gpuviz.views.static import static_html
from gpuviz.views.tables import TABLE_CSS, call_site_html, placement_html, summary_html
from gpuviz.views.timeline import timeline
from gpuviz.widgets.plots import Plots, to_json

__all__ = ["Dashboard"]

_LIVE_POINTS_PER_UPDATE = 200  # at most this many new timeline points per live update
MiB = float(1 << 20)


def _live_timeline(device: str, points: LivePoints | None, t0_ns: int) -> dict[str, Any]:
    """The live timeline: bytes in use and requested (MiB) against seconds since ``t0_ns``."""
    x = ((points.time_ns - t0_ns) / 1e9).tolist() if points is not None else []
    traces = []
    for name, color, values in (("in use", "#3b6fb6", "bytes_in_use"), ("requested", "#e8a33d", "bytes_requested")):
        y = (getattr(points, values) / MiB).tolist() if points is not None else []
        traces.append({"type": "scatter", "mode": "lines", "name": name, "x": x, "y": y,
                       "line": {"shape": "hv", "color": color}})  # fmt: skip
    return {
        "data": traces,
        "layout": {
            "title": {"text": f"{html.escape(device)}: memory (live)"},
            "xaxis": {"title": {"text": "time (s)"}},
            "yaxis": {"title": {"text": "MiB"}, "rangemode": "tozero"},
            "height": 320,
            "margin": {"l": 60, "r": 20, "t": 50, "b": 40},
            "uirevision": device,
        },
    }


def _thin(points: LivePoints, most: int) -> LivePoints:
    """At most ``most`` of ``points`` (evenly spaced, always keeping the highest and the last)."""
    if len(points) <= most:
        return points
    keep = np.unique(np.concatenate([np.linspace(0, len(points) - 1, most - 1).astype(np.int64),
                                     [int(np.argmax(points.bytes_in_use))]]))  # fmt: skip
    return LivePoints(*(getattr(points, f)[keep] for f in ("index", "time_ns", "bytes_in_use", "bytes_requested",
                                                             "pool_bytes")))  # fmt: skip


class Dashboard(widgets.VBox):  # type: ignore[misc]
    """All views of ``log`` in one widget. ``refresh()`` draws the full views from the log."""

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
        self.refresh_count = 0  # full draws
        self.live_updates = 0  # incremental updates drawn while live
        self.refresh_seconds = 0.0  # time spent drawing, both kinds
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._follower = LiveFollower(log)
        self._live_device: str | None = None
        self._timeline_points = 0
        self._quiet = False  # True while the code itself moves the controls
        self.header = widgets.HTML()
        self.device_select = widgets.Dropdown(description="device", options=[])
        self.stops = widgets.Dropdown(description="jump to", options=[], layout=widgets.Layout(width="40%"))
        self.slider = widgets.IntSlider(description="event", min=0, max=0, continuous_update=True, readout=False,
                                        layout=widgets.Layout(width="50%"))  # fmt: skip
        self.slider_label = widgets.HTML(layout=widgets.Layout(width="50%"))
        self.plots = Plots(layout=widgets.Layout(width="75%"))
        self.pinning = widgets.HTML(layout=widgets.Layout(width="25%"))
        self.placement = widgets.HTML()
        self.summary = widgets.HTML()
        tabs = widgets.Tab(children=[self.summary, self.placement])
        for i, name in enumerate(("Summary", "Placement")):
            tabs.set_title(i, name)
        super().__init__([
            self.header, widgets.HBox([self.device_select, self.stops]),
            widgets.HBox([self.slider, self.slider_label]), widgets.HBox([self.plots, self.pinning]), tabs,
        ])  # fmt: skip
        self.add_class("gpuviz-dashboard")
        self.slider_label.add_class("gpuviz-slider-label")
        self.device_select.observe(self._on_device, names="value")
        self.slider.observe(self._on_slider, names="value")
        self.stops.observe(self._on_stop, names="value")
        if live:
            self.header.value = f"<b>{html.escape(title)}</b> · starting…"
            self.slider.disabled = True
            self.start_live()
        else:
            self.refresh()

    # ------------------------------------------------------------------ live
    def start_live(self) -> None:
        """Follow the log from a background thread (the first update at once)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpuviz-dashboard", daemon=True)
        self._thread.start()

    def stop_live(self, *, wait: bool = True) -> None:
        """Stop following and draw the full views once (from the background thread when
        ``wait`` is False, so the caller returns at once)."""
        thread, self._thread = self._thread, None
        if thread is None:
            if wait:
                self.refresh()
            return
        self._stop.set()
        if wait:
            thread.join()

    def _run(self) -> None:
        log = logging.getLogger("gpuviz")
        last_cost = 0.0
        while True:
            start = time.perf_counter()
            try:
                self.live_update()
            except Exception:  # an update must never kill the thread; the next one retries
                log.exception("dashboard update failed")
            last_cost = time.perf_counter() - start
            if self._stop.wait(max(1.0 / self.rate_hz, last_cost / self.budget) - last_cost):
                break
        try:
            self.refresh()
        except Exception:
            log.exception("dashboard refresh failed")

    def live_update(self) -> None:
        """Draw what is new in the log since the last update (cheap: see the module doc)."""
        with self._lock:
            start = time.perf_counter()
            updates = self._follower.update()
            heaps = self._follower.heaps
            device = self.options.device if self.options.device in heaps else None
            if device is None and heaps:
                gpus = [d for d in heaps if d.startswith("GPU")]
                device = (gpus or list(heaps))[0]
            points, changed = updates.get(device, (None, False)) if device is not None else (None, False)
            t0 = int(self.event_log["time_ns"][0]) if len(self.event_log) else 0
            if device is not None and device != self._live_device:
                self._live_device, self._timeline_points, changed = device, 0, True
                self.device_select.options = [device]
            if device is not None and points is not None and len(points):
                self._append_points(device, _thin(points, _LIVE_POINTS_PER_UPDATE), t0)
            elif device is not None and self._timeline_points == 0:
                self.plots.timeline_json = to_json(_live_timeline(device, None, t0))
            if device is not None and changed:
                state = self._follower.state(device)
                self._show_map(state, f"{device} (live)")
                n = len(self.event_log)
                t = (int(self.event_log["time_ns"][n - 1]) - t0) / 1e9 if n else 0.0
                self.slider_label.value = f"live · event {n - 1} · {t:.3f} s"
            self.header.value = (
                f"<b>{html.escape(self.title)}</b> · {len(self.event_log)} events · running"
                f" · {self.live_updates + 1} updates"
            )
            self.live_updates += 1
            self.refresh_seconds += time.perf_counter() - start

    def _append_points(self, device: str, points: LivePoints, t0: int) -> None:
        if self._timeline_points == 0 or self._timeline_points > 4 * self.options.points:
            if self._timeline_points:  # too many drawn: draw the whole run again, reduced
                reduced = resample(timeline_series(self.event_log, device), self.options.points)
                points = LivePoints(reduced.time_ns, reduced.time_ns, reduced.maximum["bytes_in_use"],
                                    reduced.maximum["bytes_requested"], reduced.maximum["pool_bytes"])  # fmt: skip
            self.plots.timeline_json = to_json(_live_timeline(device, points, t0))
            self._timeline_points = len(points)
            return
        x = ((points.time_ns - t0) / 1e9).tolist()
        in_use, requested = (points.bytes_in_use / MiB).tolist(), (points.bytes_requested / MiB).tolist()
        self.plots.extend("timeline", [0, 1], [x, x], [in_use, requested])
        self._timeline_points += len(points)

    # ------------------------------------------------------------------ full
    def refresh(self) -> None:
        """Compute the profile of the log and draw every view, opening the map at the first
        OOM of the shown device (else its peak)."""
        with self._lock:
            start = time.perf_counter()
            p = profile(self.event_log, self.options, strict=False)
            self.profile = p
            devices = list(p.devices)
            chosen = self.device_select.value if self.device_select.value in devices else p.device
            self._quiet = True
            try:
                if list(self.device_select.options) != devices:
                    self.device_select.options = devices
                if chosen is not None:
                    self.device_select.value = chosen
            finally:
                self._quiet = False
            self._draw_device(chosen)
            tables = placement_html(p.placements) if len(p.placements) else "<p>No ops recorded.</p>"
            if len(p.call_sites):
                tables += "<h4>Call sites</h4>" + call_site_html(p.call_sites)
            self.placement.value = f"<style>{TABLE_CSS}</style><div class='gpuviz'>{tables}</div>"
            self.summary.value = (
                f"<style>{TABLE_CSS}</style><div class='gpuviz'>"
                + summary_html(p.diagnosis, group_by=self.options.group_by)
                + "</div>"
            )
            self.header.value = f"<b>{html.escape(self.title)}</b> · {len(self.event_log)} events · devices: " + (
                html.escape(", ".join(devices or ["none"]))
            )
            self.slider.disabled = False
            self.refresh_count += 1
            self.refresh_seconds += time.perf_counter() - start

    def _draw_device(self, device: str | None) -> None:
        p = self.profile
        if p is None or device is None or device not in p.devices:
            self.stops.options = []
            return
        dp = p.devices[device]
        log = self.event_log
        positions = dp.series.index
        opening = opening_index(log, device, series=dp.series)
        ooms = set(oom_indices(log, device).tolist())
        kinds = log["kind"]
        labels = []
        for index in scrub_stops(log, device, count=self.options.scrub_points, series=dp.series).tolist():
            at = max(int(np.searchsorted(positions, index, side="right")) - 1, 0)
            what = (
                "OOM · " if index in ooms else "peak · " if index == dp.peak.index
                else f"mark {log.strings[log['tag'][index]]!r} · " if kinds[index] == Kind.MARK else ""
            )  # fmt: skip
            labels.append((f"{what}event {index}", at))
        self._quiet = True
        try:
            self.stops.options = labels
            self.stops.value = None
            self.slider.max = max(len(positions) - 1, 0)
            at = int(np.searchsorted(positions, opening, side="right")) - 1 if opening >= 0 else len(positions) - 1
            self.slider.value = max(at, 0)
        finally:
            self._quiet = False
        self._draw_map(device, self.slider.value)
        figure = timeline(
            dp.series, t0_ns=p.t0_ns, points=self.options.points, transfers=p.transfers, marks=p.marks,
            ooms=p.ooms[p.ooms["device"] == device] if len(p.ooms) else None,
            segments=p.segments[p.segments["device"] == device] if len(p.segments) else None, peak=dp.peak,
        ).to_plotly_json()  # fmt: skip
        figure["layout"]["uirevision"] = device
        self.plots.timeline_json = to_json(figure)

    def _show_map(self, state: HeapState, title: str) -> None:
        options = self.options
        layout = map_layout(state, title=title)
        layout["uirevision"] = state.device  # zoom and pan survive scrubbing
        data = trace_specs(state, color_by=options.color_by, max_rectangles=options.max_rectangles,
                           stacks=self.event_log.stacks)  # fmt: skip
        self.plots.map_json = to_json({"data": data, "layout": layout})

    def _draw_map(self, device: str, position: int) -> None:
        """The map after the ``position``-th allocator event of ``device``, its label, and at an
        OOM what pinned the free holes apart."""
        p = self.profile
        if p is None or device not in p.devices or not len(p.devices[device].series):
            return
        dp = p.devices[device]
        log = self.event_log
        index = int(dp.series.index[min(position, len(dp.series) - 1)])
        state = dp.state_at(index)
        kind = KIND_NAMES[int(log["kind"][index])]
        seconds = (int(log["time_ns"][index]) - p.t0_ns) / 1e9
        self._show_map(state, f"{device} after event {index} ({kind})")
        what = " · OOM" if kind == "oom" else " · peak" if index == dp.peak.index else ""
        self.slider_label.value = f"event {index} of {len(log) - 1} · {seconds:.6f} s · {kind}{what}"
        self.pinning.value = self._pinning_html(state, index) if kind == "oom" else ""

    def _pinning_html(self, state: HeapState, index: int) -> str:
        log = self.event_log
        request = int(log["requested"][index]) or int(log["size"][index])
        found = pinning(state, request, log=log, at_index=index)
        rows = []
        best = found.best
        for chunk in best.chunks if best is not None else ():
            age = f"{chunk.age_ns / 1e9:.3f} s" if chunk.age_ns >= 0 else "?"
            rows.append(
                f"<tr><td>{html.escape(chunk.tag or '')}</td><td>{format_size(chunk.size)}</td>"
                f"<td>{html.escape(chunk.call_site or '')}</td><td>{chunk.alloc_index}</td><td>{age}</td></tr>"
            )
        table = (
            "<table><thead><tr><th>tag</th><th>size</th><th>call site</th><th>allocated at event</th>"
            f"<th>alive</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
            if rows else ""
        )  # fmt: skip
        return (
            f"<style>{TABLE_CSS}</style><div class='gpuviz gpuviz-pinning'><b>Out of memory: "
            f"{format_size(request)} requested</b><p>{html.escape(found.sentence())}</p>{table}</div>"
        )

    # -------------------------------------------------------------- controls
    def _on_device(self, change: dict[str, Any]) -> None:
        if not self._quiet and change["new"] is not None and self.profile is not None:
            self._draw_device(change["new"])

    def _on_slider(self, change: dict[str, Any]) -> None:
        device = self.device_select.value
        if not self._quiet and device is not None and self.profile is not None:
            self._draw_map(device, int(change["new"]))

    def _on_stop(self, change: dict[str, Any]) -> None:
        if not self._quiet and change["new"] is not None:
            self.slider.value = int(change["new"])

    # ------------------------------------------------------------------ display
    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle: dict[str, Any] = dict(super()._repr_mimebundle_(**kwargs) or {})
        if self.profile is not None:
            bundle["text/html"] = static_html(self.profile, title=self.title)
        bundle["text/plain"] = f"<gpuviz Dashboard: {len(self.event_log)} events>"
        return bundle
