"""The plotly.js a page loads: the vendored cartesian partial bundle, tied to plotly.py's
plotly.js version, and the full bundle for any page with a trace type it lacks or after plotly.py
moved to another plotly.js (said, never failed) (in Chromium: the partial bundle registers exactly
the types gpuviz counts on, and a fallback page draws).

Tests of the cartesian bundle in use pin plotly.py's plotly.js version to the vendored one
(``same_version``): they hold the day plotly.py ships another plotly.js, when pages fall back."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import plotly
import plotly.graph_objects as go
import pytest
from browsing import collect_errors, needs_chromium, offline
from runs import write_leaky_run

import gpuviz
from gpuviz import cluster_summary, load_run
from gpuviz.analysis.profile import profile
from gpuviz.views import plotlyjs as plotlyjs_module
from gpuviz.views.cluster import cluster_report_html
from gpuviz.views.plotlyjs import (
    CARTESIAN,
    CARTESIAN_TRACE_TYPES,
    FULL,
    PlotlyjsVersionWarning,
    bundle_for,
    bundle_status,
    plotlyjs_script,
    trace_types,
    vendored_version,
    version_mismatch,
)
from gpuviz.views.report import plot_div, report_document

VENDORED = Path(gpuviz.__file__).parent / "views" / "js" / "plotly-cartesian.min.js"
INSTALLED_PLOTLYJS = plotly.offline.get_plotlyjs_version()


@pytest.fixture
def same_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """plotly.py's plotly.js version as the vendored bundle's (the case gpuviz/views/js/refresh.sh keeps)."""
    monkeypatch.setattr(plotly.offline, "get_plotlyjs_version", vendored_version)


@pytest.fixture
def other_version(monkeypatch: pytest.MonkeyPatch) -> str:
    """plotly.py shipping another plotly.js than the vendored bundle (after an upgrade)."""
    monkeypatch.setattr(plotly.offline, "get_plotlyjs_version", lambda: "99.0.0")
    monkeypatch.setattr(plotly, "__version__", "99.1.0")
    monkeypatch.setattr(plotlyjs_module, "_warned", set())
    return "99.0.0"


def test_the_vendored_bundle_is_plotly_js_cartesian_with_its_license() -> None:
    version = vendored_version()
    header = VENDORED.read_text(encoding="utf-8")[:200]
    assert header.startswith(f"/**\n* plotly.js (cartesian - minified) v{version}\n* Copyright 2012-")
    assert "* Licensed under the MIT license\n*/" in header
    assert (VENDORED.parent / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    assert CARTESIAN.source() == VENDORED.read_text(encoding="utf-8")
    assert 1_000_000 < len(CARTESIAN.source()) < len(FULL.source()) / 2  # 1.5 MB against 4.8 MB


def test_the_same_version_loads_the_cartesian_bundle_and_says_so(same_version: None) -> None:
    assert version_mismatch() is None
    assert bundle_status() == (
        f"cartesian bundle v{vendored_version()} (plotly.py's plotly.js), the full one for other trace types"
    )


def test_a_trace_type_the_partial_bundle_lacks_gets_the_full_bundle(same_version: None) -> None:
    ours = [go.Figure([go.Scatter(y=[1, 2]), go.Bar(y=[1])]), go.Figure(go.Heatmap(z=[[1, 2]])), {"data": [{}]}]
    assert trace_types(ours) == {"scatter", "bar", "heatmap"}  # a trace without a type is a scatter
    assert bundle_for(trace_types(ours)) is CARTESIAN
    assert bundle_for(()) is CARTESIAN
    sankey = go.Figure(go.Sankey(node={"label": ["a", "b"]}, link={"source": [0], "target": [1], "value": [1]}))
    assert trace_types([*ours, sankey]) == {"scatter", "bar", "heatmap", "sankey"}
    assert bundle_for(trace_types([*ours, sankey])) is FULL
    assert bundle_for({"scattergl"}) is FULL and bundle_for({"bar", "scatter3d"}) is FULL
    assert plotlyjs_script("inline", FULL) == f"<script>{plotly.offline.get_plotlyjs()}</script>"
    assert plotlyjs_script("inline", CARTESIAN) == f"<script>{VENDORED.read_text(encoding='utf-8')}</script>"
    version = plotly.offline.get_plotlyjs_version()
    assert (
        plotlyjs_script("cdn", CARTESIAN)
        == f'<script src="https://cdn.plot.ly/plotly-cartesian-{version}.min.js"></script>'
    )
    assert plotlyjs_script("cdn", FULL) == f'<script src="https://cdn.plot.ly/plotly-{version}.min.js"></script>'
    assert plotlyjs_script("directory", CARTESIAN) == '<script src="plotly-cartesian.min.js"></script>'
    assert plotlyjs_script("directory", FULL) == '<script src="plotly.min.js"></script>'
    with pytest.raises(ValueError, match="plotlyjs must be 'inline', 'cdn' or 'directory', not 'local'"):
        plotlyjs_script("local", CARTESIAN)


def test_another_plotly_js_version_than_the_vendored_one_gets_the_full_bundle_said_once(
    other_version: str, runtime_log
) -> None:  # type: ignore[no-untyped-def]
    """After a plotly upgrade without a refreshed bundle, pages fall back to plotly.py's own copy:
    warned once per process, and ``gpuviz info`` says it; nothing fails."""
    said = (
        f"the vendored plotly.js cartesian bundle is v{vendored_version()} but plotly 99.1.0 ships plotly.js "
        f"v{other_version}: pages load plotly.py's full bundle (4.8 MB, not 1.5 MB) until "
        "gpuviz/views/js/refresh.sh fetches the same version"
    )
    assert version_mismatch() == said and bundle_status() == said
    with pytest.warns(PlotlyjsVersionWarning) as caught:
        assert bundle_for({"bar"}) is FULL
    assert [str(w.message) for w in caught] == [said]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: no second warning
        assert bundle_for({"scatter", "heatmap"}) is FULL
        gpuviz.asarray(np.ones(1000)) * 2
        document = report_document(profile(runtime_log))
    assert document.bundle is FULL and f"<script>{FULL.source()}</script>" in document.html
    assert CARTESIAN.source() not in document.html
    assert plotlyjs_script("cdn", FULL) == '<script src="https://cdn.plot.ly/plotly-99.0.0.min.js"></script>'


def test_gpuviz_info_names_the_bundle_pages_load(other_version: str, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuviz.frontends.cli import main

    assert main(["info"]) == 0
    assert f"plotly.js: {version_mismatch()}\n" in capsys.readouterr().out


def test_gpuviz_pages_load_the_partial_bundle(runtime_log, tmp_path: Path, same_version: None) -> None:  # type: ignore[no-untyped-def]
    gpuviz.asarray(np.ones(1000)) * 2
    document = report_document(profile(runtime_log))
    assert document.bundle is CARTESIAN and f"<script>{CARTESIAN.source()}</script>" in document.html
    assert plotly.offline.get_plotlyjs() not in document.html
    summary = cluster_summary(load_run(write_leaky_run(tmp_path / "run")))
    assert f"<script>{CARTESIAN.source()}</script>" in cluster_report_html(summary)
    assert CARTESIAN.cdn_url() in cluster_report_html(summary, plotlyjs="cdn")
    with pytest.raises(ValueError, match="plotlyjs must be"):
        cluster_report_html(summary, plotlyjs="nope")


def _page(path: Path, figure: go.Figure) -> None:
    """A page as gpuviz's builders write one: the bundle the figure's trace types need, then the figure."""
    script = plotlyjs_script("inline", bundle_for(trace_types([figure])))
    path.write_text(f"<!DOCTYPE html><html><head>{script}</head><body>{plot_div('f', figure)}</body></html>")


@needs_chromium
def test_in_chromium_the_partial_bundle_has_the_trace_types_and_a_fallback_page_draws(  # type: ignore[no-untyped-def]
    browser, tmp_path: Path, same_version: None
) -> None:
    page = browser.new_page()
    errors = collect_errors(page)
    offline(page)
    heatmap = go.Figure(go.Heatmap(z=[[1, 2], [3, 4]]))
    _page(tmp_path / "heatmap.html", heatmap)
    assert CARTESIAN.source() in (tmp_path / "heatmap.html").read_text()
    page.goto((tmp_path / "heatmap.html").as_uri())
    page.wait_for_selector("#f .main-svg")
    registered = page.evaluate("Object.keys(Plotly.PlotSchema.get().traces).sort()")
    assert registered == sorted(CARTESIAN_TRACE_TYPES)
    assert page.evaluate("Plotly.version") == vendored_version()
    assert page.locator("#f .hm").count() == 1  # the heatmap is drawn
    sankey = go.Figure(go.Sankey(node={"label": ["a", "b"]}, link={"source": [0], "target": [1], "value": [5]}))
    _page(tmp_path / "sankey.html", sankey)
    assert plotly.offline.get_plotlyjs() in (tmp_path / "sankey.html").read_text()
    page.goto((tmp_path / "sankey.html").as_uri())
    page.wait_for_selector("#f .sankey")
    assert page.locator("#f .sankey-node").count() == 2
    assert errors == []
    # what the fallback prevents: the partial bundle draws no sankey (an empty plot, no error)
    blank = tmp_path / "blank.html"
    blank.write_text(f"<html><head>{plotlyjs_script('inline', CARTESIAN)}</head><body>{plot_div('f', sankey)}</body>")
    page.goto(blank.as_uri())
    page.wait_for_selector("#f .main-svg")
    assert page.locator("#f .sankey-node").count() == 0
    page.close()


def test_every_result_figure_is_drawn_by_the_extensions_partial_bundle(runtime_log, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The JupyterLab extension loads plotly.js's cartesian bundle for every result (it has no
    fallback): a result's figures, a run's and a what-if comparison's have only its trace types."""
    from gpuviz.scenarios.whatif import whatif
    from gpuviz.views.cluster import cluster_result
    from gpuviz.views.comparison import comparison_result
    from gpuviz.views.result import result

    gpuviz.asarray(np.ones(1000)) * 2
    summary = cluster_summary(load_run(write_leaky_run(tmp_path / "run")))
    comparison = whatif(runtime_log, ["torch", "rmm-pool"], capacity="1GiB")
    results = [result(profile(runtime_log)), cluster_result(summary), comparison_result(comparison)]
    types = trace_types(f["figure"] for r in results for f in r["figures"])
    assert types == {"bar", "scatter", "heatmap"} and types <= CARTESIAN_TRACE_TYPES


def test_the_notebook_widgets_send_the_partial_bundle_and_refuse_other_trace_types(same_version: None) -> None:
    from gpuviz.widgets.plots import TRACE_TYPES, PlotlyLibrary, library_bundle, to_json

    assert library_bundle() is CARTESIAN and TRACE_TYPES <= CARTESIAN_TRACE_TYPES
    esm = PlotlyLibrary._esm  # made at import, with the plotly.js version installed
    sent = CARTESIAN if vendored_version() == INSTALLED_PLOTLYJS else FULL
    assert esm.startswith("if (!globalThis.Plotly) {\n") and sent.source() in esm
    assert len(esm) < len(sent.source()) + 200
    heatmap = go.Figure(go.Heatmap(z=[[1, 2]])).to_plotly_json()
    assert to_json(heatmap).startswith('{"data":[{"z":[[1,2]],"type":"heatmap"}]')
    with pytest.raises(ValueError, match=r"the notebook's plotly\.js draws bar, heatmap, scatter traces, not sankey"):
        to_json({"data": [{"type": "sankey"}, {"type": "bar"}], "layout": {}})
