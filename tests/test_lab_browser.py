"""JupyterLab in a real browser (Debian's Chromium, Playwright): the magic's dashboard in a running
notebook, and the JupyterLab extension rendering saved results without a kernel."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import nbformat
import pytest
from browsing import collect_errors, drag_zoom, needs_chromium, run_notebook
from nbformat.v4 import new_code_cell, new_notebook
from test_browser import EVIL, make_oom_report

import gpuviz
from gpuviz.frontends.options import write_report

pytestmark = needs_chromium


@pytest.fixture
def lab(lab_server: tuple[str, str, Path]) -> tuple[str, Path]:
    base, token, root = lab_server
    cell = (  # live (the default): the dashboard refreshes from a thread while the cell runs
        "%%gpuviz\nimport time, numpy as np, gpuviz\nx = gpuviz.asarray(np.ones((32, 32)))\n"
        "for _ in range(40):\n    y = x @ x\n    time.sleep(0.1)\nfloat(y.sum())"
    )
    book = new_notebook(cells=[new_code_cell("%load_ext gpuviz"), new_code_cell(cell)])
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(book, root / "magic.ipynb")
    return f"{base}/lab/tree/magic.ipynb?token={token}", root


def test_magic_renders_the_dashboard_in_jupyterlab(browser, lab) -> None:  # type: ignore[no-untyped-def]
    url, _ = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = collect_errors(page, console=False)
    page.goto(url)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=90_000)  # the kernel is ready
    page.locator(".jp-Cell").first.click()
    page.keyboard.press("Shift+Enter")
    page.keyboard.press("Shift+Enter")
    page.wait_for_selector(".gpuviz-dashboard .gpuviz-timeline .main-svg", timeout=120_000)
    # live: while the 4 s sleepy cell runs, new points are appended to the drawn timeline (only the
    # live updates extend it; the final draw replaces the figure)
    page.wait_for_function(
        "Number(document.querySelector('.gpuviz-dashboard[data-extends]')?.dataset.extends || 0) >= 5",
        timeout=60_000,
    )
    # the cell's value is its output; then the final views: the map at the peak, a labelled slider
    page.wait_for_selector(".jp-OutputArea-executeResult >> text=32768.0", timeout=120_000)
    page.wait_for_function("document.querySelector('.gpuviz-slider-label').innerText.includes('peak')")
    label = page.inner_text(".gpuviz-slider-label")
    assert re.fullmatch(r"event \d+ of \d+ · \d+\.\d{6} s · alloc · peak", label), label
    assert page.locator(".gpuviz-dashboard .gpuviz-map .bars path").count() >= 2  # chunks drawn
    # the left arrow key steps one allocator event back; the kernel redraws the map there, and a
    # zoom the user made survives the step
    peak = int(label.split()[1])
    page.wait_for_selector(".gpuviz-dashboard .gpuviz-slider:enabled")  # scrubbable once the final draw is done
    drag_zoom(page, ".gpuviz-dashboard .gpuviz-map")  # a tenth to a half
    map_range = "document.querySelector('.gpuviz-dashboard .gpuviz-map').layout.xaxis.range"
    zoomed = page.evaluate(map_range)
    assert zoomed[0] > 0
    draws = page.evaluate("Number(document.querySelector('.gpuviz-dashboard').dataset.mapDraws)")
    page.locator(".gpuviz-dashboard .gpuviz-slider").press("ArrowLeft")
    page.wait_for_function(f"Number(document.querySelector('.gpuviz-dashboard').dataset.mapDraws) > {draws}")
    stepped = page.inner_text(".gpuviz-slider-label")
    assert page.evaluate(map_range) == zoomed
    assert int(stepped.split()[1]) < peak and not stepped.endswith("peak"), stepped
    stops = page.locator(".gpuviz-dashboard .gpuviz-stops option").all_inner_texts()
    assert any(s.startswith("mark 'cell' · event ") for s in stops), stops
    assert any(s.startswith("peak · event ") for s in stops), stops
    assert errors == []
    header = page.inner_text(".gpuviz-dashboard")
    events = int(re.search(r"(\d+) events", header).group(1))  # type: ignore[union-attr]
    assert events >= 40 * 3  # each of the 40 matmuls: a placement, an alloc and a free at least
    page.screenshot(path=str(Path(os.environ.get("GPUVIZ_SCREENSHOT_DIR", lab[1])) / "lab.png"))
    page.close()


OOM_CELL = """%%gpuviz --growth --memory-limit 64MiB
import numpy as np, gpuviz
keep = [gpuviz.empty(1 << 20, np.float32) for _ in range(14)]  # 14 arrays of 4 MiB
del keep[::2]  # every other one freed: 36 MiB free, in holes of at most 8 MiB
big = gpuviz.empty(3 << 20, np.float32)  # 12 MiB: out of memory"""


def test_dashboard_opens_at_the_oom_in_jupyterlab(browser, lab_server) -> None:  # type: ignore[no-untyped-def]
    """A ``%%gpuviz`` cell that runs out of memory: the cell shows its own error, and the
    dashboard opens at the OOM with the ghost bar, the pinning allocations and their list."""
    root = lab_server[2]
    cells = ["%load_ext gpuviz", OOM_CELL]
    page, errors = run_notebook(browser, lab_server, "oom.ipynb", cells, viewport={"width": 1300, "height": 1250})
    page.wait_for_selector(".jp-OutputArea-output >> text=OutOfMemoryError", timeout=120_000)
    page.wait_for_function(
        "document.querySelector('.gpuviz-slider-label')?.innerText.endsWith('oom \u00b7 OOM')", timeout=120_000
    )
    names = page.evaluate("document.querySelector('.gpuviz-dashboard .gpuviz-map').data.map(t => t.name)")
    assert names[-2:] == ["pinning", "failed request"]
    ghost = page.evaluate(
        "document.querySelector('.gpuviz-dashboard .gpuviz-map').data.find(t => t.name === 'failed request').x"
    )
    assert ghost == [12 << 20]
    heights = page.evaluate(  # the final map's own layout, drawn whole: 220 px + 28 px for each of 5 segments
        "(m => [m.layout.height, Math.round(m.getBoundingClientRect().height)])"
        "(document.querySelector('.gpuviz-dashboard .gpuviz-map'))"
    )
    assert heights == [360, 360]
    assert page.locator(".gpuviz-dashboard .gpuviz-map .bars path").count() >= 10
    rows = page.eval_on_selector_all(  # segment rows top to bottom, as drawn
        ".gpuviz-dashboard .gpuviz-map .ytick text", "ts => ts.map(t => [t.getBoundingClientRect().y, t.textContent])"
    )
    drawn = [text for _, text in sorted(rows)]
    assert len(drawn) == 5 and drawn == sorted(drawn, key=lambda t: int(t, 16))  # by address
    page.wait_for_timeout(500)  # (a late resize of the map would show here)
    box = page.locator(".gpuviz-dashboard .gpuviz-map .main-svg").first.bounding_box()
    side = page.locator(".gpuviz-dashboard div.gpuviz-pinning").bounding_box()
    assert box is not None and side is not None and box["x"] + box["width"] <= side["x"] + 1  # side by side
    text = page.inner_text(".gpuviz-dashboard")
    assert "Out of memory: 12 MiB requested" in text and "free 36 MiB in" in text and "largest 8.0 MiB" in text
    assert errors == []
    page.evaluate("document.querySelector('.gpuviz-dashboard').scrollIntoView()")
    if page.locator(".jp-toast-button", has_text="No").count():
        page.locator(".jp-toast-button", has_text="No").first.click()  # JupyterLab's news question
    page.screenshot(path=str(Path(os.environ.get("GPUVIZ_SCREENSHOT_DIR", root)) / "dashboard-oom.png"))
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
    errors = collect_errors(page, console=False)
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

    # a TensorFlow profile opens the same way: the server tells its format by its content
    fixture = Path(__file__).resolve().parent / "fixtures" / "tf_bfc" / "oom.xplane.pb.gz"
    (root / "host.xplane.pb").write_bytes(gzip.decompress(fixture.read_bytes()))
    page.goto(f"{base}/lab/tree/host.xplane.pb?reset&token={token}")
    page.wait_for_selector(".jp-gpuviz-result .js-plotly-plot", timeout=90_000)
    assert page.inner_text(".jp-gpuviz-result h3 >> nth=0") == "host.xplane.pb"
    assert "CPU:0: peak in use" in page.inner_text(".jp-gpuviz-result")

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


def test_jupyterlab_result_opens_at_the_oom(browser, lab_server) -> None:  # type: ignore[no-untyped-def]
    """A saved result of a run that ran out of memory: the map is the heap at the OOM with the
    ghost bar and the pinning chunk; the tables have human headers, formatted values, totals,
    the pinning row highlighted, and sort by value."""
    base, token, root = lab_server
    make_oom_report(root / "oom.gpuviz.json")
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    errors = collect_errors(page, console=False)
    page.goto(f"{base}/lab/tree/oom.gpuviz.json?reset&token={token}")
    plots = "document.querySelectorAll('.jp-gpuviz-result .js-plotly-plot').length === 2"
    page.wait_for_function(plots, timeout=90_000)
    headings = page.locator(".jp-gpuviz-result h3").all_inner_texts()
    assert headings[1] == "GPU:0: heap at the out-of-memory error"  # the first figure: the map at the OOM
    names = page.evaluate("document.querySelector('.jp-gpuviz-figure').data.map(t => t.name)")
    assert names[-2:] == ["pinning", "failed request"]
    assert "freeing this allocation would have made a hole of 7.0 MiB" in page.inner_text(".jp-gpuviz-result pre")
    pinning = page.locator(".jp-gpuviz-result table[data-name='pinning:GPU:0']")
    assert pinning.locator("thead th").all_inner_texts()[:4] == ["tag", "chunk", "requested", "address"]
    row = pinning.locator("tbody tr").first
    assert row.get_attribute("class") == "jp-gpuviz-highlight"
    assert row.locator("td").all_inner_texts()[:4] == ["A", "1.0 MiB", "1.0 MiB", "0x10000300000"]
    live = page.locator(".jp-gpuviz-result table[data-name='live:GPU:0']")
    assert live.locator("tfoot td").all_inner_texts()[:5] == ["total", "", "", "9.0 MiB", "9.0 MiB"]
    live.locator("thead th", has_text="chunk").click()
    assert live.locator("tbody tr td:nth-child(5)").all_inner_texts() == ["512 KiB", "1.0 MiB", "2.0 MiB", "5.5 MiB"]
    assert errors == []
    shots = Path(os.environ.get("GPUVIZ_SCREENSHOT_DIR", root))
    page.evaluate("document.querySelector('.jp-gpuviz-result').scrollTop = 0")
    if page.locator(".jp-toast-button", has_text="No").count():
        page.locator(".jp-toast-button", has_text="No").first.click()  # JupyterLab's news question
    page.screenshot(path=str(shots / "labextension-oom.png"))
    page.close()
