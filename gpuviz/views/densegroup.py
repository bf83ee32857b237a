"""A drill-down group of many segments drawn as an image: what the notebook dashboard and a saved
result (JupyterLab) show for a group of more than ``overview.DENSE_ROWS`` segments, so that its
size follows what is drawn, not the number of segments.

The group's segments, by address, are cut into at most ``IMAGE_ROWS`` *runs* of consecutive
segments (``ceil(segments / IMAGE_ROWS)`` each, the last maybe fewer); each run is one row of a
heatmap of ``overview.DENSE_COLUMNS`` cells over the x axis (the offset in a segment, up to the
widest segment of the group that is not a lane), each cell the share of the run's bytes at that
offset that chunks in use hold (blank past the run's longest segment). A transparent bar over
each row carries its hover: the run's addresses, segment count, bytes reserved and in use, and its
largest allocation in use with its call site. Cost: one pass over the group's chunks in arrays,
then ``IMAGE_ROWS x DENSE_COLUMNS`` values and ``IMAGE_ROWS`` hovers, whatever the segment count.

A run's row names its first segment (``layout.meta``: ``"dense": true``, ``"firsts"``: each
run's first base, ``"counts"``: its segments); one segment of such a group is drawn alone only
where a kernel draws it (the dashboard: a click on a row opens its run's first segment).
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpuviz.analysis.heapcolumns import HeapColumns
from gpuviz.base.units import format_size
from gpuviz.views.fragmentation import metric_words
from gpuviz.views.maprows import size_ticks
from gpuviz.views.mapstyle import COLORS, label
from gpuviz.views.overview import DENSE_COLUMNS, labelled_rows

__all__ = ["IMAGE_ROWS", "dense_group_spec", "run_length"]

IMAGE_ROWS = 400
"""The most rows of a dense group's image (a map is at most 900 px tall: more would not show)."""


def run_length(segments: int) -> int:
    """Segments per row of a dense group's image of ``segments`` segments."""
    return max(1, math.ceil(segments / IMAGE_ROWS))


def _ramps(run: np.ndarray, points: np.ndarray, signs: np.ndarray, edges: np.ndarray, runs: int) -> np.ndarray:
    """Per run and edge ``e``: the sum of ``sign * (e - p)`` over the run's ``points`` ``p <= e``
    (an interval ``[a, b)`` is the point ``a`` with sign 1 and ``b`` with sign -1: the bytes of it
    below ``e``). One pass over the points, then ``runs x edges`` sums."""
    width = len(edges) + 1
    first = np.searchsorted(edges, points, side="left")  # the first edge at or past the point
    index = run * width + first
    count = np.bincount(index, weights=signs, minlength=runs * width).reshape(runs, width)
    total = np.bincount(index, weights=signs * points, minlength=runs * width).reshape(runs, width)
    count, total = np.cumsum(count, axis=1)[:, :-1], np.cumsum(total, axis=1)[:, :-1]
    return np.asarray(count * edges[None, :] - total, dtype=np.float64)


def _shares(heap: HeapColumns, widest: int, per: int, runs: int) -> list[list[float | None]]:
    """Per run (``per`` consecutive segments) and cell: the share of the run's bytes under the
    cell that chunks in use hold (None where no segment of the run reaches the cell)."""
    edges = np.linspace(0, widest, DENSE_COLUMNS + 1)
    used = np.flatnonzero(heap.in_use)
    offset = (heap.address[used] - heap.bases[heap.owner[used]]).astype(np.float64)
    ones = np.ones(len(used))
    chunk_run = np.concatenate((heap.owner[used], heap.owner[used])) // per
    held = _ramps(chunk_run, np.concatenate((offset, offset + heap.size[used])), np.concatenate((ones, -ones)),
                  edges, runs)  # fmt: skip
    rows = np.arange(len(heap.bases), dtype=np.int64) // per
    zeros, sizes = np.zeros(len(rows)), heap.sizes.astype(np.float64)
    signs = np.concatenate((np.ones(len(rows)), -np.ones(len(rows))))
    reach = _ramps(np.concatenate((rows, rows)), np.concatenate((zeros, sizes)), signs, edges, runs)
    used_bytes, span = np.diff(held, axis=1), np.diff(reach, axis=1)
    share = np.clip(np.round(used_bytes / np.where(span > 0, span, 1), 3), 0, 1)
    return [[v if s > 0 else None for v, s in zip(row, spans, strict=True)]
            for row, spans in zip(share.tolist(), span.tolist(), strict=True)]  # fmt: skip


def _largest(heap: HeapColumns) -> list[tuple[int, int]]:
    """Per segment row: ``(chunk row, size)`` of its largest chunk in use (the lowest-addressed
    of equals), ``(-1, 0)`` when none is in use."""
    out = [(-1, 0)] * len(heap.bases)
    picked = np.flatnonzero(heap.in_use)
    if not len(picked):
        return out
    order = np.lexsort((heap.address[picked], -heap.size[picked], heap.owner[picked]))
    ranked = picked[order]
    owners = heap.owner[ranked]
    firsts = ranked[np.r_[True, owners[1:] != owners[:-1]]]
    for chunk, owner, size in zip(firsts.tolist(), heap.owner[firsts].tolist(), heap.size[firsts].tolist(),
                                  strict=True):  # fmt: skip
        out[owner] = (chunk, size)
    return out


def _hovers(heap: HeapColumns, starts: np.ndarray, used: np.ndarray, site_of: Callable[[int], str | None]) -> list[str]:
    """Each run's hover: its addresses, segments, bytes and largest allocation with its call site."""
    largest = _largest(heap)
    bounds = [*starts.tolist(), len(heap.bases)]
    texts = []
    for first, end in itertools.pairwise(bounds):
        count, where = end - first, label(int(heap.bases[first]))
        last = label(int(heap.bases[end - 1]))
        where = f"{count} segments {where} to {last}" if count > 1 else f"segment {where}"
        text = (f"<b>{where}</b><br>reserved {format_size(int(heap.sizes[first:end].sum()))}"
                f" · in use {format_size(int(used[first:end].sum()))}")  # fmt: skip
        chunk, size = max(largest[first:end], key=lambda c: c[1])
        if chunk < 0:
            texts.append(text + "<br>no allocation in use")
            continue
        tag = int(heap.tag[chunk])
        name = heap.strings[tag] if tag >= 0 else "(untagged)"
        text += f"<br>largest allocation <b>{html.escape(name)}</b> {format_size(size)}"
        text += f" at {int(heap.address[chunk]):#x}"
        site = site_of(int(heap.stack[chunk]))
        texts.append(text + (f"<br>call site {html.escape(site)}" if site is not None else ""))
    return texts


def dense_group_spec(
    heap: HeapColumns, *, heading: str, site_of: Callable[[int], str | None], lanes: Sequence[int] = ()
) -> dict[str, Any]:
    """The figure (plain dicts) of the group whose segments are ``heap``'s (by base) as an image of
    at most ``IMAGE_ROWS`` rows, titled ``heading`` (escaped here) over the group's metric strip.
    ``site_of(stack)``: a stack id's call site, or None. ``lanes``: rows of inferred preexisting
    memory (left out of the x axis' span). ``layout.meta`` has no ``bases``: no row is one segment."""
    n = len(heap.bases)
    per = run_length(n)
    starts = np.arange(0, n, per, dtype=np.int64)
    lane_set = set(lanes)
    sizes = heap.sizes.tolist()
    widest = max((s for r, s in enumerate(sizes) if r not in lane_set), default=0) or max(sizes, default=1)
    used = np.bincount(heap.owner, weights=np.where(heap.in_use, heap.size, 0), minlength=n).astype(np.int64)
    rows = list(range(len(starts)))
    centres = ((np.arange(DENSE_COLUMNS) + 0.5) * (widest / DENSE_COLUMNS)).round().astype(np.int64).tolist()
    shares = _shares(heap, widest, per, len(starts))
    image = {"type": "heatmap", "name": "share in use", "x": centres, "y": rows, "z": shares,
             "zmin": 0, "zmax": 1, "showscale": False, "hoverinfo": "skip", "xgap": 0, "ygap": 0,
             "colorscale": [[0, COLORS["free"]], [1, COLORS["used"]]]}  # fmt: skip
    hover = {"type": "bar", "orientation": "h", "name": "segments", "y": rows, "x": [widest] * len(rows),
             "base": [0] * len(rows), "hovertext": _hovers(heap, starts, used, site_of), "hoverinfo": "text",
             "marker": {"color": "rgba(0,0,0,0)"}, "showlegend": False}  # fmt: skip
    ticks = labelled_rows(len(rows))
    firsts = heap.bases[starts].tolist()
    counts = np.diff(np.r_[starts, n]).tolist()
    what = f"{per} segments a row, by address" if per > 1 else "one segment a row"
    metric = metric_words(heap.bytes_in_use, heap.pool_bytes, heap.largest_free_chunk)
    layout: dict[str, Any] = {
        "title": {"text": f"{html.escape(heading)} ({what})<br><sub>{metric}</sub>"},
        "barmode": "overlay",
        "bargap": 0,
        "height": min(900, 180 + 28 * len(rows)),
        "hovermode": "closest",
        "xaxis": {"title": {"text": "offset in segment"}, **size_ticks(widest), "range": [0, widest]},
        "yaxis": {
            "title": {"text": "segment" if per == 1 else "segments (first of each row)"},
            "tickvals": ticks,
            "ticktext": [label(firsts[r]) for r in ticks],
            "range": [len(rows) - 0.5, -0.5],
            "type": "linear",
            "automargin": True,
        },
        "legend": {"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom"},
        "margin": {"l": 120, "r": 20, "t": 80, "b": 80},
        "meta": {"dense": True, "firsts": firsts, "counts": counts},
    }
    return {"data": [image, hover], "layout": layout}
