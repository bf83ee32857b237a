"""The live map of a big heap, drawn by plotly.js in Debian's Chromium (Playwright), offline:
the bucketed bars the dashboard sends while a busy cell runs render, and hover on a bucket
says what is in it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import plotly
import pytest
from browsing import collect_errors, offline

import gpuviz
from gpuviz.analysis.live import LiveFollower
from gpuviz.views.livemap import live_map

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.slow,  # starts Chromium
]


def test_the_bucketed_live_map_renders_and_hover_names_a_bucket(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), growth=True, log=log)
    kept = [alloc.allocate(1000 + (i % 7) * 300, tag="k") for i in range(3000)]
    for address in kept[::3]:
        alloc.free(address)
    follower = LiveFollower(log)
    follower.update()
    heap = follower.arrays("GPU:0")
    figure = live_map(heap, title="GPU:0 (live)")
    bars = sum(len(trace["x"]) for trace in figure["data"])
    library = (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_text(encoding="utf-8")
    page_file = tmp_path / "map.html"
    page_file.write_text(
        f"<html><body><div id='map' style='width:1200px'></div><script>{library}</script><script>"
        f"const figure = {json.dumps(figure)}; Plotly.newPlot('map', figure.data, figure.layout);</script>"
        "</body></html>",
        encoding="utf-8",
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        errors = collect_errors(page, console=False)
        offline(page)
        page.goto(page_file.as_uri())
        page.wait_for_selector("#map .main-svg")
        assert page.locator("#map .bars path").count() == bars  # every bucket's bars drawn
        assert "chunks in use, drawn in buckets" in (page.text_content("#map .gtitle") or "")
        used = page.locator("#map .trace.bars").nth(2).locator("path").first  # the first used bucket
        used.hover(force=True)
        page.wait_for_selector("#map .hovertext")
        hover = page.locator("#map .hovertext text").first.text_content() or ""
        first = figure["data"][2]["hovertext"][0]
        assert hover.startswith(first.split("<br>")[0])  # "N chunks from 0x…"
        assert errors == []
        browser.close()
    assert len(kept) == 3000 and bars <= 600
