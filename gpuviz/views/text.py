"""Plain-text summary of a log: what ``gpuviz demo`` and ``gpuviz info`` print."""

from __future__ import annotations

from gpuviz.analysis.explain import explain
from gpuviz.analysis.moments import oom_indices, pinning
from gpuviz.analysis.replay import replay
from gpuviz.analysis.tables import devices_present, gpus_first
from gpuviz.analysis.timeline import extremes
from gpuviz.base.units import format_size
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import KIND_NAMES
from gpuviz.views.oom import pinning_lines

__all__ = ["summary_text"]


def summary_text(log: EventLog, *, user_code: str | None = None) -> str:
    """The answer first (what held each device's memory at its peak or OOM, ``explain``), then a
    few lines per device: events, peak, pool, fragmentation at the end, OOMs. ``user_code``: a
    regular expression naming the user's files (``callsites.call_sites``)."""
    # a few states per device: a few checkpoints (each copies the whole heap) serve them best
    heap = replay(log, checkpoint_every=max(8192, len(log) // 8))
    lines = [answer.text for answer in explain(log, user_code=user_code, heap=heap)]
    lines.append(f"{len(log)} events, devices: {', '.join(devices_present(log)) or 'none'}")
    cols = log.columns
    counts = {name: int((cols["kind"] == code).sum()) for code, name in enumerate(KIND_NAMES)}
    lines.append("  " + ", ".join(f"{name} {n}" for name, n in counts.items() if n))
    for device in gpus_first(heap.devices):
        summary = extremes(log, device)  # the timeline's extremes, without keeping the timeline
        top, waste = summary.peak, summary.waste
        state = heap.columns_at(-1, device=device)  # arrays: no Python object per chunk
        ooms = oom_indices(log, device)
        lines.append(f"{device}:")
        lines.append(f"  peak in use      {format_size(top.bytes)} at event {top.seq}")
        most = format_size(summary.pool_bytes)
        lines.append(f"  pool (reserved)  {most} at most, {format_size(state.pool_bytes)} at the end")
        lines.append(f"  in use at end    {format_size(state.bytes_in_use)} in {int(state.in_use.sum())} chunks")
        lines.append(f"  internal waste   {format_size(waste.at_peak)} at the peak")
        largest = format_size(state.largest_free_chunk)
        free = state.pool_bytes - state.bytes_in_use
        fragmentation = (free - state.largest_free_chunk) / free if free else 0.0  # HeapState.fragmentation
        lines.append(f"  fragmentation    {fragmentation:.1%} at the end (largest free chunk {largest})")
        lines.append(f"  out-of-memory    {len(ooms)} event(s)")
        if len(ooms):
            first = int(ooms[0])
            pinned = pinning(
                heap.state_at(first, device=device), int(cols["requested"][first]), log=log, at_index=first
            )
            t0 = int(cols["time_ns"][0])
            lines.append(f"  at the first ({format_size(pinned.request_bytes)} requested, event {first}):")
            lines += ["    " + line for line in pinning_lines(pinned, t0)]
    return "\n".join(lines)
