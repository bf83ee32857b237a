"""A distributed run in a real browser (Debian's Chromium, Playwright): the notebook's cluster
view in JupyterLab, where clicks open a rank's views."""

from __future__ import annotations

import nbformat
from browsing import collect_errors, needs_chromium, offline
from nbformat.v4 import new_code_cell, new_notebook
from runs import write_leaky_run

pytestmark = needs_chromium

HEATMAP = ".gpuviz-cluster-view .gpuviz-heatmap"
ROW_CENTER = """([selector, row]) => {
  // the page coordinates of the middle of heatmap row ``row`` (a category of the y axis)
  const gd = document.querySelector(selector);
  const box = gd.getBoundingClientRect(), xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  return [box.left + xa._offset + xa._length / 2, box.top + ya._offset + ya.l2p(row)];
}"""


def test_notebook_cluster_view_opens_the_clicked_rank(browser, lab_server) -> None:  # type: ignore[no-untyped-def]
    base, token, root = lab_server
    write_leaky_run(root / "run")
    book = new_notebook(cells=[new_code_cell("%load_ext gpuviz"), new_code_cell("%gpuviz show run")])
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(book, root / "run.ipynb")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = collect_errors(page, console=False)
    page.goto(f"{base}/lab/tree/run.ipynb?token={token}")
    page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=90_000)
    page.locator(".jp-Cell").first.click()
    page.keyboard.press("Shift+Enter")  # the extension (and plotly.js, sent once) first, then the run
    page.wait_for_selector(".jp-Cell >> nth=0 >> .jp-InputArea-prompt >> text=[1]:", timeout=120_000)
    page.keyboard.press("Shift+Enter")
    page.wait_for_selector(f"{HEATMAP} .main-svg", timeout=120_000)
    assert (
        page.locator(".gpuviz-cluster-view tr.outlier")
        .all_inner_texts()[0]
        .startswith("2\tnode0\t2\tnode0/rank2/GPU:0")
    )
    labels = page.locator(".gpuviz-cluster-view .gpuviz-rank option").all_inner_texts()
    assert labels[3] == "node0/rank2/GPU:0  ⚠ peak,growth" and len(labels) == 6

    # a click on rank 2's heatmap row opens its views, at its peak
    page.wait_for_selector(".gpuviz-cluster-view[data-heatmap-draws]")
    page.locator(HEATMAP).scroll_into_view_if_needed()
    x, y = page.evaluate(ROW_CENTER, [HEATMAP, 2])
    page.mouse.click(x, y)
    header = ".gpuviz-dashboard .gpuviz-header"
    page.wait_for_selector(f"{header} >> text=node0/rank2/GPU:0 (node0-rank2.arrow)", timeout=60_000)
    page.wait_for_function("document.querySelector('.gpuviz-slider-label')?.innerText.endsWith('· peak')")
    assert page.locator(".gpuviz-dashboard .gpuviz-device option").all_inner_texts() == ["node0/rank2/GPU:0"]
    assert page.locator(".gpuviz-dashboard .gpuviz-map .bars path").count() >= 2  # its chunks drawn
    assert page.input_value(".gpuviz-cluster-view .gpuviz-rank") == "2"

    # a click on a table row, then the dropdown
    page.locator(".gpuviz-cluster-view tr[data-row='4'] td").first.click()
    page.wait_for_selector(f"{header} >> text=node0/rank4/GPU:0 (node0-rank4.arrow)", timeout=60_000)
    page.select_option(".gpuviz-cluster-view .gpuviz-rank", "0")
    page.wait_for_selector(f"{header} >> text=node0/rank0/GPU:0 (node0-rank0.arrow)", timeout=60_000)
    assert page.locator(".gpuviz-dashboard").count() == 1  # one rank's views at a time

    # the switch redraws the heatmap with fragmentation
    page.select_option(".gpuviz-cluster-view .gpuviz-metric", "fragmentation")
    page.wait_for_selector(f"{HEATMAP} .gtitle >> text=fragmentation by rank over time", timeout=60_000)
    assert errors == []
    page.close()


def test_a_click_in_the_run_report_opens_that_ranks_report(browser, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpuviz import load_run
    from gpuviz.frontends.run_report import write_run_report

    run = write_leaky_run(tmp_path / "run")
    written = write_run_report(load_run(run), tmp_path / "run.html", rank_reports="all")
    assert len(written.rank_reports) == 5
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = collect_errors(page)
    offline(page)  # offline: nothing but the files
    page.goto((tmp_path / "run.html").as_uri())
    page.wait_for_selector("#cluster-0 .main-svg")
    for heatmap, rank in (("#cluster-0", 2), ("#cluster-1", 4)):  # bytes in use, then fragmentation
        page.locator(heatmap).scroll_into_view_if_needed()
        page.wait_for_selector(f"{heatmap} .main-svg")
        x, y = page.evaluate(ROW_CENTER, [heatmap, rank])
        page.mouse.click(x, y)
        page.wait_for_url(f"**/run-ranks/node0-rank{rank}.arrow.html")
        page.wait_for_selector("#map0 .main-svg")  # its plotly.js: the folder's shared copy
        assert page.inner_text("h1") == f"gpuviz report: node0/rank{rank}"
        assert page.inner_text("h2 >> nth=1").startswith(f"node0/rank{rank}/GPU:0: peak ")
        assert "· peak ·" in page.inner_text("#map0-label")  # opened at the peak
        page.go_back()
        page.wait_for_selector("#cluster-0 .main-svg")
    page.locator("table.gpuviz-cluster tr[data-row='3'] td >> nth=0").click()  # a table row
    page.wait_for_url("**/run-ranks/node0-rank3.arrow.html")
    assert page.inner_text("h1") == "gpuviz report: node0/rank3"
    # by default only the outlier (here also the highest peak) has a report: other rows stay put
    write_run_report(load_run(run), tmp_path / "default.html")
    page.goto((tmp_path / "default.html").as_uri())
    page.wait_for_selector("#cluster-0 .main-svg")
    page.locator("table.gpuviz-cluster tr[data-row='0'] td >> nth=0").click()
    x, y = page.evaluate(ROW_CENTER, ["#cluster-0", 0])
    page.mouse.click(x, y)
    page.wait_for_timeout(500)
    assert page.url == (tmp_path / "default.html").as_uri()
    page.locator("table.gpuviz-cluster tr[data-row='2'] a").click()  # the device cell's link
    page.wait_for_url("**/default-ranks/node0-rank2.arrow.html")
    assert errors == []
    page.close()


def test_jupyterlab_opens_a_run_manifest_and_a_click_opens_a_rank(browser, lab_server) -> None:  # type: ignore[no-untyped-def]
    base, token, root = lab_server
    write_leaky_run(root / "run1")
    (root / "run1" / "run.gpuviz-run").write_text("")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = collect_errors(page, console=False)
    page.goto(f"{base}/lab/tree/run1/run.gpuviz-run?reset&token={token}")
    heatmap = ".jp-gpuviz-result .jp-gpuviz-figure[data-name='heatmap:bytes_in_use']"
    page.wait_for_selector(f"{heatmap} .main-svg", timeout=90_000)
    page.wait_for_function("document.querySelectorAll('.jp-gpuviz-result .js-plotly-plot').length === 2")
    assert page.inner_text(".jp-gpuviz-result h3 >> nth=0") == "run1/run.gpuviz-run"
    assert page.inner_text(".jp-gpuviz-summary").startswith("run: 5 ranks on 1 hosts, 5 devices")
    rows = page.locator(".jp-gpuviz-result table[data-name='ranks'] tbody tr")
    assert rows.count() == 5
    highlighted = page.locator("table[data-name='ranks'] tr.jp-gpuviz-highlight").all_inner_texts()
    assert len(highlighted) == 1 and "node0/rank2/GPU:0" in highlighted[0] and "peak,growth" in highlighted[0]

    # a click on rank 2's heatmap row opens that rank's result below, through the server route
    page.locator(heatmap).scroll_into_view_if_needed()
    x, y = page.evaluate(ROW_CENTER, [heatmap, 2])
    page.mouse.click(x, y)
    linked = ".jp-gpuviz-linked[data-path='run1/node0-rank2.arrow']"
    page.wait_for_selector(f"{linked} .js-plotly-plot", timeout=90_000)
    assert page.inner_text(f"{linked} h3 >> nth=0") == "run1/node0-rank2.arrow"
    assert "GPU:0: peak in use 14 MiB" in page.inner_text(f"{linked} .jp-gpuviz-summary")
    assert page.inner_text(f"{linked} h3 >> nth=1") == "GPU:0: heap at the peak"
    # a click on a table row replaces it with that rank's
    page.locator("table[data-name='ranks'] tbody tr >> nth=4").click()
    page.wait_for_selector(".jp-gpuviz-linked[data-path='run1/node0-rank4.arrow'] .js-plotly-plot", timeout=90_000)
    assert page.locator(".jp-gpuviz-linked").count() == 1
    assert errors == []
    page.screenshot(path=str(root / "run.png"))
    page.close()


def test_the_fragmentation_heatmap_of_a_wide_run_is_drawn_when_scrolled_to(browser, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Below a 64-row heatmap the second one costs the page's load nothing: drawn when scrolled
    to, and then a click on its rows opens that rank's page, as on the first."""
    from test_cluster_scale import wide_run

    from gpuviz.views.cluster import cluster_report_html

    (tmp_path / "run").mkdir()
    summary = wide_run(tmp_path / "run", 64)
    links = [f"rank{i}.html" for i in range(64)]
    for i in (0, 40):
        (tmp_path / links[i]).write_text(f"<html><body><h1>rank {i}</h1></body></html>")
    (tmp_path / "run.html").write_text(cluster_report_html(summary, links=links), encoding="utf-8")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = collect_errors(page)
    offline(page)
    page.goto((tmp_path / "run.html").as_uri())
    page.wait_for_selector("#cluster-0 .main-svg")
    page.wait_for_timeout(500)
    assert page.locator("#cluster-1 .main-svg").count() == 0  # below the fold: not drawn
    assert page.evaluate("document.getElementById('cluster-1').getBoundingClientRect().height") == 24 * 64 + 150
    x, y = page.evaluate(ROW_CENTER, ["#cluster-0", 0])
    page.mouse.click(x, y)
    page.wait_for_url("**/rank0.html")
    page.go_back()
    page.wait_for_selector("#cluster-0 .main-svg")
    page.locator("#cluster-1").scroll_into_view_if_needed()
    page.wait_for_selector("#cluster-1 .main-svg")
    assert page.text_content("#cluster-1 .gtitle") == "fragmentation by rank over time"
    x, y = page.evaluate(ROW_CENTER, ["#cluster-1", 40])
    page.mouse.click(x, y)
    page.wait_for_url("**/rank40.html")
    assert errors == []
    page.close()
