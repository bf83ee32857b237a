"""A drill-down group of many segments (2,400 of 2 MiB, made here) in a real JupyterLab
(Chromium through Playwright): in the JupyterLab extension's view of the saved file (no kernel)
and in the notebook dashboard, a click on its overview row draws the group as an image of 400
rows, and hovering a row names its six segments, its largest allocation and its call site; in
the dashboard a click on a row opens the row's first segment alone."""

from __future__ import annotations

# ruff: noqa: RUF001  (the breadcrumbs are joined with a single angle quote)
from typing import Any

import pytest
from browsing import collect_errors, needs_chromium, run_notebook
from manysegments import SITES, dense_groups, segments, write_snapshot
from test_drilldown_browser import click, hover

pytestmark = [pytest.mark.slow, needs_chromium]
SMALL = 2400
NAME = "≤ 2.0 MiB"


def open_dense_group(page: Any, plot: str, view: str) -> None:
    """A click on the overview's first row; checks the image of runs and a row's hover."""
    click(page, plot, "reserved, unused", 0)
    page.wait_for_function(f"(gd => {view})(document.querySelector(`{plot}`)) === 'group'", timeout=60_000)
    assert page.eval_on_selector(plot, "gd => gd._fullData.map((t) => t.type)") == ["heatmap", "bar"]
    assert page.eval_on_selector(plot, "gd => gd.data[0].z.length") == 400
    bases = [base for base, size, *_ in segments(dense_groups(SMALL)) if size == 2 << 20]
    text = hover(page, plot, "segments", 5)
    assert f"6 segments {bases[30]:#x} to {bases[35]:#x}" in text and "reserved 12 MiB" in text
    assert f"call site {SITES[NAME]}" in text and "largest allocation" in text


def test_the_labextension_draws_a_group_of_many_segments_as_an_image(browser, lab_server) -> None:  # type: ignore[no-untyped-def]
    base, token, root = lab_server
    write_snapshot(root / "dense.pickle", dense_groups(SMALL))
    page = browser.new_page(viewport={"width": 1300, "height": 1100})
    errors = collect_errors(page, console=False)
    page.goto(f"{base}/lab/tree/dense.pickle?reset&token={token}")
    plot = ".jp-gpuviz-result .jp-gpuviz-figure[data-name='map:GPU:0']"
    page.wait_for_selector(f"{plot}[data-view='overview']", timeout=90_000)
    open_dense_group(page, plot, "gd.dataset.view")
    assert errors == []
    page.close()


def test_the_dashboard_draws_a_group_of_many_segments_as_an_image(browser, lab_server) -> None:  # type: ignore[no-untyped-def]
    write_snapshot(lab_server[2] / "dense.pickle", dense_groups(SMALL))
    cells = ["%load_ext gpuviz\n%gpuviz show dense.pickle"]
    page, errors = run_notebook(browser, lab_server, "dense.ipynb", cells, viewport={"width": 1300, "height": 1100})
    plot = ".gpuviz-dashboard .gpuviz-map"
    page.wait_for_function(f"document.querySelector('{plot}')?.layout?.meta?.view === 'overview'", timeout=120_000)
    open_dense_group(page, plot, "gd.layout.meta.view")
    click(page, plot, "segments", 5)  # a row of the image: its first segment alone
    page.wait_for_function(f"document.querySelector('{plot}').layout.meta.view === 'segment'", timeout=60_000)
    first = [base for base, size, *_ in segments(dense_groups(SMALL)) if size == 2 << 20][30]
    assert page.eval_on_selector(plot, "gd => gd.layout.meta.bases") == [first]
    assert page.inner_text(".gpuviz-dashboard .gpuviz-nav") == f"overview › {NAME} › segment {first:#x}"
    assert errors == []
    page.close()
