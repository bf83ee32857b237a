"""The map's overview and drill-down in a real JupyterLab (Chromium through Playwright): a
PyTorch snapshot of 101 segments (made here, its answer known) opens as the overview by size
class with each group's segment count and totals, in the notebook dashboard (``%gpuviz show``,
the kernel draws each level) and in the JupyterLab extension's view of the saved file (no
kernel: the result embeds each group's map). A click on a group draws its segments, a click on
a segment draws it alone, and hovering its block names the allocation and its call site; in
the dashboard a click on the active-memory view moves the map to that moment. The
largest real PyTorch snapshot (cs336, 1,010 segments; ``GPUVIZ_TEST_TRACES``, optional) opens
as the same overview in both."""

from __future__ import annotations

# ruff: noqa: RUF001  (the size classes are named with an en dash)
import shutil
from typing import Any

import pytest
from browsing import collect_errors, needs_chromium, run_notebook
from manysegments import GROUPS, SITES, segments, write_snapshot
from traces import needs_traces, trace_path

pytestmark = [
    pytest.mark.slow,
    needs_chromium,
]
CS336 = "pt_snapshot_cs336_ctx128_fullstep_2025.pickle"
ROWS = [f"{name} · {count} segment{'s' if count > 1 else ''}" for name, count, _, _ in GROUPS]
_CENTER = """([selector, name, i]) => {
  // the page coordinates of the middle of bar i of the trace named `name` in the plot `selector`
  const gd = document.querySelector(selector), t = gd._fullData.find((d) => d.name === name);
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
  return [box.left + xa._offset + xa.l2p(t.base[i] + t.x[i] / 2), box.top + ya._offset + ya.l2p(ya.d2c(t.y[i]))];
}"""


def hover(page: Any, plot: str, trace: str, bar: int) -> str:
    """Move the real mouse onto bar ``bar`` of ``trace`` in ``plot``; plotly's hover label."""
    page.eval_on_selector(plot, "gd => gd.scrollIntoView({block: 'center'})")
    page.mouse.move(0, 0)
    page.wait_for_function(f"!document.querySelector(`{plot} .hoverlayer .hovertext`)")
    x, y = page.evaluate(_CENTER, [plot, trace, bar])
    page.mouse.move(x, y)
    page.wait_for_selector(f"{plot} .hoverlayer .hovertext")
    return str(page.eval_on_selector(f"{plot} .hoverlayer .hovertext", "t => t.textContent"))


def click(page: Any, plot: str, trace: str, bar: int) -> None:
    """A real click on bar ``bar`` of ``trace`` (plotly clicks what is hovered: hover first)."""
    hover(page, plot, trace, bar)
    page.eval_on_selector(plot, "gd => { gd._mouseDownTime = 0; }")  # not a double click with the last one
    x, y = page.evaluate(_CENTER, [plot, trace, bar])
    page.mouse.click(x, y)


def overview_rows(page: Any, plot: str) -> list[str]:
    return list(page.eval_on_selector(plot, "gd => gd.layout.yaxis.ticktext"))


def drill_down(page: Any, plot: str, view: str) -> None:
    """Overview → the group of 2 MiB segments → its 8th segment, from real clicks; ``view``: a JS
    expression of the level drawn (given ``gd``, the plot)."""
    level = f"gd => {view}"
    assert page.eval_on_selector(plot, level) == "overview"
    assert overview_rows(page, plot) == ROWS
    assert page.eval_on_selector(plot, "gd => gd.layout.meta.groups") == [g[0] for g in GROUPS]
    hovered = hover(page, plot, "reserved, unused", 0)
    assert "70 segments of ≤ 2.0 MiB" in hovered and "reserved 140 MiB" in hovered and "in use 35 MiB" in hovered
    click(page, plot, "reserved, unused", 0)
    page.wait_for_function(f"(gd => {view})(document.querySelector(`{plot}`)) === 'group'")
    small = [base for base, size, *_ in segments() if size == 2 << 20]
    assert page.eval_on_selector(plot, "gd => gd.layout.meta.bases") == small
    drawn = page.eval_on_selector(plot, "gd => [...new Set(gd.data.flatMap((t) => t.y))]")
    assert sorted(drawn) == sorted(f"{b:#x}" for b in small)
    row = page.eval_on_selector(plot, f"gd => gd._fullData.find((t) => t.name === 'used').y.indexOf('{small[7]:#x}')")
    click(page, plot, "used", row)
    page.wait_for_function(f"(gd => {view})(document.querySelector(`{plot}`)) === 'segment'")
    assert page.eval_on_selector(plot, "gd => gd.layout.meta.bases") == [small[7]]
    text = hover(page, plot, "used", 0)
    assert f"address {small[7]:#x}" in text and f"call site {SITES['≤ 2.0 MiB']}" in text
    assert "requested 512 KiB" in text


def test_the_dashboard_opens_many_segments_as_an_overview_and_drills_down(browser, lab_server) -> None:  # type: ignore[no-untyped-def]
    write_snapshot(lab_server[2] / "many.pickle")
    cells = ["%load_ext gpuviz", "%gpuviz show many.pickle"]
    page, errors = run_notebook(browser, lab_server, "many.ipynb", cells, viewport={"width": 1300, "height": 1100})
    plot = ".gpuviz-dashboard .gpuviz-map"
    page.wait_for_function(f"document.querySelector('{plot}')?.layout?.meta?.view === 'overview'", timeout=120_000)
    assert page.inner_text(".gpuviz-dashboard .gpuviz-nav") == "overview of the segments (click a row)"
    drill_down(page, plot, "gd.layout.meta.view")
    assert page.inner_text(".gpuviz-dashboard .gpuviz-nav") == f"overview › ≤ 2.0 MiB › segment {segments()[7][0]:#x}"
    page.click(".gpuviz-dashboard .gpuviz-nav a >> text=overview")  # the breadcrumbs go back up
    page.wait_for_function(f"document.querySelector('{plot}').layout.meta.view === 'overview'")
    # a click on the active-memory view: the kernel moves the slider and the map to that moment
    active = ".gpuviz-dashboard .gpuviz-active"
    moments = page.eval_on_selector(active, "gd => gd.data.flatMap((t) => Array.from(t.customdata || []))")
    target = sorted(set(moments))[len(set(moments)) // 3]
    page.eval_on_selector(active, f"gd => gd.emit('plotly_click', {{points: [{{customdata: {target}}}]}})")
    page.wait_for_function(
        f"document.querySelector('.gpuviz-slider-label').innerText.startsWith('event {target} of ')", timeout=60_000
    )
    assert page.eval_on_selector(plot, "gd => gd.layout.title.text").startswith(f"GPU:0 after event {target} ")
    assert errors == []
    page.close()


def test_the_labextension_opens_many_segments_as_an_overview_and_drills_down(browser, lab_server) -> None:  # type: ignore[no-untyped-def]
    base, token, root = lab_server
    write_snapshot(root / "many.pickle")
    page = browser.new_page(viewport={"width": 1300, "height": 1100})
    errors = collect_errors(page, console=False)
    page.goto(f"{base}/lab/tree/many.pickle?reset&token={token}")
    plot = ".jp-gpuviz-result .jp-gpuviz-figure[data-name='map:GPU:0']"
    page.wait_for_selector(f"{plot}[data-view='overview']", timeout=90_000)
    nav = ".jp-gpuviz-result .jp-gpuviz-nav[data-name='map:GPU:0']"
    assert page.inner_text(nav) == "overview of the segments (click a row)"
    drill_down(page, plot, "gd.dataset.view")
    assert page.inner_text(nav) == f"overview › ≤ 2.0 MiB › segment {segments()[7][0]:#x}"
    page.click(f"{nav} a >> text=≤ 2.0 MiB")
    page.wait_for_selector(f"{plot}[data-view='group']")
    page.click(f"{nav} a >> text=overview")
    page.wait_for_selector(f"{plot}[data-view='overview']")
    assert overview_rows(page, plot) == ROWS
    assert errors == []
    page.close()


@needs_traces
def test_the_largest_real_snapshot_opens_as_an_overview_in_the_dashboard_and_the_labextension(  # type: ignore[no-untyped-def]
    browser, lab_server
) -> None:
    """cs336's 1,010 segments: four labelled rows, the groups of the report, in both views."""
    base, token, root = lab_server
    shutil.copyfile(trace_path(CS336), root / "cs336.pickle")  # (a temporary copy: the server's root)
    expected = ["≤ 2.0 MiB · 10 segments", "16 MiB–32 MiB · 542 segments", "64 MiB–128 MiB · 457 segments",
                "128 MiB–256 MiB · 1 segment"]  # fmt: skip
    cells = ["%load_ext gpuviz\n%gpuviz show cs336.pickle"]
    page, errors = run_notebook(browser, lab_server, "cs336.ipynb", cells, viewport={"width": 1300, "height": 1100})
    plot = ".gpuviz-dashboard .gpuviz-map"
    page.wait_for_function(f"document.querySelector('{plot}')?.layout?.meta?.view === 'overview'", timeout=180_000)
    assert overview_rows(page, plot) == expected
    assert page.locator(f"{plot} .ytick").count() == 4
    page.goto(f"{base}/lab/tree/cs336.pickle?reset&token={token}")
    plot = ".jp-gpuviz-result .jp-gpuviz-figure[data-name='map:GPU:0']"
    page.wait_for_selector(f"{plot}[data-view='overview']", timeout=120_000)
    assert overview_rows(page, plot) == expected
    assert page.locator(f"{plot} .ytick").count() == 4
    assert errors == []
    page.close()
