"""A report of many segments in Chromium (a snapshot made here: ``scale_maps``): the map opens
as the overview with a bounded number of labels and traces; a size class of more than
``DENSE_ROWS`` segments is drawn as one image (a heatmap) with at most ``MAX_LABELS`` labels, and
hovering any of its rows names that segment's largest allocation and its call site; a click on
a row draws that segment; a stop far from the opening shows the overview's totals."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from browsing import needs_chromium, open_offline
from scale_maps import USER_FILE, many_segments

import gpuviz
from gpuviz.analysis.profile import Profile, profile
from gpuviz.base.units import format_size
from gpuviz.frontends.options import write_report
from gpuviz.views import frames
from gpuviz.views.fragmentation import call_site
from gpuviz.views.overview import DENSE_ROWS, MAX_LABELS

pytestmark = [
    pytest.mark.slow,
    needs_chromium,
]
SEGMENTS = 1200  # all of 2 MiB: one size class, more than DENSE_ROWS
_CELL = """([id, row]) => {
  // the page coordinates of the middle of row `row` of the heatmap in plot `id`, a tenth into x
  const gd = document.getElementById(id), xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  const box = gd.getBoundingClientRect(), t = gd._fullData[0];
  return [box.left + xa._offset + xa.l2p(t.x[2]), box.top + ya._offset + ya.l2p(row)];
}"""


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Profile]:
    folder = tmp_path_factory.mktemp("dense")
    (folder / "many.pickle").write_bytes(pickle.dumps(many_segments(SEGMENTS)))
    log = gpuviz.load(str(folder / "many.pickle"), progress=False)
    with pytest.MonkeyPatch.context() as patch:  # segments at the three stops nearest the opening
        patch.setattr(frames, "DETAIL_ROWS", 3 * SEGMENTS)
        write_report(log, folder / "many.html")
    return folder / "many.html", profile(log)


def hover_text(page: Any, plot: str, row: int) -> str:
    """What hovering row ``row`` of the heatmap in ``plot`` says (the plot scrolled into view first)."""
    page.evaluate(f"document.getElementById('{plot}').scrollIntoView()")
    page.mouse.move(0, 0)
    page.wait_for_function(f"!document.querySelector('#{plot} .hoverlayer .hovertext')")
    page.mouse.move(*page.evaluate(_CELL, [plot, row]))
    page.wait_for_selector(f"#{plot} .hoverlayer .hovertext")
    return str(page.evaluate(f"document.querySelector('#{plot} .hoverlayer .hovertext').textContent"))


def test_a_dense_size_class_is_one_image_whose_rows_name_their_allocation(browser: Any, many: Any) -> None:
    report, p = many
    assert SEGMENTS > DENSE_ROWS
    page, errors = open_offline(browser, report, viewport={"width": 1200, "height": 900})
    page.wait_for_function("document.getElementById('map0').dataset.view === 'overview'")
    assert page.evaluate("document.getElementById('map0').data.length") == 2
    assert page.locator("#map0 .ytick").count() == 1  # one size class
    # drill down to the class: one heatmap trace, labels bounded
    page.evaluate("document.getElementById('map0').emit('plotly_click', {points: [{y: 0}]})")
    page.wait_for_function("document.getElementById('map0').dataset.view === 'group'")
    traces = page.evaluate("document.getElementById('map0')._fullData.map((t) => t.type)")
    assert traces == ["heatmap"]
    assert page.evaluate("document.getElementById('map0').layout.meta.bases.length") == SEGMENTS
    assert 0 < page.locator("#map0 .ytick").count() <= MAX_LABELS
    # hover row 700 (zoomed in, as a user would, so the mouse lands on it): its largest allocation
    dp = p.devices["GPU:0"]
    state = dp.state_at(dp.opening)
    row = 700
    page.evaluate("(r) => Plotly.relayout('map0', {'yaxis.range': [r + 4.5, r - 4.5]})", row)
    text = hover_text(page, "map0", row)
    segment = state.segments[row]
    largest = max((c for c in segment.chunks if c.in_use), key=lambda c: c.size)
    site = call_site(p.log.stacks, largest.stack)
    assert site == f"{USER_FILE}:{10 + row % 3} (step)"
    assert f"segment {segment.base:#x}" in text
    assert f"largest allocation {largest.tag or '(untagged)'} {format_size(largest.size)}" in text
    assert f"call site {site}" in text
    # a click on the row draws that segment alone
    page.evaluate("(r) => document.getElementById('map0').emit('plotly_click', {points: [{y: r}]})", row)
    page.wait_for_function("document.getElementById('map0').dataset.view === 'segment'")
    assert page.evaluate("document.getElementById('map0').layout.meta.bases") == [segment.base]
    assert errors == []
    page.close()


def test_a_stop_without_segments_shows_the_overview_totals(browser: Any, many: Any) -> None:
    report, _ = many
    page, errors = open_offline(browser, report, viewport={"width": 1200, "height": 900})
    stops = int(page.evaluate("document.getElementById('map0-slider').max"))
    page.evaluate("(v) => { const s = document.getElementById('map0-slider'); s.value = String(v);"
                  " s.dispatchEvent(new Event('input')); }", stops)  # fmt: skip
    title = page.evaluate("document.getElementById('map0').layout.title.text")
    assert "totals only at this stop" in title
    names = page.evaluate("document.getElementById('map0').layout.yaxis.ticktext")
    assert names == [f"≤ 2.0 MiB · {SEGMENTS} segments"]
    assert errors == []
    page.close()
