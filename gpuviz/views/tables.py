"""HTML tables: the placement table and the summary/diagnosis. Every string is escaped;
no scripts (the tables render in sanitising front-ends as they are)."""

from __future__ import annotations

import html

import pandas as pd

from gpuviz.analysis.diagnosis import Diagnosis
from gpuviz.base.units import format_bytes

__all__ = ["placement_html", "call_site_html", "summary_html", "TABLE_CSS"]

TABLE_CSS = """
.gpuviz table { border-collapse: collapse; font: 12px/1.4 system-ui, sans-serif; margin: 4px 0 12px; }
.gpuviz th, .gpuviz td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: right; }
.gpuviz th { background: #f3f5f8; cursor: pointer; }
.gpuviz td.text, .gpuviz th.text { text-align: left; }
.gpuviz tr.soft td { background: #fff3cd; }
.gpuviz .hint { background: #eef6ff; border-left: 3px solid #2e86de; padding: 4px 8px; margin: 4px 0; }
.gpuviz .metric { display: inline-block; margin-right: 18px; }
"""


def _e(value: object) -> str:
    return html.escape("" if value is None or (isinstance(value, float) and value != value) else str(value))


def _ms(ns: object) -> str:
    return f"{int(ns) / 1e6:.3f} ms"  # type: ignore[call-overload]


def placement_html(table: pd.DataFrame) -> str:
    """The placement table; rows moved by soft placement carry the class ``soft``."""
    head = [("op", "text"), ("requested", "text"), ("device", "text"), ("count", ""), ("soft placed", ""),
            ("op time", ""), ("allocated", ""), ("transferred", ""), ("transfer time", "")]  # fmt: skip
    rows = []
    for r in table.to_dict("records"):
        css = ' class="soft"' if int(r["soft"]) else ""
        cells = [
            (_e(r["op"]), "text"),
            (_e(r["requested"]) or "-", "text"),
            (_e(r["device"]), "text"),
            (str(int(r["count"])), ""),
            (str(int(r["soft"])), ""),
            (_ms(r["op_ns"]), ""),
            (format_bytes(int(r["bytes_allocated"])), ""),
            (format_bytes(int(r["bytes_transferred"])), ""),
            (_ms(r["transfer_ns"]), ""),
        ]
        rows.append(f"<tr{css}>" + "".join(f'<td class="{c}">{v}</td>' for v, c in cells) + "</tr>")
    total = (
        f'<tr class="total"><td class="text">total</td><td></td><td></td><td>{int(table["count"].sum())}</td>'
        f"<td>{int(table['soft'].sum())}</td><td>{_ms(table['op_ns'].sum())}</td>"
        f"<td>{format_bytes(int(table['bytes_allocated'].sum()))}</td>"
        f"<td>{format_bytes(int(table['bytes_transferred'].sum()))}</td><td>{_ms(table['transfer_ns'].sum())}</td></tr>"
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
            f'<tr><td class="text">{_e(r["call_site"])}</td><td>{int(r["allocations"])}</td>'
            f"<td>{format_bytes(int(r['bytes_allocated']))}</td><td>{int(r['transfers'])}</td>"
            f"<td>{format_bytes(int(r['bytes_transferred']))}</td><td>{_ms(r['transfer_ns'])}</td></tr>"
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
                cells.append(f"<td>{format_bytes(int(value))}</td>")
            elif fmt == "share":
                cells.append(f"<td>{float(value):.1%}</td>")
            else:
                cells.append(f'<td class="text">{_e(value)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{header}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def summary_html(diagnosis: Diagnosis, *, group_by: str = "tag") -> str:
    """Peak and when, top allocations at the peak, possible leaks, OOMs and hints."""
    parts = []
    for hint in diagnosis.hints:
        parts.append(f'<div class="hint">{_e(hint)}</div>')
    for d in diagnosis.devices:
        when = d.peak.seq
        parts.append(f"<h4>{_e(d.device)}</h4>")
        metrics = [
            ("peak in use", f"{format_bytes(d.peak.bytes)} at event {when}"),
            ("peak pool", format_bytes(d.peak_pool_bytes)),
            ("in use at end", format_bytes(d.bytes_in_use_at_end)),
            ("fragmentation at peak", f"{d.fragmentation_at_peak:.1%}"),
            ("internal waste at peak", format_bytes(d.waste_at_peak)),
        ]
        parts.append("".join(f'<span class="metric"><b>{_e(k)}</b> {_e(v)}</span>' for k, v in metrics))
        if len(d.top_at_peak):
            parts.append(f"<div>Alive at the peak, by {_e(group_by)}:</div>")
            parts.append(
                _frame_html(
                    d.top_at_peak,
                    [
                        ("group", group_by, "text"),
                        ("bytes", "bytes", "bytes"),
                        ("count", "count", "text"),
                        ("share", "share", "share"),
                    ],
                )
            )
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
                        ("address", "address", "text"),
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
            f'<div><span class="metric"><b>transfers</b> {format_bytes(diagnosis.transfer_bytes)} in '
            f"{diagnosis.transfer_ns / 1e6:.2f} ms ({share:.1%} of the recorded time)</span></div>"
        )
    return "\n".join(parts)
