"""What the views say at an out-of-memory error: the pinning allocations and what was live.

Pure functions from analysis results (``moments.Pinning``, ``diagnosis.live_table``) to
text lines and HTML tables. Sizes in binary units, times from the start of the log.
"""

from __future__ import annotations

import html

import pandas as pd

from gpuviz.analysis.moments import Pinning, PinningChunk
from gpuviz.base.units import format_duration, format_size

__all__ = ["pinning_lines", "pinning_html", "live_html", "hex_address"]


def hex_address(address: int) -> str:
    """An address the one way every view writes it: ``0x`` and lowercase hex digits."""
    return f"{address:#x}"


def _when(chunk: PinningChunk, t0_ns: int) -> str:
    if chunk.alloc_index < 0:
        return "-"
    return f"event {chunk.alloc_index}, t = {(chunk.alloc_ns - t0_ns) / 1e9:.3f} s"


def pinning_lines(pinning: Pinning, t0_ns: int = 0) -> list[str]:
    """The sentence, then one line per pinning allocation of the cheapest window."""
    lines = [pinning.sentence()]
    best = pinning.best
    for c in best.chunks if best is not None else ():
        age = format_duration(c.age_ns) if c.age_ns >= 0 else "-"
        site = f", {c.call_site}" if c.call_site else ""
        lines.append(
            f"  {c.tag or '(untagged)'}: {format_size(c.size)} (requested {format_size(c.requested)}) at "
            f"{hex_address(c.address)}, allocated at {_when(c, t0_ns)}, alive {age}{site}"
        )
    return lines


def _e(value: object) -> str:
    return html.escape("" if value is None or (isinstance(value, float) and value != value) else str(value))


def _cell(text: str, value: object = None, *, css: str = "") -> str:
    data = f' data-value="{_e(value)}"' if value is not None else ""
    cls = f' class="{css}"' if css else ""
    return f"<td{cls}{data}>{text}</td>"


def pinning_html(pinning: Pinning, t0_ns: int = 0) -> str:
    """The sentence and the pinning allocations as a sortable table (``data-value``: numbers)."""
    parts = [f'<div class="oom-sentence">{_e(pinning.sentence())}</div>']
    best = pinning.best
    if best is None:
        return parts[0]
    head = '<tr><th class="text">tag</th><th>size</th><th>requested</th><th class="text">address</th>'
    head += '<th>allocated</th><th>age</th><th class="text">call site</th></tr>'
    rows = []
    for c in best.chunks:
        rows.append(
            '<tr class="pinning">'
            + _cell(_e(c.tag or "(untagged)"), css="text")
            + _cell(format_size(c.size), c.size)
            + _cell(format_size(c.requested), c.requested)
            + _cell(hex_address(c.address), css="text")
            + _cell(_e(_when(c, t0_ns)), c.alloc_index)
            + _cell(format_duration(c.age_ns) if c.age_ns >= 0 else "-", c.age_ns)
            + _cell(_e(c.call_site or "-"), css="text")
            + "</tr>"
        )
    parts.append(
        f'<table class="gpuviz-sortable gpuviz-pinning"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'
    )
    return "".join(parts)


def live_html(live: pd.DataFrame, *, limit: int = 50) -> str:
    """Allocations live at a moment (``diagnosis.live_table``), largest first, at most ``limit`` rows."""
    head = '<tr><th class="text">tag</th><th class="text">shape</th><th class="text">dtype</th><th>requested</th>'
    head += '<th>chunk</th><th class="text">call site</th><th>age</th><th class="text">address</th></tr>'
    rows = []
    for r in live.head(limit).to_dict("records"):
        rows.append(
            "<tr>"
            + _cell(_e(r["tag"] or "(untagged)"), css="text")
            + _cell(_e(r["shape"] or "-"), css="text")
            + _cell(_e(r["dtype"] or "-"), css="text")
            + _cell(format_size(int(r["requested"])), int(r["requested"]))
            + _cell(format_size(int(r["size"])), int(r["size"]))
            + _cell(_e(r["call_site"] or "-"), css="text")
            + _cell(format_duration(int(r["age_ns"])), int(r["age_ns"]))
            + _cell(hex_address(int(r["address"])), css="text")
            + "</tr>"
        )
    total = (
        f'<tr class="total"><td class="text">total ({len(live)})</td><td></td><td></td>'
        f"<td>{format_size(int(live['requested'].sum()))}</td><td>{format_size(int(live['size'].sum()))}</td>"
        "<td></td><td></td><td></td></tr>"
    )
    more = f"<div>… and {len(live) - limit} more</div>" if len(live) > limit else ""
    return (
        f'<table class="gpuviz-sortable gpuviz-live"><thead>{head}</thead><tbody>{"".join(rows)}</tbody>'
        f"<tfoot>{total}</tfoot></table>{more}"
    )
