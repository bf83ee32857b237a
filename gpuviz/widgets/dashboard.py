"""The dashboard: fragmentation map, timeline, placement table and summary of an EventLog, as
one anywidget (its front-end: ``gpuviz.widgets.frontend``; plotly.js: ``PlotlyLibrary``, sent
once per kernel). One widget is one comm, so showing a dashboard costs a few milliseconds.

``live=True`` follows the log from a background thread while it grows (never the kernel's
main thread): at most ``rate_hz`` times a second (6 by default: a margin over the 5 a second
that a user should see even when a busy cell delays a message), and never more often than keeps the
thread's own CPU time under ``budget`` (5 %) of wall time (``Pacer``: over any stretch, with
at most ``BURST_S`` seconds' worth of budget saved up, so that one dearer update does not
postpone the next). Each live update costs what is new
since the last one (``LiveFollower``, which reads only the new rows): new timeline points are
appended to the drawn trace (when too many are drawn, the drawn ones are reduced, the log is
not read again), and the map is sent again only when the heap changed, and no more often than
keeps its own drawing under ``MAP_SHARE`` of wall time. Up to ``LIVE_EXACT_CHUNKS`` chunks in
use the live map draws every chunk; a bigger heap is drawn in buckets (``live_map``), at a cost
that does not grow with its chunks. When the run ends (``stop_live``) the
full views are drawn once: the profile, the map at the first OOM (else the peak) with what
pinned memory there, the timeline with its annotations, the tables.

The slider steps through the device's allocator events one by one (arrow keys step by one)
and is labelled with the event number and its time; ``stops`` jumps to every OOM, the peak,
every mark and evenly spaced instants. The device selector switches devices. A click on the
active-memory view moves the slider (and the map) to that moment.

A heap of many segments opens as the map's overview (``gpuviz.views.drilldown``: one row per
group of ``overview.segment_groups``, with its totals); a click on a group draws its segments,
a click on a segment draws it alone (``map_view``: the level shown, which the slider keeps
while the group or segment exists, and the breadcrumbs above the map go back up).
"""

from __future__ import annotations

import html
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import anywidget
import ipywidgets as widgets
import numpy as np
import traitlets

from gpuviz.analysis.advice import Advice
from gpuviz.analysis.integrity import integrity_lines
from gpuviz.analysis.live import LiveFollower, LivePoints
from gpuviz.analysis.moments import Pinning, oom_indices, opening_index, pinning, scrub_stops
from gpuviz.analysis.profile import Profile, ViewOptions, profile
from gpuviz.analysis.timeline import devices_by_peak, times_inferred
from gpuviz.base.units import format_size
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import KIND_NAMES, Kind
from gpuviz.views.active import active_grouping, active_spec
from gpuviz.views.advice import advice_html
from gpuviz.views.drilldown import MAP, OVERVIEW, Heap, MapView, view_spec
from gpuviz.views.livemap import live_map
from gpuviz.views.oom import pinning_html
from gpuviz.views.static import static_html
from gpuviz.views.tables import TABLE_CSS, call_site_html, placement_html, summary_html, warnings_html
from gpuviz.views.timeline import timeline
from gpuviz.widgets.frontend import DASHBOARD_CSS, DASHBOARD_ESM
from gpuviz.widgets.plots import PlotlyLibrary, plotly_library, to_json

__all__ = ["BURST_S", "Dashboard", "Pacer"]

_LIVE_POINTS_PER_UPDATE = 200  # at most this many new timeline points per live update
MAP_SHARE = 0.02
"""Live map redraws take at most this share of wall time (of the thread's ``budget``)."""
LIVE_EXACT_CHUNKS = 256
"""The live map draws each chunk up to this many chunks in use, more in buckets (``live_map``)."""
MiB = float(1 << 20)
BURST_S = 1.0
"""The live thread saves up at most this many seconds' worth of its CPU budget (``Pacer``)."""


class Pacer:
    """When live updates are due (``time.perf_counter`` seconds): at most ``rate_hz`` a second,
    on a fixed schedule (late wake-ups do not add up), and within ``budget`` of wall time in the
    thread's CPU time. The budget accrues as wall time passes, up to ``BURST_S`` seconds' worth;
    an update spends its CPU time from it, and while it is overspent the next update waits
    until it is paid back."""

    def __init__(self, *, rate_hz: float, budget: float, now: float) -> None:
        self.rate_hz, self.budget = rate_hz, budget
        self.due = now  # when the next update is due
        self.credit = 0.0  # CPU seconds that may be spent at once (negative: overspent)
        self._last = now

    def spent(self, cost: float, now: float) -> float:
        """Record an update that took ``cost`` seconds of CPU time and ended at ``now``; returns
        when the next one is due."""
        self.credit = min(self.credit + (now - self._last) * self.budget, self.budget * BURST_S) - cost
        self._last = now
        self.due = max(self.due + 1.0 / self.rate_hz, now + max(0.0, -self.credit) / self.budget)
        return self.due


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


_FIELDS = ("index", "time_ns", "bytes_in_use", "bytes_requested", "pool_bytes")


def _take(points: LivePoints, keep: np.ndarray) -> LivePoints:
    return LivePoints(*(getattr(points, f)[keep] for f in _FIELDS))


def _concat(first: LivePoints, second: LivePoints) -> LivePoints:
    return LivePoints(*(np.concatenate([getattr(first, f), getattr(second, f)]) for f in _FIELDS))


def _reduce(points: LivePoints, most: int) -> LivePoints:
    """About ``most`` of ``points``: in each of ``most // 2`` runs of equal length, the point of
    most bytes in use and the run's last point (so peaks and the newest point stay drawn)."""
    runs = max(1, most // 2)
    if len(points) <= most:
        return points
    bounds = np.linspace(0, len(points), runs + 1).astype(np.int64)
    highest = np.maximum.reduceat(points.bytes_in_use, bounds[:-1])
    run_of = np.repeat(np.arange(runs), np.diff(bounds))
    peaks = np.flatnonzero(points.bytes_in_use == highest[run_of])
    first_peak = peaks[np.unique(run_of[peaks], return_index=True)[1]]
    return _take(points, np.unique(np.concatenate([first_peak, bounds[1:] - 1])))


class Dashboard(anywidget.AnyWidget):
    """All views of ``log`` in one widget. ``refresh()`` draws the full views from the log."""

    _esm = DASHBOARD_ESM
    _css = DASHBOARD_CSS
    library = traitlets.Instance(PlotlyLibrary).tag(sync=True, **widgets.widget_serialization)
    header = traitlets.Unicode("").tag(sync=True)
    devices = traitlets.List(traitlets.Unicode()).tag(sync=True)
    device = traitlets.Unicode("").tag(sync=True)
    stops: traitlets.List[list[Any]] = traitlets.List().tag(sync=True)  # [label, slider position]
    position = traitlets.Int(0).tag(sync=True)  # the slider: the n-th allocator event of the device
    max_position = traitlets.Int(0).tag(sync=True)
    scrubbable = traitlets.Bool(False).tag(sync=True)
    slider_label = traitlets.Unicode("").tag(sync=True)
    map_json = traitlets.Unicode("").tag(sync=True)
    timeline_json = traitlets.Unicode("").tag(sync=True)
    active_json = traitlets.Unicode("").tag(sync=True)
    clicked = traitlets.Int(-1).tag(sync=True)  # a log position clicked in the active-memory view
    # the map's drill-down level: {"level": map|overview|group|segment, "group": name, "base": segment base}
    map_view: traitlets.Dict[str, Any] = traitlets.Dict({"level": OVERVIEW, "group": "", "base": -1}).tag(sync=True)
    pinning_html = traitlets.Unicode("").tag(sync=True)
    summary_html = traitlets.Unicode("").tag(sync=True)
    placement_html = traitlets.Unicode("").tag(sync=True)

    def __init__(
        self,
        log: EventLog,
        options: ViewOptions | None = None,
        *,
        live: bool = False,
        rate_hz: float = 6.0,
        budget: float = 0.05,
        title: str = "gpuviz",
        advisor: Callable[[EventLog], Advice | None] | None = None,
    ) -> None:
        if rate_hz <= 0 or not 0 < budget <= 1:
            raise ValueError("rate_hz must be > 0 and budget in (0, 1]")
        super().__init__(library=plotly_library())
        self.event_log = log
        self.options = options or ViewOptions()
        self.rate_hz = rate_hz
        self.budget = budget
        self.title = title
        # full draws add advisor(log): the run replayed under its allocator's settings (front-ends
        # pass gpuviz.frontends.options.advice_or_none; widgets never run allocators themselves)
        self.advisor = advisor
        self.profile: Profile | None = None
        self.refresh_count = 0  # full draws
        self.live_updates = 0  # incremental updates drawn while live
        self.refresh_seconds = 0.0  # time spent drawing, both kinds
        self.live_cpu_seconds = 0.0  # CPU time of the live updates (what they cost the cell)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._follower = LiveFollower(log)
        self._live_device: str | None = None
        self._drawn: LivePoints | None = None  # the live timeline's points drawn so far
        self._map_due = 0.0  # perf_counter time before which the live map is not redrawn
        self._map_stale = False  # the heap changed since the live map was drawn
        self._quiet = False  # True while the code itself moves the controls
        self._map_range: dict[str, list[int]] = {}  # per device: the map's x range while scrubbing
        self.observe(self._on_device, names="device")
        self.observe(self._on_slider, names="position")
        self.observe(self._on_clicked, names="clicked")
        self.observe(self._on_map_view, names="map_view")
        if live:
            self.header = f"<b>{html.escape(title)}</b> · starting…"
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
        pacer = Pacer(rate_hz=self.rate_hz, budget=self.budget, now=time.perf_counter())
        while True:
            cpu = time.thread_time()
            try:
                self.live_update()
            except Exception:  # an update must never kill the thread; the next one retries
                log.exception("dashboard update failed")
            cost = time.thread_time() - cpu  # this thread's CPU time: what the update took from the cell
            self.live_cpu_seconds += cost
            due = pacer.spent(cost, time.perf_counter())
            if self._stop.wait(max(0.0, due - time.perf_counter())):
                break
        try:
            self.refresh()
        except Exception:
            log.exception("dashboard refresh failed")

    def live_update(self) -> None:
        """Draw what is new in the log since the last update (cheap: see the module doc)."""
        with self._lock, self.hold_sync():  # one state message per update
            start = time.perf_counter()
            follower = self._follower
            updates = follower.update(most=_LIVE_POINTS_PER_UPDATE)
            heaps = follower.heaps
            device = self.options.device if self.options.device in heaps else None
            if device is None and heaps:
                gpus = [d for d in heaps if d.startswith("GPU")]
                device = (gpus or list(heaps))[0]
            points, changed = updates.get(device, (None, False)) if device is not None else (None, False)
            t0 = follower.first_time_ns or 0
            if device is not None and device != self._live_device:
                self._live_device, self._drawn, changed = device, None, True
                self.devices, self.device = [device], device
            if device is not None and points is not None and len(points):
                self._append_points(device, points, t0)
            elif device is not None and self._drawn is None:
                self.timeline_json = to_json(_live_timeline(device, None, t0))
            self._map_stale = self._map_stale or changed
            if device is not None and self._map_stale and start >= self._map_due:
                cpu = time.thread_time()
                self._show_live_map(device)
                self._map_stale = False
                self._map_due = start + (time.thread_time() - cpu) / MAP_SHARE
                n = follower.position
                t = ((follower.last_time_ns or 0) - t0) / 1e9
                self.slider_label = f"live · event {n - 1} · {t:.3f} s"
            self.header = (
                f"<b>{html.escape(self.title)}</b> · {len(self.event_log)} events · running"
                f" · {self.live_updates + 1} updates"
            )
            self.live_updates += 1
            self.refresh_seconds += time.perf_counter() - start

    def _show_live_map(self, device: str) -> None:
        """The newest heap: chunk by chunk up to ``LIVE_EXACT_CHUNKS`` chunks in use, else in
        buckets (``live_map``), whose cost does not grow with the chunks."""
        arrays = self._follower.arrays(device)
        if len(arrays.address) <= LIVE_EXACT_CHUNKS:
            self._show_map(self._follower.state(device), f"{device} (live)")
        else:
            self.map_json = to_json(live_map(arrays, title=f"{device} (live)"))

    def _append_points(self, device: str, points: LivePoints, t0: int) -> None:
        """Append ``points`` to the drawn timeline; when more than 4 times ``options.points`` are
        drawn, draw them again reduced to ``options.points`` (``_reduce``), never reading the log."""
        drawn = points if self._drawn is None else _concat(self._drawn, points)
        if self._drawn is None or len(drawn) > 4 * self.options.points:
            if self._drawn is not None:
                drawn = _reduce(drawn, self.options.points)
            self.timeline_json = to_json(_live_timeline(device, drawn, t0))
            self._drawn = drawn
            return
        self._drawn = drawn
        x = ((points.time_ns - t0) / 1e9).tolist()
        in_use, requested = (points.bytes_in_use / MiB).tolist(), (points.bytes_requested / MiB).tolist()
        self.send({"extend": {"figure": "timeline", "traces": [0, 1], "x": [x, x], "y": [in_use, requested]}})

    # ------------------------------------------------------------------ full
    def refresh(self) -> None:
        """Compute the profile of the log and draw every view, opening the map at the first
        OOM of the shown device (else its peak)."""
        with self._lock:
            start = time.perf_counter()
            p = profile(self.event_log, self.options, strict=False)
            self.profile = p
            self._map_range.clear()
            devices = devices_by_peak({name: d.peak.bytes for name, d in p.devices.items()})
            chosen = self.device if self.device in devices else p.device
            self._quiet = True
            try:
                self.devices = devices
                self.device = chosen or ""
            finally:
                self._quiet = False
            self._draw_device(chosen)
            tables = placement_html(p.placements) if len(p.placements) else "<p>No ops recorded.</p>"
            if len(p.call_sites):
                tables += "<h4>Call sites</h4>" + call_site_html(p.call_sites)
            self.placement_html = f"<style>{TABLE_CSS}</style><div class='gpuviz'>{tables}</div>"
            warnings = warnings_html(integrity_lines(self.event_log))
            self.summary_html = (
                f"<style>{TABLE_CSS}</style><div class='gpuviz'>"
                + warnings
                + summary_html(p.diagnosis, group_by=self.options.group_by)
                + self._advice_html()
                + "</div>"
            )
            self.header = f"<b>{html.escape(self.title)}</b> · {len(self.event_log)} events · devices: " + (
                html.escape(", ".join(devices or ["none"]))
            )
            if warnings:
                self.header += ' · <b style="color:#b00020">incomplete log: see the summary</b>'
            self.scrubbable = True
            self.refresh_count += 1
            self.refresh_seconds += time.perf_counter() - start

    def _advice_html(self) -> str:
        advice = self.advisor(self.event_log) if self.advisor is not None else None
        return "" if advice is None else "<h4>Advice (replayed)</h4>" + advice_html(advice)

    def _draw_device(self, device: str | None) -> None:
        p = self.profile
        if p is None or device is None or device not in p.devices:
            self.stops = []
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
            self.stops = [list(pair) for pair in labels]
            self.max_position = max(len(positions) - 1, 0)
            at = int(np.searchsorted(positions, opening, side="right")) - 1 if opening >= 0 else len(positions) - 1
            self.position = max(at, 0)
        finally:
            self._quiet = False
        self._draw_map(device, self.position)
        figure = timeline(
            dp.series, t0_ns=p.t0_ns, points=self.options.points, transfers=p.transfers, marks=p.marks,
            ooms=p.ooms[p.ooms["device"] == device] if len(p.ooms) else None,
            segments=p.segments[p.segments["device"] == device] if len(p.segments) else None, peak=dp.peak,
            times_inferred=times_inferred(log),
        ).to_plotly_json()  # fmt: skip
        figure["layout"]["uirevision"] = device
        self.timeline_json = to_json(figure)
        active = active_spec(p, device, group_by=active_grouping(self.options.group_by, has_stacks=bool(log.stacks)))
        active["layout"]["uirevision"] = device
        self.active_json = to_json(active)

    def _show_map(self, state: Heap, title: str, found: Pinning | None = None) -> None:
        """The map of ``state`` at the drill-down level ``map_view`` asks for (as far as ``state``
        has it: the level drawn is written back to ``map_view``)."""
        options = self.options
        wanted = self.map_view
        view = MapView(str(wanted.get("level", OVERVIEW)), str(wanted.get("group", "")), int(wanted.get("base", -1)))
        spec, shown = view_spec(
            state, view, title=title, color_by=options.color_by, max_rectangles=options.max_rectangles,
            stacks=self.event_log.stacks, pinning=found,
        )  # fmt: skip
        layout = spec["layout"]
        if shown.level == MAP:
            layout["uirevision"] = state.device  # zoom and pan survive scrubbing...
        if self.profile is not None and shown.level != OVERVIEW:  # ...as long as the x range stays: the opening one's
            key = f"{state.device}|{shown.level}|{shown.group}|{shown.base}"
            layout["xaxis"]["range"] = self._map_range.setdefault(key, layout["xaxis"]["range"])
        if shown != view:
            self._set_view(shown)
        self.map_json = to_json(spec)

    def _draw_map(self, device: str, position: int) -> None:
        """The map after the ``position``-th allocator event of ``device`` and its label; at an
        OOM, the failed request as a ghost bar and what pinned the free holes apart."""
        p = self.profile
        if p is None or device not in p.devices or not len(p.devices[device].series):
            return
        dp = p.devices[device]
        log = self.event_log
        index = int(dp.series.index[min(position, len(dp.series) - 1)])
        columns = dp.columns_at(index)  # arrays: the overview needs no Python object per chunk
        heap: Heap = columns
        kind = KIND_NAMES[int(log["kind"][index])]
        found = None
        if kind == "oom":
            request = int(log["requested"][index]) or int(log["size"][index])
            heap = columns.to_state()
            found = pinning(heap, request, log=log, at_index=index)
        self._show_map(heap, f"{device} after event {index} ({kind})", found)
        seconds = (int(log["time_ns"][index]) - p.t0_ns) / 1e9
        what = " · OOM" if kind == "oom" else " · peak" if index == dp.peak.index else ""
        self.slider_label = f"event {index} of {len(log) - 1} · {seconds:.6f} s · {kind}{what}"
        self.pinning_html = (
            f"<style>{TABLE_CSS}</style><div class='gpuviz'><b>Out of memory: {format_size(request)} requested</b>"
            f"{pinning_html(found, p.t0_ns)}</div>"
            if found is not None
            else ""
        )

    # -------------------------------------------------------------- controls
    # (``_quiet`` is read under the lock: a change from the front-end waits for a draw in progress
    # on the dashboard's thread, instead of being taken for that draw's own change)
    def _on_device(self, change: dict[str, Any]) -> None:
        with self._lock:
            if not self._quiet and change["new"] and self.profile is not None:
                self._set_view(MapView())  # another device's map opens at its overview
                self._draw_device(change["new"])

    def _on_clicked(self, change: dict[str, Any]) -> None:
        """A click on the active-memory view: the slider (and the map) move to that moment."""
        with self._lock:
            p = self.profile
            if self._quiet or not self.device or p is None or int(change["new"]) < 0:
                return
            index = p.devices[self.device].series.index
            self.position = max(int(np.searchsorted(index, int(change["new"]), side="right")) - 1, 0)
            self.clicked = -1  # (so that the same moment can be clicked again)

    def _set_view(self, view: MapView) -> None:
        """``map_view`` set by the code itself (not taken for a click)."""
        quiet, self._quiet = self._quiet, True
        try:
            self.map_view = view._asdict()
        finally:
            self._quiet = quiet

    def _on_map_view(self, change: dict[str, Any]) -> None:
        """A click on the map or its breadcrumbs: the map drawn again at that level."""
        with self._lock:
            if not self._quiet and self.device and self.profile is not None:
                self._draw_map(self.device, self.position)

    def _on_slider(self, change: dict[str, Any]) -> None:
        with self._lock:
            if not self._quiet and self.device and self.profile is not None:
                self._draw_map(self.device, int(change["new"]))

    # ------------------------------------------------------------------ display
    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """The widget view, with static HTML for front-ends without a kernel (not while live:
        the run has only begun)."""
        data, metadata = super()._repr_mimebundle_(**kwargs) or ({}, {})
        bundle: dict[str, Any] = dict(data)
        if self.profile is not None:
            bundle["text/html"] = static_html(self.profile, title=self.title)
        bundle["text/plain"] = f"<gpuviz Dashboard: {len(self.event_log)} events>"
        return bundle, dict(metadata)
