"""Plain-text summary of a log: what ``gpuviz demo`` and ``gpuviz info`` print."""

from __future__ import annotations

from gpuviz.analysis.replay import replay
from gpuviz.analysis.timeline import internal_waste, peak, timeline_series
from gpuviz.base.units import format_bytes
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import KIND_NAMES, Kind

__all__ = ["summary_text"]


def summary_text(log: EventLog) -> str:
    """A few lines per device: events, peak, pool, fragmentation at the end, OOMs."""
    lines = [f"{len(log)} events, devices: {', '.join(log.device_names) or 'none'}"]
    cols = log.columns
    counts = {name: int((cols["kind"] == code).sum()) for code, name in enumerate(KIND_NAMES)}
    lines.append("  " + ", ".join(f"{name} {n}" for name, n in counts.items() if n))
    heap = replay(log)
    for device in heap.devices:
        series = timeline_series(log, device)
        top = peak(log, device)
        waste = internal_waste(log, device)
        state = heap.state_at(-1, device=device)
        ooms = int(((cols["kind"] == Kind.OOM) & (cols["device"] == log.device_index(device))).sum())
        lines.append(f"{device}:")
        lines.append(f"  peak in use      {format_bytes(top.bytes)} at event {top.seq}")
        most = format_bytes(int(series.pool_bytes.max()))
        lines.append(f"  pool (reserved)  {most} at most, {format_bytes(state.pool_bytes)} at the end")
        lines.append(
            f"  in use at end    {format_bytes(state.bytes_in_use)} in {sum(c.in_use for c in state.chunks())} chunks"
        )
        lines.append(f"  internal waste   {format_bytes(waste.at_peak)} at the peak")
        largest = format_bytes(state.largest_free_chunk)
        lines.append(f"  fragmentation    {state.fragmentation:.1%} at the end (largest free chunk {largest})")
        lines.append(f"  out-of-memory    {ooms} event(s)")
    return "\n".join(lines)
