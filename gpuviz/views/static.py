"""The static HTML fallback: summary, placement table and a sparkline per device as
inline SVG. No scripts, so it shows in nbconvert output, VS Code and sanitising front-ends."""

from __future__ import annotations

import html
from typing import Any

import numpy as np

from gpuviz.analysis.integrity import integrity_lines
from gpuviz.analysis.profile import Profile, profile
from gpuviz.analysis.tables import devices_present
from gpuviz.analysis.timeline import resample
from gpuviz.base.units import format_bytes
from gpuviz.log.eventlog import EventLog, set_renderer
from gpuviz.views.result import MIME_TYPE, result
from gpuviz.views.tables import TABLE_CSS, placement_html, summary_html, warnings_html

__all__ = ["static_html", "sparkline_svg"]


def sparkline_svg(values: np.ndarray, *, width: int = 360, height: int = 48, color: str = "#3b6fb6") -> str:
    """An inline SVG polyline of ``values`` scaled to the box."""
    if len(values) == 0:
        return f'<svg width="{width}" height="{height}"></svg>'
    top = float(values.max()) or 1.0
    xs = np.linspace(0, width, len(values)) if len(values) > 1 else np.array([0.0])
    ys = height - 2 - (values / top) * (height - 4)
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys, strict=True))
    return (
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" class="gpuviz-sparkline">'
        f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{points}"/></svg>'
    )


def static_html(p: Profile, *, title: str = "gpuviz") -> str:
    parts = [f"<style>{TABLE_CSS}</style>", '<div class="gpuviz">', f"<h3>{html.escape(title)}</h3>"]
    parts.append(warnings_html(integrity_lines(p.log)))
    parts.append(
        f"<div>{len(p.log)} events · devices: {html.escape(', '.join(devices_present(p.log)) or 'none')}</div>"
    )
    for name, device in p.devices.items():
        reduced = resample(device.series, 360)
        parts.append(
            f"<div><b>{html.escape(name)}</b> bytes in use (peak {format_bytes(device.peak.bytes)})<br>"
            f"{sparkline_svg(reduced.maximum['bytes_in_use'])}</div>"
        )
    parts.append(summary_html(p.diagnosis, group_by=p.options.group_by, t0_ns=p.t0_ns))
    if len(p.placements):
        parts.append("<h4>Placement</h4>" + placement_html(p.placements))
    parts.append("</div>")
    return "\n".join(parts)


def _event_log_bundle(log: EventLog) -> dict[str, Any]:
    """An EventLog in a notebook: the gpuviz result for the JupyterLab extension (which
    ranks first where installed), static HTML everywhere else, and text."""
    p = profile(log)
    return {
        MIME_TYPE: result(p, title=repr(log)),
        "text/html": static_html(p, title=repr(log)),
        "text/plain": repr(log),
    }


set_renderer(_event_log_bundle)
