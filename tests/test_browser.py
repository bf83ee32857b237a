"""A real browser: Debian's Chromium driven by Playwright (PyPI) opens a generated report offline:
its map, the OOM's ghost bar and pinning, the scrubber and the event-by-event frames.
(JupyterLab in the browser: test_lab_browser.py.)"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from browsing import collect_errors, drag_zoom, needs_chromium, offline, open_offline

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
    page, errors = open_offline(browser, path, viewport={"width": 1300, "height": 900})
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
    drag_zoom(page, "#map0")  # a tenth to a half
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
    page, errors = open_offline(browser, path, viewport={"width": 1300, "height": 900})
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
    page, errors = open_offline(browser, tmp_path / "two.html", viewport={"width": 1400, "height": 1000})
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
