"""Scrubbing a report whose maps are aggregated, in Chromium: at every stop of the slider the page
draws the map the per-HeapState path draws there (its bars unpacked from the typed columns)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from browsing import needs_chromium, open_offline
from test_frames import definition_frame, training_log

from gpuviz.analysis.profile import profile
from gpuviz.views import fragmentation
from gpuviz.views.fragmentation import metric_text
from gpuviz.views.report import FRAME_RECTANGLES, _frame_label, report_html, scrub_positions

pytestmark = needs_chromium
DRAWN = (
    "id => { const d = document.getElementById(id); return {label: document.getElementById(id + '-label').textContent,"
    " position: d.dataset.position, title: d.layout.title.text, ticks: d.layout.yaxis.ticktext,"
    " data: d.data.map(t => ({name: t.name, y: t.y, base: t.base, x: t.x, customdata: t.customdata,"
    " hovertemplate: t.hovertemplate || null}))}; }"
)


def test_scrubbing_draws_the_per_heapstate_map_at_every_stop(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = training_log()
    p = profile(log)
    dp = p.devices["GPU:0"]
    positions = scrub_positions(dp)
    path = tmp_path / "aggregated.html"
    path.write_text(report_html(p), encoding="utf-8")
    page, errors = open_offline(browser, path, viewport={"width": 1300, "height": 900})
    page.wait_for_selector("#map0 .main-svg")
    aggregated = 0
    for k in reversed(range(len(positions))):  # from the last stop back to the first, through the slider
        page.evaluate(
            "k => { const s = document.getElementById('map0-slider'); s.value = String(k);"
            " s.dispatchEvent(new Event('input')); }",
            k,
        )
        drawn: dict[str, Any] = page.evaluate(DRAWN, "map0")
        position = positions[k]
        state = dp.state_at(position)
        assert drawn["position"] == str(position)
        assert drawn["label"] == _frame_label(p, dp, position, metric_text(state))
        if len(state.chunks()) * 2 > FRAME_RECTANGLES:
            aggregated += 1
            title = f"GPU:0 after event {position}" + (" (peak)" if position == dp.peak.index else "")
            expected = definition_frame(state, title, FRAME_RECTANGLES)
            assert [t["name"] for t in drawn["data"]] == [f"{n} (aggregated)" for n in ("free", "waste", "used")]
        else:
            expected = fragmentation.map_spec(p, "GPU:0", position, lean=True, max_rectangles=FRAME_RECTANGLES)
        expected = json.loads(json.dumps(expected))
        assert drawn["title"] == expected["layout"]["title"]["text"]
        assert drawn["ticks"] == expected["layout"]["yaxis"]["ticktext"]
        for got, want in zip(drawn["data"], expected["data"], strict=True):
            assert got["name"] == want["name"]
            assert [got["y"], got["base"], got["x"]] == [want["y"], want["base"], want["x"]], (position, got["name"])
            assert got["customdata"] == want["customdata"]
            assert got["hovertemplate"] == want.get("hovertemplate")
    assert 0 < aggregated < len(positions)
    bars = page.locator("#map0 .trace.bars .point path").count()
    assert bars > 0  # the first stop's map is drawn
    assert errors == []
    page.close()
