"""A real browser: Debian's Chromium driven by Playwright (PyPI) opens a generated report
offline, and runs a notebook with the magic in a real JupyterLab server."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from browsing import collect_errors, needs_chromium, offline
from nbformat.v4 import new_code_cell, new_notebook

import gpuviz
from gpuviz.analysis.profile import ViewOptions, profile
from gpuviz.frontends.options import write_report
from gpuviz.log.schema import Kind
from gpuviz.views.eventstream import decode_columns, event_stream
from gpuviz.views.fragmentation import map_spec_and_state, metric_text
from gpuviz.views.plotlyjs import CARTESIAN, bundle_for
from gpuviz.views.report import FRAME_RECTANGLES, _frame_label, report_html, scrub_positions, to_script_json

pytestmark = needs_chromium
EVIL = "<script>window.__pwned=1</script>"


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
    errors = collect_errors(page)
    offline(page)  # offline: nothing but the file
    page.goto(path.as_uri())
    page.wait_for_selector("#map0 .main-svg")
    page.wait_for_selector("#timeline0 .main-svg")
    assert page.locator(".js-plotly-plot").count() == 3  # the map, the active-memory view, the timeline
    assert page.locator("#map0 .bars path").count() > 10  # chunks drawn
    before = page.evaluate("JSON.stringify(document.getElementById('map0').data)")
    label_before = page.inner_text("#map0-label")
    page.eval_on_selector("#map0-slider", "el => { el.value = 0; el.dispatchEvent(new Event('input')); }")
    after = page.evaluate("JSON.stringify(document.getElementById('map0').data)")
    assert after != before and page.inner_text("#map0-label") != label_before
    # the first stop: the mark (event 0), before the allocator's first event
    assert page.inner_text("#map0-label").startswith("event 0 · ")
    assert "· mark " in page.inner_text("#map0-label") and "in use 0 B · pool 0 B" in page.inner_text("#map0-label")
    assert EVIL in page.inner_text("body")  # shown as text
    assert page.evaluate("window.__pwned === undefined")
    cartesian = bundle_for({"scatter", "bar", "heatmap"}) is CARTESIAN  # at plotly.py's plotly.js version
    assert page.evaluate("Plotly.PlotSchema.get().traces.sankey === undefined") is cartesian
    assert errors == []
    page.close()


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
    area = page.locator(".gpuviz-dashboard .gpuviz-map .nsewdrag").first
    area.scroll_into_view_if_needed()
    box = area.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.1, y)  # drag a zoom box across a tenth to a half
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.3, y + 2, steps=5)
    page.mouse.move(box["x"] + box["width"] * 0.5, y + 2, steps=5)
    page.mouse.up()
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
    base, token, root = lab_server
    book = new_notebook(cells=[new_code_cell("%load_ext gpuviz"), new_code_cell(OOM_CELL)])
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(book, root / "oom.ipynb")
    page = browser.new_page(viewport={"width": 1300, "height": 1250})
    errors = collect_errors(page, console=False)
    page.goto(f"{base}/lab/tree/oom.ipynb?reset&token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=90_000)
    page.locator(".jp-Cell").first.click()
    page.keyboard.press("Shift+Enter")
    page.keyboard.press("Shift+Enter")
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


def make_oom_report(path: Path) -> dict[str, int]:
    """One 16 MiB segment: free 3 MiB | A 1 MiB | free 3 MiB | B 2 MiB | free 1 MiB | C 512 KiB | D 5.5 MiB,
    then a 6 MiB request fails; releasing A alone would have made a 7 MiB hole."""
    log, addresses = oom_log()
    write_report(log, path)
    return addresses


def oom_log(later: int = 12, **options: Any) -> tuple[gpuviz.EventLog, dict[str, int]]:
    """``make_oom_report``'s run, with ``later`` allocate/free pairs after the OOM."""
    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), memory_limit="16MiB", growth=False, log=log, **options)
    sizes = {"x0": 3 << 20, "A": 1 << 20, "x1": 3 << 20, "B": 2 << 20, "x2": 1 << 20, "C": 512 << 10, "D": 11 << 19}
    addresses = {name: alloc.allocate(size, tag=name) for name, size in sizes.items()}
    for name in ("x0", "x1", "x2"):
        alloc.free(addresses[name])
    gpuviz.mark("before the failure", log=log)
    with pytest.raises(gpuviz.OutOfMemoryError):
        alloc.allocate(6 << 20, tag="big")
    for i in range(later):  # later history: the scrubber has frames after the OOM too
        alloc.free(alloc.allocate((i + 1) * 1000, tag=f"later {i}"))
    return log, addresses


def trace_bars(page, div: str, trace: str):  # type: ignore[no-untyped-def]
    """The drawn bars of the trace named ``trace`` (plotly leaves empty traces out of the bar layer)."""
    groups = f"#{div} .barlayer .trace"
    names = page.eval_on_selector_all(groups, "gs => gs.map(g => g.__data__[0].trace.name)")
    assert trace in names, (trace, names)
    return page.locator(groups).nth(names.index(trace)).locator("path")


def hover_text(page, div: str, trace: str, point: int = 0) -> str:  # type: ignore[no-untyped-def]
    """Move the real mouse onto bar ``point`` of the trace named ``trace`` and read plotly's hover label."""
    bar = trace_bars(page, div, trace).nth(point)
    bar.scroll_into_view_if_needed()
    box = bar.bounding_box()
    assert box is not None and box["width"] > 0
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_selector(f"#{div} .hoverlayer .hovertext")
    script = (
        "g => { const t = g.querySelector('text.nums'); const lines = t.querySelectorAll('tspan.line');"
        " return lines.length ? Array.from(lines).map(l => l.textContent).join('\\n') : t.textContent; }"
    )
    return str(page.eval_on_selector(f"#{div} .hoverlayer .hovertext", script))


def test_report_opens_at_the_oom_with_ghost_bar_and_pinning(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "oom.html"
    addresses = make_oom_report(path)
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    errors = collect_errors(page)
    offline(page)
    page.goto(path.as_uri())
    page.wait_for_selector("#map0 .main-svg")
    # the first frame shown is the OOM
    label = page.inner_text("#map0-label")
    assert "OUT OF MEMORY" in label and label.startswith("event 18 · ")
    names = page.evaluate("document.getElementById('map0').data.map(t => t.name)")
    assert names == ["free hole", "waste", "used", "pinning", "failed request"]
    assert trace_bars(page, "map0", "pinning").count() == 1  # A, drawn
    assert trace_bars(page, "map0", "failed request").count() == 1  # the ghost bar
    assert trace_bars(page, "map0", "free hole").count() == 3
    assert "freeing this allocation would have made a hole of 7.0 MiB" in page.inner_text("#map0")
    page.evaluate("document.querySelector('.scrubber').scrollIntoView()")
    page.screenshot(path=str(Path(os.environ.get("GPUVIZ_SCREENSHOT_DIR", tmp_path)) / "report-oom.png"))
    # hover names the allocation, in the same words as the Python views
    text = hover_text(page, "map0", "pinning")
    assert "requested 1.0 MiB · chunk 1.0 MiB" in text and f"address {addresses['A']:#x}" in text
    assert "allocated at event 4, t = " in text
    used = hover_text(page, "map0", "used", 3)  # D (after A, B, C), worded by the report's script from numbers
    assert used.startswith("D\nrequested 5.5 MiB · chunk 5.5 MiB") and f"address {addresses['D']:#x}" in used
    assert "allocated at event 13, t = " in used
    hole = hover_text(page, "map0", "free hole", 2)
    assert hole == f"free hole 1.0 MiB\naddress {addresses['x2']:#x}"
    # zoom survives scrubbing: zoom in, step with the arrow keys, the x range stays
    area = page.locator("#map0 .nsewdrag").first
    area.scroll_into_view_if_needed()
    box = area.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.1, y)  # drag a zoom box across a tenth to a half
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.3, y + 2, steps=5)
    page.mouse.move(box["x"] + box["width"] * 0.5, y + 2, steps=5)
    page.mouse.up()
    zoomed = page.evaluate("document.getElementById('map0').layout.xaxis.range")
    assert zoomed[0] > 0 and zoomed[1] < 16 << 20
    page.locator("#map0").focus()
    page.keyboard.press("ArrowLeft")
    assert page.inner_text("#map0-label") != label and "OUT OF MEMORY" not in page.inner_text("#map0-label")
    assert page.evaluate("document.getElementById('map0').layout.xaxis.range") == zoomed
    page.keyboard.press("ArrowRight")
    assert page.inner_text("#map0-label") == label
    # the live-at-the-OOM table sorts by size as numbers (text order would put 5.5 MiB before 512 KiB)
    table = page.locator("table.gpuviz-live")
    table.locator("th", has_text="chunk").click()
    values = [
        int(v) for v in table.locator("tbody tr td:nth-child(5)").evaluate_all("c => c.map(x => x.dataset.value)")
    ]
    assert values == sorted(values) and values[0] == 512 << 10 and values[-1] == 11 << 19
    shown = table.locator("tbody tr td:nth-child(5)").all_inner_texts()
    assert shown == ["512 KiB", "1.0 MiB", "2.0 MiB", "5.5 MiB"]
    assert errors == []
    page.close()


def heap_rows(state: Any) -> list[list[Any]]:
    """[address, size, requested, in use] per chunk, as the report's script keeps them."""
    return [[c.address, c.size, c.requested, c.in_use] for c in state.chunks()]


PAGE_HEAP = (
    "e => e.gpuvizHeap && e.gpuvizHeap.flatMap(s => s.chunks.map(c => [c.address, c.size, c.requested, c.inUse]))"
)


def test_report_arrow_keys_step_event_by_event(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """From a stop, ArrowRight shows the next operation's heap (applied by the page from the
    embedded events), ArrowLeft goes back; back at the OOM the ghost bar is drawn again."""
    log, _ = oom_log(later=80)
    path = tmp_path / "steps.html"
    write_report(log, path)
    p = profile(log)
    dp = p.devices["GPU:0"]
    stops = scrub_positions(dp)
    settled = dp.series.index[dp.series.settled & (log["kind"][dp.series.index] != Kind.OOM)].tolist()
    steps = sorted(set(stops) | set(settled))
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    errors = collect_errors(page)
    offline(page)
    page.goto(path.as_uri())
    page.wait_for_selector("#map0 .main-svg")
    oom_label = page.inner_text("#map0-label")
    assert oom_label.startswith("event 18 · ") and "OUT OF MEMORY" in oom_label
    page.locator("#map0").focus()
    at = steps.index(18)
    events_between = 0
    for k in range(at + 1, at + 9):  # the 8 operations after the OOM, each a keypress
        page.keyboard.press("ArrowRight")
        position = steps[k]
        assert page.inner_text("#map0-label").startswith(f"event {position} · "), (position, stops)
        assert page.evaluate("document.getElementById('map0').dataset.position") == str(position)
        if position not in stops:  # drawn from the events: the page's heap is replay's, chunk by chunk
            events_between += 1
            assert page.eval_on_selector("#map0", PAGE_HEAP) == heap_rows(dp.state_at(position))
            assert page.evaluate("document.getElementById('map0-slider').value") == str(
                sum(s < position for s in stops) - 1
            )
    assert events_between >= 4, stops  # most of these operations are between stops
    # the drawn bars follow: one bar per chunk in use (used) and per free chunk
    state = dp.state_at(steps[at + 8])
    drawn = page.evaluate("document.getElementById('map0').data.map(t => [t.name, t.x.length])")
    assert dict(drawn)["free"] == sum(not c.in_use for c in state.chunks())
    assert dict(drawn)["used"] == sum(c.in_use for c in state.chunks())
    for k in range(at + 7, at - 1, -1):  # ArrowLeft walks back the same operations
        page.keyboard.press("ArrowLeft")
        assert page.inner_text("#map0-label").startswith(f"event {steps[k]} · ")
    assert page.inner_text("#map0-label") == oom_label
    assert trace_bars(page, "map0", "failed request").count() == 1  # the ghost bar, at the OOM again
    assert trace_bars(page, "map0", "pinning").count() == 1
    page.keyboard.press("ArrowLeft")  # before the OOM: the mark, a stop
    assert page.inner_text("#map0-label").startswith("event 17 · ") and "mark before the failure" in page.inner_text(
        "#map0-label"
    )
    page.keyboard.press("ArrowLeft")
    assert page.eval_on_selector("#map0", PAGE_HEAP) in (None, heap_rows(dp.state_at(steps[at - 2])))
    assert errors == []
    page.close()


def stepper_frames(page, div: str, positions: list[int]) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """The maps the report's script draws from its embedded events at each log position."""
    script = (
        "([id, positions]) => {"
        " const s = gpuvizStepper(JSON.parse(document.getElementById(id + '-events').textContent));"
        " return positions.map(p => { const f = s.frame(p);"
        " return {data: f.data, layout: f.layout, label: f.label}; });"
        " }"
    )
    return list(page.evaluate(script, [div, positions]))


def growing_log() -> gpuviz.EventLog:
    """PyTorch's allocator with expandable segments: ranges mapped (joining segments), unmapped
    (splitting one in two) and mapped back."""
    from gpuviz.base.torch_rules import CachingRules
    from gpuviz.scenarios.torch_caching import TorchCachingAllocator

    alloc = TorchCachingAllocator(
        gpuviz.SimUpstream("64MiB"), rules=CachingRules.from_settings({"expandable_segments": True})
    )
    tags = [alloc.log.intern_string(f"t{i}") for i in range(3)]
    ptrs = [alloc.allocate(6 << 20, tag=tags[i % 3]) for i in range(10)]
    for p in ptrs[3:7]:
        alloc.free(p)
    alloc.empty_cache()
    alloc.allocate(20 << 20, tag=tags[0])
    alloc.allocate(512, tag=tags[1])
    return alloc.log


@pytest.mark.parametrize("case", ["tagged with call sites", "aggregated", "growing segments"])
def test_report_event_frames_are_the_python_maps(browser, tmp_path: Path, case: str) -> None:  # type: ignore[no-untyped-def]
    """The page's map at an event is the one Python draws there (trace_specs/map_layout, lean):
    every bar, hover datum and axis, for every operation of the embedded window."""
    if case == "growing segments":  # segment_map / segment_unmap applied by the page as replay does
        log = growing_log()
        options = ViewOptions(color_by="tag")
    elif case == "aggregated":  # more than FRAME_RECTANGLES / 2 chunks: bucketed bars
        log = gpuviz.EventLog()
        alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), growth=True, log=log)
        keep = [alloc.allocate((i % 5 + 1) * 3000, tag=f"t{i % 3}") for i in range(900)]
        for i, ptr in enumerate(keep):
            if i % 2:
                alloc.free(ptr)
        options = ViewOptions()
    else:
        log, _ = oom_log(later=30, stacks=True)
        options = ViewOptions(color_by="tag")
    p = profile(log, options)
    path = tmp_path / "frames.html"
    path.write_text(report_html(p, plotlyjs="inline"), encoding="utf-8")
    dp = p.devices["GPU:0"]
    stream = event_stream(p, "GPU:0", max_rectangles=FRAME_RECTANGLES)
    cols = decode_columns(stream["columns"])
    positions = cols["position"][cols["settled"] == 1].tolist()
    if case == "aggregated":
        positions = positions[-40:]  # a heap of ~900 chunks: the last 40 operations
    if case == "growing segments":  # every event, the states inside an operation too
        positions = cols["position"].tolist()
    page = browser.new_page()
    errors = collect_errors(page)
    offline(page)  # offline: the embedded partial bundle draws
    page.goto(path.as_uri())
    page.wait_for_selector("#map0 .main-svg")
    frames = stepper_frames(page, "map0", positions)
    assert errors == []
    page.close()
    for position, frame in zip(positions, frames, strict=True):
        spec, state = map_spec_and_state(p, "GPU:0", position, lean=True, max_rectangles=FRAME_RECTANGLES)
        expected = json.loads(to_script_json({"data": spec["data"], "layout": spec["layout"]}).replace("\\u003c", "<"))
        assert frame["data"] == expected["data"], position
        assert frame["layout"] == expected["layout"], position
        assert frame["label"] == _frame_label(p, dp, position, metric_text(state))
    names = {t["name"] for f in frames for t in f["data"] if t["x"]}
    if case == "growing segments":  # one segment, two after the unmap, two (small pool) at the end
        rows = [f["layout"]["yaxis"]["ticktext"] for f in frames]
        assert len(rows[0]) == 1 and [len(r) for r in rows].count(2) > 1
        assert {"segment_map", "segment_unmap"} <= set(stream["kinds"]) & {e.kind for e in log}
    elif case == "aggregated":
        assert names == {"free (aggregated)", "waste (aggregated)", "used (aggregated)"}
    else:
        assert {"later 29", "D"} <= names  # one trace per tag
        sites = {
            s.split()[-1] for f in frames for t in f["data"] for s in t["meta"]["strings"] if "test_browser.py:" in s
        }
        assert "(oom_log)" in sites  # call sites, from the recorded stacks


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


def test_a_two_device_report_survives_hovering_and_scrubbing(browser: Any, tmp_path: Path) -> None:
    """Every plot hovered and every scrubber moved, on a report of two devices: no page error."""
    import random

    log = gpuviz.EventLog()
    rng = random.Random(0)
    for device in ("GPU:0", "GPU:1"):
        alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), memory_limit="64MiB", log=log, device=device)
        live: list[int] = []
        for i in range(400):
            if live and rng.random() < 0.45:
                alloc.free(live.pop(rng.randrange(len(live))))
            else:
                with contextlib.suppress(gpuviz.OutOfMemoryError):
                    live.append(alloc.allocate(rng.randrange(1, 8) << 20, tag=f"t{i % 7}"))
    write_report(log, tmp_path / "two.html")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = collect_errors(page)
    offline(page)
    page.goto((tmp_path / "two.html").as_uri())
    page.wait_for_load_state("load")
    frame = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"
    plots = page.query_selector_all(".js-plotly-plot")
    sliders = page.query_selector_all("input[type=range]")
    assert len(plots) >= 6 and len(sliders) >= 2  # per device: the map, the timeline, the active view
    for _ in range(2):
        for plot in plots:
            plot.scroll_into_view_if_needed()
            box = plot.bounding_box()
            for fx in (0.2, 0.4, 0.6, 0.8):
                page.mouse.move(box["x"] + box["width"] * fx, box["y"] + box["height"] * 0.5)
                page.evaluate(frame)
        for slider in sliders:
            slider.scroll_into_view_if_needed()
            box = slider.bounding_box()
            for fx in (0.1, 0.5, 0.9, 0.3):
                page.mouse.click(box["x"] + box["width"] * fx, box["y"] + box["height"] / 2)
                slider.press("ArrowRight")
                page.evaluate(frame)
    assert errors == []
    page.close()
