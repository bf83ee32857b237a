"""HTML tables: the placement table and the summary/diagnosis. Every string is escaped;
no scripts (the tables render in sanitising front-ends as they are)."""

from __future__ import annotations

import html

import pandas as pd

from gpuviz.analysis.diagnosis import Diagnosis
from gpuviz.base.units import format_duration, format_size
from gpuviz.views.oom import live_html, pinning_html

__all__ = [
    "placement_html",
    "call_site_html",
    "summary_html",
    "answer_html",
    "warnings_html",
    "live_groups_html",
    "TABLE_CSS",
    "LIVE_DETAIL_ROWS",
]

LIVE_DETAIL_ROWS = 1000
"""The most allocations the expander under the grouped live table lists one by one (the rest are
counted; ``DeviceSummary.live`` holds them all)."""

TABLE_CSS = """
.gpuviz table { border-collapse: collapse; font: 12px/1.4 system-ui, sans-serif; margin: 4px 0 12px; }
.gpuviz th, .gpuviz td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: right; }
.gpuviz th { background: #f3f5f8; cursor: pointer; }
.gpuviz td.text, .gpuviz th.text { text-align: left; }
.gpuviz tr.soft td { background: #fff3cd; }
.gpuviz tr.pinning td { background: #fdecea; }
.gpuviz tr.total td { font-weight: 600; border-top: 1px solid #999; }
.gpuviz .oom-sentence { background: #fdecea; border-left: 3px solid #c0392b; padding: 4px 8px; margin: 4px 0;
  font-weight: 600; }
.gpuviz .hint { background: #eef6ff; border-left: 3px solid #2e86de; padding: 4px 8px; margin: 4px 0; }
.gpuviz .metric { display: inline-block; margin-right: 18px; }
"""


def _e(value: object) -> str:
    return html.escape("" if value is None or (isinstance(value, float) and value != value) else str(value))


def _ms(ns: object) -> str:
    return format_duration(int(ns))  # type: ignore[call-overload]


def _num(text: str, value: object) -> str:
    """A numeric cell: shown as ``text``, sorted by ``value`` (the report's tables sort by data-value)."""
    return f'<td data-value="{_e(value)}">{text}</td>'


def placement_html(table: pd.DataFrame) -> str:
    """The placement table; rows moved by soft placement carry the class ``soft``."""
    head = [("op", "text"), ("requested", "text"), ("device", "text"), ("count", ""), ("soft placed", ""),
            ("op time", ""), ("allocated", ""), ("transferred", ""), ("transfer time", "")]  # fmt: skip
    rows = []
    for r in table.to_dict("records"):
        css = ' class="soft"' if int(r["soft"]) else ""
        cells = [
            f'<td class="text">{_e(r["op"])}</td>',
            f'<td class="text">{_e(r["requested"]) or "-"}</td>',
            f'<td class="text">{_e(r["device"])}</td>',
            _num(str(int(r["count"])), int(r["count"])),
            _num(str(int(r["soft"])), int(r["soft"])),
            _num(_ms(r["op_ns"]), int(r["op_ns"])),
            _num(format_size(int(r["bytes_allocated"])), int(r["bytes_allocated"])),
            _num(format_size(int(r["bytes_transferred"])), int(r["bytes_transferred"])),
            _num(_ms(r["transfer_ns"]), int(r["transfer_ns"])),
        ]
        rows.append(f"<tr{css}>" + "".join(cells) + "</tr>")
    total = (
        f'<tr class="total"><td class="text">total</td><td></td><td></td><td>{int(table["count"].sum())}</td>'
        f"<td>{int(table['soft'].sum())}</td><td>{_ms(table['op_ns'].sum())}</td>"
        f"<td>{format_size(int(table['bytes_allocated'].sum()))}</td>"
        f"<td>{format_size(int(table['bytes_transferred'].sum()))}</td><td>{_ms(table['transfer_ns'].sum())}</td></tr>"
        if len(table)
        else ""
    )
    header = "".join(f'<th class="{c}">{h}</th>' for h, c in head)
    return (
        f'<table class="gpuviz-placement"><thead><tr>{header}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody><tfoot>{total}</tfoot></table>"
    )


def call_site_html(table: pd.DataFrame) -> str:
    """Allocations and transfers per call site (for code without ops, e.g. CuPy with stacks)."""
    rows = []
    for r in table.to_dict("records"):
        rows.append(
            f'<tr><td class="text">{_e(r["call_site"])}</td>'
            + _num(str(int(r["allocations"])), int(r["allocations"]))
            + _num(format_size(int(r["bytes_allocated"])), int(r["bytes_allocated"]))
            + _num(str(int(r["transfers"])), int(r["transfers"]))
            + _num(format_size(int(r["bytes_transferred"])), int(r["bytes_transferred"]))
            + _num(_ms(r["transfer_ns"]), int(r["transfer_ns"]))
            + "</tr>"
        )
    header = (
        '<tr><th class="text">call site</th><th>allocations</th><th>allocated</th><th>transfers</th>'
        "<th>transferred</th><th>transfer time</th></tr>"
    )
    return f'<table class="gpuviz-placement"><thead>{header}</thead><tbody>{"".join(rows)}</tbody></table>'


def _frame_html(frame: pd.DataFrame, columns: list[tuple[str, str, str]]) -> str:
    """A small table: (column, header, format) with format ``bytes``, ``share`` or ``text``."""
    header = "".join(f'<th class="{"text" if f == "text" else ""}">{_e(h)}</th>' for _, h, f in columns)
    body = []
    for row in frame.to_dict("records"):
        cells = []
        for column, _, fmt in columns:
            value = row[column]
            if fmt == "bytes":
                cells.append(_num(format_size(int(value)), int(value)))
            elif fmt == "share":
                cells.append(_num(f"{float(value):.1%}", float(value)))
            elif fmt == "number":
                cells.append(_num(str(int(value)), int(value)))
            elif fmt == "address":
                cells.append(f'<td class="text">{int(value):#x}</td>')
            else:
                cells.append(f'<td class="text">{_e(value)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table class="gpuviz-sortable"><thead><tr>{header}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def warnings_html(lines: list[str]) -> str:
    """Each line (``analysis.integrity.integrity_lines``: what a cut or damaged log misses) as a
    warning, shown before everything else."""
    return "".join(
        f'<div class="gpuviz-warning" style="color:#b00020"><b>warning:</b> {html.escape(line)}</div>' for line in lines
    )


def answer_html(text: str) -> str:
    """A sentence of ``explain`` as a paragraph: its ```code``` spans as ``<code>``."""
    pieces = _e(text).split("`")
    inner = "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(pieces))
    return f'<p class="answer"><b>{inner}</b></p>'


def live_groups_html(groups: pd.DataFrame, live: pd.DataFrame, moment: str) -> str:
    """Who held the memory at ``moment``: one row per group of ``livegroups.live_groups`` (``96 x
    100 MiB`` with a multiplication sign, what, call site, bytes, share), then the allocations one
    by one (``live``, a ``diagnosis.live_table``) in a collapsed expander."""
    rows = []
    for r in groups.to_dict("records"):
        count, size, total = int(r["count"]), int(r["size"]), int(r["bytes"])
        rows.append(
            "<tr>"
            + _num(f"{count:,} &times; {format_size(size)}", total)
            + f'<td class="text">{_e(r["what"])}</td>'
            + f'<td class="text">{_e(r["call_site"]) or "-"}</td>'
            + _num(format_size(total), total)
            + _num(f"{float(r['share']):.1%}", float(r["share"]))
            + "</tr>"
        )
    total_bytes = int(groups["bytes"].sum()) if len(groups) else 0
    foot = (
        f'<tr class="total"><td>{len(live):,} allocations</td><td class="text">{len(groups):,} groups</td>'
        f"<td></td><td>{format_size(total_bytes)}</td><td></td></tr>"
    )
    head = '<tr><th>allocations</th><th class="text">what</th><th class="text">call site</th><th>bytes</th>'
    head += "<th>share</th></tr>"
    table = (
        f'<table class="gpuviz-sortable gpuviz-live-groups"><thead>{head}</thead><tbody>{"".join(rows)}</tbody>'
        f"<tfoot>{foot}</tfoot></table>"
    )
    shown = min(len(live), LIVE_DETAIL_ROWS)
    detail = (
        f'<details class="gpuviz-live-detail"><summary>All {len(live):,} allocations live at the {_e(moment)}, '
        f"one by one{'' if shown == len(live) else f' (the largest {shown:,})'}</summary>"
        f"{live_html(live, limit=LIVE_DETAIL_ROWS)}</details>"
    )
    return table + detail


def summary_html(diagnosis: Diagnosis, *, group_by: str = "auto", t0_ns: int | None = None) -> str:
    """What held each device's memory in words (``explain``), hints, then per device: at its first
    OOM the sentence, the pinning allocations and what was
    live; the peak and when, top allocations at the peak, what was live at the peak (without an
    OOM), possible leaks; then every OOM. ``t0_ns``: times are shown from it (default: the log's start)."""
    t0 = diagnosis.t0_ns if t0_ns is None else t0_ns
    parts = [answer_html(d.answer.text) for d in diagnosis.devices if d.answer is not None]
    for hint in diagnosis.hints:
        parts.append(f'<div class="hint">{_e(hint)}</div>')
    for d in diagnosis.devices:
        when = d.peak.seq
        parts.append(f"<h4>{_e(d.device)}</h4>")
        if d.pinning is not None:
            parts.append(f"<div><b>Out of memory</b> requesting {format_size(d.pinning.request_bytes)}:</div>")
            parts.append(pinning_html(d.pinning, t0))
        metrics = [
            ("peak in use", f"{format_size(d.peak.bytes)} at event {when}"),
            ("peak pool", format_size(d.peak_pool_bytes)),
            ("in use at end", format_size(d.bytes_in_use_at_end)),
            ("fragmentation at peak", f"{d.fragmentation_at_peak:.1%}"),
            ("internal waste at peak", format_size(d.waste_at_peak)),
        ]
        parts.append("".join(f'<span class="metric"><b>{_e(k)}</b> {_e(v)}</span>' for k, v in metrics))
        if len(d.top_at_peak):
            group_by = d.group_by if group_by == "auto" else group_by
            parts.append(f"<div>Alive at the peak, by {_e(group_by)}:</div>")
            parts.append(
                _frame_html(
                    d.top_at_peak,
                    [
                        ("group", group_by, "text"),
                        ("bytes", "bytes", "bytes"),
                        ("count", "count", "number"),
                        ("share", "share", "share"),
                    ],
                )
            )
        if len(d.live) and len(d.live_groups) < len(d.live):
            parts.append(
                f"<div>Live at the {_e(d.moment)} ({len(d.live):,} allocations), by what held it, call site"
                " and size:</div>"
            )
            parts.append(live_groups_html(d.live_groups, d.live, d.moment))
        elif len(d.live):  # no two alike: the allocations themselves are the answer
            parts.append(f"<div>Live at the {_e(d.moment)} ({len(d.live)} allocations):</div>")
            parts.append(live_html(d.live))
        if len(d.leaks):
            leaks = d.leaks.head(20)
            parts.append(f"<div>Still alive at the end of a span ({len(d.leaks)} allocations, possible leaks):</div>")
            parts.append(
                _frame_html(
                    leaks,
                    [
                        ("span", "span", "text"),
                        ("tag", "tag", "text"),
                        ("size", "size", "bytes"),
                        ("address", "address", "address"),
                    ],
                )
            )
    if len(diagnosis.ooms):
        parts.append("<h4>Out of memory</h4>")
        parts.append(
            _frame_html(
                diagnosis.ooms,
                [
                    ("device", "device", "text"),
                    ("requested", "requested", "bytes"),
                    ("free", "free in pool", "bytes"),
                    ("largest_free", "largest free chunk", "bytes"),
                    ("fragmentation_cause", "fragmentation is the cause", "text"),
                ],
            )
        )
    if diagnosis.transfer_bytes:
        share = diagnosis.transfer_ns / diagnosis.wall_ns if diagnosis.wall_ns else 0.0
        parts.append(
            f'<div><span class="metric"><b>transfers</b> {format_size(diagnosis.transfer_bytes)} in '
            f"{diagnosis.transfer_ns / 1e6:.2f} ms ({share:.1%} of the recorded time)</span></div>"
        )
    return "\n".join(parts)
