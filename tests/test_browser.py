"""A real browser: Debian's Chromium driven by Playwright (PyPI) opens a generated report
offline, and runs a notebook with the magic in a real JupyterLab server."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

import gpuviz
from gpuviz.frontends.options import write_report

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM) and os.environ.get("CI"):
    raise RuntimeError(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium before the tests")
pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (apt-get install chromium)"
)
EVIL = "<script>window.__pwned=1</script>"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]  # fmt: skip


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield instance
        instance.close()


def make_report(path: Path) -> None:
    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), growth=True, log=log)
    gpuviz.mark(EVIL, log=log)
    keep = [alloc.allocate(3 << 20, tag=EVIL)]
    for i in range(200):
        p = alloc.allocate((i % 7 + 1) << 20, tag=f"batch {i % 3}")
        if i % 5:
            alloc.free(p)
        else:
            keep.append(p)
    write_report(log, path)


def test_report_offline(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "report.html"
    make_report(path)
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route("http*://**", lambda route: route.abort())  # offline: nothing but the file
    page.goto(path.as_uri())
    page.wait_for_selector("#map0 .main-svg")
    page.wait_for_selector("#timeline0 .main-svg")
    assert page.locator(".js-plotly-plot").count() == 2
    assert page.locator("#map0 .bars path").count() > 10  # chunks drawn
    before = page.evaluate("JSON.stringify(document.getElementById('map0').data)")
    label_before = page.inner_text("#map0-label")
    page.eval_on_selector("#map0-slider", "el => { el.value = 0; el.dispatchEvent(new Event('input')); }")
    after = page.evaluate("JSON.stringify(document.getElementById('map0').data)")
    assert after != before and page.inner_text("#map0-label") != label_before
    # the first instant: right after the first allocator event (event 0 is the mark)
    assert page.inner_text("#map0-label").startswith("event 1 · ")
    assert "in use 0B · pool 4.00MiB" in page.inner_text("#map0-label")
    assert EVIL in page.inner_text("body")  # shown as text
    assert page.evaluate("window.__pwned === undefined")
    assert errors == []
    page.close()


@pytest.fixture
def lab(lab_server: tuple[str, str, Path]) -> tuple[str, Path]:
    base, token, root = lab_server
    cell = (  # live (the default): the dashboard refreshes from a thread while the cell runs
        "%%gpuviz\nimport time, numpy as np, gpuviz\nx = gpuviz.asarray(np.ones((32, 32)))\n"
        "for _ in range(15):\n    y = x @ x\n    time.sleep(0.1)"
    )
    book = new_notebook(cells=[new_code_cell("%load_ext gpuviz"), new_code_cell(cell)])
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(book, root / "magic.ipynb")
    return f"{base}/lab/tree/magic.ipynb?token={token}", root


def test_magic_renders_the_dashboard_in_jupyterlab(browser, lab) -> None:  # type: ignore[no-untyped-def]
    url, _ = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=90_000)  # the kernel is ready
    page.locator(".jp-Cell").first.click()
    page.keyboard.press("Shift+Enter")
    page.keyboard.press("Shift+Enter")
    page.wait_for_selector(".gpuviz-dashboard", timeout=120_000)
    page.wait_for_selector(".gpuviz-dashboard .js-plotly-plot", timeout=120_000)
    assert page.locator(".gpuviz-dashboard .js-plotly-plot").count() >= 1
    header = page.inner_text(".gpuviz-dashboard")
    events = int(re.search(r"(\d+) events", header).group(1))  # type: ignore[union-attr]
    assert events >= 15 * 3  # each of the 15 matmuls: a placement, an alloc and a free at least
    page.screenshot(path=str(Path(os.environ.get("GPUVIZ_SCREENSHOT_DIR", lab[1])) / "lab.png"))
    page.close()


def test_labextension_renders_saved_results(browser, lab_server, runtime_log) -> None:  # type: ignore[no-untyped-def]
    """Saved results render in JupyterLab without a kernel: a .gpuviz.json file opened from
    the file browser, and an EventLog output stored in an executed notebook."""
    from nbclient import NotebookClient

    base, token, root = lab_server
    import numpy as np

    with gpuviz.device("CPU:0"):
        host = gpuviz.asarray(np.ones((64, 64), dtype=np.float32))
    x = gpuviz.asarray(host)  # a placement, a copy to the GPU
    for _ in range(3):
        x = x @ x
    gpuviz.mark(EVIL)
    runtime_log.save(root / "run.arrow")
    write_report(runtime_log, root / "run.gpuviz.json")
    book = new_notebook(cells=[new_code_cell("import gpuviz\ngpuviz.load('run.arrow')")])
    NotebookClient(book, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(root)}}).execute()
    assert "application/vnd.gpuviz.v1+json" in book.cells[0].outputs[0]["data"]
    nbformat.write(book, root / "saved.ipynb")

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{base}/lab/tree/run.gpuviz.json?reset&token={token}")
    page.wait_for_selector(".jp-gpuviz-result .js-plotly-plot", timeout=90_000)
    figures = len(json.loads((root / "run.gpuviz.json").read_text())["figures"])
    assert figures == 4  # heap at the peak and timeline, for GPU:0 and CPU:0
    page.wait_for_function(f"document.querySelectorAll('.jp-gpuviz-result .js-plotly-plot').length === {figures}")
    text = page.inner_text(".jp-gpuviz-result")
    assert "GPU:0: peak in use" in text and "Placement" in text
    rows = page.locator(".jp-gpuviz-result table[data-name='placement'] tbody tr").all_inner_texts()
    expected = [["Const", "CPU:0", "CPU:0", "1"], ["MatMul", "", "GPU:0", "3"]]
    assert sorted(row.split("\t")[:4] for row in rows) == expected  # rows are sorted by op time, which varies

    # the event log itself opens as the same result, analysed by the server extension; the
    # browser asks for the file's metadata only, never its content
    contents: list[str] = []
    page.on("request", lambda r: contents.append(r.url) if "/api/contents/run.arrow?" in r.url else None)
    page.goto(f"{base}/lab/tree/run.arrow?reset&token={token}")
    page.wait_for_function(
        f"document.querySelectorAll('.jp-gpuviz-result .js-plotly-plot').length === {figures}", timeout=90_000
    )
    opened = page.locator(".jp-gpuviz-result table[data-name='placement'] tbody tr").all_inner_texts()
    assert opened == rows
    assert page.inner_text(".jp-gpuviz-result h3 >> nth=0") == "run.arrow"
    assert contents and all("content=0" in url for url in contents), contents

    # a PyTorch snapshot opens in the same view (not as text); what the server says about it is shown
    (root / "snapshot.pickle").write_bytes(b"\x80\x04not a snapshot")
    page.goto(f"{base}/lab/tree/snapshot.pickle?reset&token={token}")
    page.wait_for_selector(".jp-gpuviz-result .jp-gpuviz-error", timeout=90_000)
    assert page.inner_text(".jp-gpuviz-error").startswith("snapshot.pickle: ")
    assert "(HTTP 400)" in page.inner_text(".jp-gpuviz-error")

    newer = json.loads((root / "run.gpuviz.json").read_text()) | {"version": 2}
    (root / "newer.gpuviz.json").write_text(json.dumps(newer))
    page.goto(f"{base}/lab/tree/newer.gpuviz.json?reset&token={token}")
    page.wait_for_selector(".jp-gpuviz-result .jp-gpuviz-error", timeout=90_000)
    assert page.inner_text(".jp-gpuviz-error") == "gpuviz result format version 2; this extension reads version 1"

    page.goto(f"{base}/lab/tree/saved.ipynb?reset&token={token}")
    page.wait_for_selector(".jp-OutputArea-output.jp-gpuviz-result .js-plotly-plot", timeout=90_000)
    assert page.locator(".jp-OutputArea-output.jp-gpuviz-result").count() == 1  # ranked above the HTML fallback
    assert page.evaluate("window.__pwned === undefined")
    assert errors == []
    page.screenshot(path=str(Path(os.environ.get("GPUVIZ_SCREENSHOT_DIR", root)) / "labextension.png"))
    page.close()
