"""The few lines ``gpuviz run`` prints when a program ends: per device its peak, its
out-of-memory events and what held the most memory at the peak (``analysis.diagnosis``)."""

from __future__ import annotations

from gpuviz.analysis.diagnosis import diagnose
from gpuviz.base.units import format_size
from gpuviz.log.eventlog import EventLog

__all__ = ["summary_lines", "TOP_HOLDERS"]

TOP_HOLDERS = 3
"""How many of the largest holders at the peak are printed per device (grouped by tag)."""


def summary_lines(log: EventLog) -> list[str]:
    """One block per device (GPUs first); the log's problems; a line saying when nothing was recorded."""
    lines = [f"problem: {problem}" for problem in log.problems]
    if not len(log):
        return [*lines, "nothing recorded: the log has no events"]
    diagnosis = diagnose(log, top=TOP_HOLDERS)
    if not diagnosis.devices:
        lines.append(f"{len(log)} events, none of them memory events")
    ooms = diagnosis.ooms
    for device in diagnosis.devices:
        peak = device.peak
        at = (peak.time_ns - diagnosis.t0_ns) / 1e9
        count = int((ooms["device"] == device.device).sum()) if len(ooms) and "device" in ooms else 0
        lines.append(
            f"{device.device}: peak {format_size(peak.bytes)} in use at {at:.3f} s (event {peak.seq}); "
            f"{count} out-of-memory event(s)"
        )
        top = device.top_at_peak
        for group, size, count, share in zip(top["group"], top["bytes"], top["count"], top["share"], strict=True):
            lines.append(f"  {format_size(int(size)):>10}  {float(share):6.1%}  {int(count):>6} x  {group}")
    return lines
