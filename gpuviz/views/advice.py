"""The advice section: what ``scenarios.advise`` replayed (``analysis.advice.Advice``) as HTML."""

from __future__ import annotations

import html

from gpuviz.analysis.advice import Advice
from gpuviz.analysis.explain import gib
from gpuviz.base.units import GiB
from gpuviz.views.tables import answer_html

__all__ = ["advice_html"]


def advice_html(advice: Advice) -> str:
    """The headline, then one row per setting tried: finishes or not, peak reserved, smallest GPU."""
    rows = []
    for t in sorted(advice.trials, key=lambda t: (not t.own, not t.finished, t.peak_reserved)):
        state = "finishes" if t.finished else f"out of memory after {t.served:,} of {t.requests:,} requests"
        fits = t.smallest_gpu
        gpu = f"{fits // GiB} GiB" if t.finished and fits else "-"
        rows.append(
            f'<tr><td class="text">{html.escape(t.setting)}</td><td class="text">{"yes" if t.own else "other"}</td>'
            f'<td class="text">{html.escape(state)}</td><td data-sort="{t.peak_reserved}">{gib(t.peak_reserved)}</td>'
            f"<td>{gpu}</td></tr>"
        )
    notes = f"<div>fragmentation: {html.escape(advice.fragmentation)}</div>" if advice.fragmentation else ""
    notes += "".join(f"<div>note: {html.escape(n)}</div>" for n in advice.notes)
    return (
        answer_html(advice.headline)
        + f"<div>{html.escape(advice.family)} allocator, replayed on a GPU of {gib(advice.capacity)}"
        + f" ({html.escape(advice.capacity_basis)}) in {advice.seconds:.2f} s:</div>"
        + '<table class="gpuviz-sortable"><thead><tr><th>setting</th><th>this allocator</th><th>outcome</th>'
        + "<th>peak reserved</th><th>smallest GPU</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
        + notes
    )
