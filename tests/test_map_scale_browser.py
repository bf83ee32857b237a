"""The report of the largest real PyTorch snapshot (cs336 full step: 1,010 segments) in Chromium:
its map opens as an overview by segment size with a bounded number of labels, drills down to
a size class and to one segment, names the allocation under the mouse with its call site, and
follows a click on the active-memory view. Real traces are optional test data
(``GPUVIZ_TEST_TRACES``); a set-but-missing trace fails."""

from __future__ import annotations

# ruff: noqa: RUF001  (the size classes are named with an en dash)
import os
from pathlib import Path
from typing import Any

import pytest
from browsing import collect_errors, needs_chromium, offline, open_offline
from traces import REASON

import gpuviz
from gpuviz.analysis.profile import profile
from gpuviz.base.units import MiB
from gpuviz.frontends.options import write_report
from gpuviz.views.fragmentation import call_site
from gpuviz.views.overview import MAX_LABELS, segment_groups

TRACES = os.environ.get("GPUVIZ_TEST_TRACES")
needs_traces = pytest.mark.skipif(not TRACES, reason=REASON)
pytestmark = [
    pytest.mark.slow,
    needs_traces,
    needs_chromium,
]
CS336 = "pt_snapshot_cs336_ctx128_fullstep_2025.pickle"
_CENTER = """([id, name, i]) => {
  // the page coordinates of the middle of bar i of trace `name` in plot `id`
  const gd = document.getElementById(id), t = gd._fullData.find((d) => d.name === name);
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
  return [box.left + xa._offset + xa.l2p(t.base[i] + t.x[i] / 2), box.top + ya._offset + ya.l2p(t.y[i])];
}"""


def click(page: Any, plot: str, trace: str, bar: int) -> None:
    """A real mouse click on bar ``bar`` of ``trace`` (plotly clicks what is hovered: move first)."""
    page.evaluate(f"document.getElementById('{plot}').scrollIntoView()")  # its top at the viewport's
    page.mouse.move(0, 0)  # no hover label left from before
    page.wait_for_function(f"!document.querySelector('#{plot} .hoverlayer .hovertext')")
    x, y = page.evaluate(_CENTER, [plot, trace, bar])
    # plotly takes a click within its doubleClickDelay (300 ms) of the previous one for a double click
    page.evaluate(f"document.getElementById('{plot}')._mouseDownTime = 0")
    page.mouse.move(x, y)
    page.wait_for_selector(f"#{plot} .hoverlayer .hovertext")
    page.mouse.click(x, y)


@pytest.fixture(scope="module")
def cs336(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The cs336 snapshot's report and profile."""
    trace = Path(str(TRACES)) / CS336
    if not trace.exists():
        pytest.fail(f"GPUVIZ_TEST_TRACES is set but {trace} is missing")
    log = gpuviz.load(str(trace), progress=False)
    report = tmp_path_factory.mktemp("cs336") / "cs336.html"
    write_report(log, report)
    return report, profile(log)


def test_the_map_of_1010_segments_opens_as_an_overview_with_bounded_labels(browser: Any, cs336: Any) -> None:
    report, p = cs336
    page, errors = open_offline(browser, report, viewport={"width": 1200, "height": 900})
    dp = p.devices["GPU:0"]
    state = dp.state_at(dp.opening)
    assert len(state.segments) == 1010

    def site(stack: int) -> str | None:  # as the map's hovers name it
        return call_site(p.log.stacks, stack)

    # the overview: one row per size class, the page's groups the same as gpuviz's
    in_use = [sum(c.size for c in s.chunks if c.in_use) for s in state.segments]
    expected = [
        [g.name, len(g.rows), g.reserved, g.in_use] for g in segment_groups([s.size for s in state.segments], in_use)
    ]
    groups = "document.getElementById('map0').layout.meta.overview"
    shown = page.evaluate(f"() => {groups}.map((g) => [g.name, g.rows.length, g.reserved, g.inUse])")
    assert shown == expected
    assert [g[:2] for g in shown] == [["≤ 2.0 MiB", 10], ["16 MiB–32 MiB", 542], ["64 MiB–128 MiB", 457],
                                      ["128 MiB–256 MiB", 1]]  # fmt: skip
    assert page.locator("#map0 .ytick").count() == 4
    # drill down: a click on the 542 segments of 16-32 MiB draws them, at most MAX_LABELS labelled
    click(page, "map0", "in use", 1)
    page.wait_for_function("document.getElementById('map0').dataset.view === 'group'")
    assert page.evaluate("document.getElementById('map0').layout.meta.bases.length") == 542
    labels = page.locator("#map0 .ytick").count()
    assert 0 < labels <= MAX_LABELS
    assert page.inner_text("#map0-nav") == "overview › 16 MiB–32 MiB"
    # a click on a segment draws it alone, chunk by chunk; hovering a block names its allocation
    # the last segment with an allocation made in the traced step (a call site); its rows are
    # ~1.5 px high among 542, so the user zooms in on it first (a click could land a row off)
    group = [s for s in state.segments if 16 * MiB < s.size <= 32 * MiB]
    row = max(i for i, s in enumerate(group) if any(c.in_use and site(c.stack) for c in s.chunks))
    page.evaluate("(row) => Plotly.relayout('map0', {'yaxis.range': [row + 4.5, row - 4.5]})", row)
    bar = page.evaluate("(row) => document.getElementById('map0')._fullData.find("
                        "(t) => t.name === 'used (aggregated)').y.indexOf(row)", row)  # fmt: skip
    click(page, "map0", "used (aggregated)", bar)
    page.wait_for_function("document.getElementById('map0').dataset.view === 'segment'")
    assert page.evaluate("document.getElementById('map0').layout.meta.bases.length") == 1
    assert page.evaluate("document.getElementById('map0').layout.meta.bases[0]") == group[row].base
    page.evaluate("document.getElementById('map0').scrollIntoView()")
    page.mouse.move(0, 0)
    page.wait_for_function("!document.querySelector('#map0 .hoverlayer .hovertext')")
    named = page.evaluate("document.getElementById('map0')._fullData.find((t) => t.name === 'used')"
                          ".customdata.findIndex((c) => c[5] >= 0)")  # fmt: skip
    assert named >= 0
    page.mouse.move(*page.evaluate(_CENTER, ["map0", "used", named]))
    page.wait_for_selector("#map0 .hoverlayer .hovertext")
    hover = page.evaluate("document.querySelector('#map0 .hoverlayer .hovertext').textContent")
    assert "requested" in hover and "allocated at event" in hover
    chunk = next(c for c in group[row].chunks if c.in_use and site(c.stack))  # the first named, by address
    assert f"address {chunk.address:#x}" in hover and f"call site {site(chunk.stack)}" in hover
    # back to the overview from the breadcrumbs
    page.click("#map0-nav a >> text=overview")
    page.wait_for_function("document.getElementById('map0').dataset.view === 'overview'")
    assert errors == []
    page.close()


def test_a_click_on_the_active_memory_view_moves_the_map_there(browser: Any, cs336: Any) -> None:
    report, p = cs336
    page = browser.new_page()
    errors = collect_errors(page)
    offline(page)
    page.goto(report.as_uri(), wait_until="load")
    names = page.evaluate("document.getElementById('active0').data.map((t) => t.name)")
    assert "optimizers.py:82" in names and "optimizers.py:84" in names
    dp = p.devices["GPU:0"]
    target = int(dp.series.index[len(dp.series) // 2])
    page.evaluate("(x) => document.getElementById('active0').emit('plotly_click', {points: [{customdata: x}]})", target)
    position = int(page.evaluate("document.getElementById('map0').dataset.position"))
    assert position <= target  # exactly there where the embedded events reach, else the stop before
    assert page.inner_text("#map0-label").startswith(f"event {position} ")
    assert errors == []
    page.close()
