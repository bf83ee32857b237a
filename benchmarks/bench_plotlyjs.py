"""Chromium's time to load and draw a report with plotly.js's cartesian partial bundle against the
same report with the full bundle (what reports embedded before), loads alternated.

    python benchmarks/bench_plotlyjs.py LOG.arrow [RUN_DIR ...] [--loads 4]

Each argument is a log (its report, as ``gpuviz report LOG``) or a run directory (the run's
report, as ``gpuviz report RUN_DIR``, without rank reports). The pages are written once and
differ only in the embedded bundle (for a run also "before": the full bundle and both heatmaps
drawn at load, as run reports were before the fragmentation heatmap was drawn lazily); each
load starts a fresh Chromium (nothing cached) and is timed from navigation to the load event
and to every figure drawn (every ``.gpuviz-plot`` with its ``.main-svg``; a lazy one, below
the fold, is scrolled to afterwards and timed from there: "lazy"). Targets: a 1M-event log's
report <= 2 s (issue 12), the 1024-rank report <= 3 s (issue 14). Prints the load average
with each round: this machine's 2 cores are shared.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from gpuviz.views.plotlyjs import CARTESIAN, FULL, plotlyjs_script

DRAWN = "Array.from(document.querySelectorAll('.gpuviz-plot')).every(d => d.querySelector('.main-svg'))"
SHOWN = (
    "Array.from(document.querySelectorAll('.gpuviz-plot:not(.gpuviz-lazy)')).every(d => d.querySelector('.main-svg'))"
)


def pages_html(source: Path) -> dict[str, str]:
    """The report of a log file or of a run directory, as the CLI writes it (plotly.js inline),
    with the cartesian bundle and with the full one (and for a run, "before")."""
    cartesian, full = plotlyjs_script("inline", CARTESIAN), plotlyjs_script("inline", FULL)
    if source.is_dir():
        from unittest import mock

        import gpuviz.views.cluster
        from gpuviz.dask import profile_run
        from gpuviz.views.report import plot_div

        summary = profile_run(source)
        page = gpuviz.views.cluster.cluster_report_html(summary, title=source.name)
        with mock.patch.object(gpuviz.views.cluster, "plot_div", lambda i, f, lazy=False: plot_div(i, f)):
            eager = gpuviz.views.cluster.cluster_report_html(summary, title=source.name)
        pages = {"cartesian": page, "full": page.replace(cartesian, full), "before": eager.replace(cartesian, full)}
    else:
        from gpuviz.analysis.profile import profile
        from gpuviz.log.files import load
        from gpuviz.views.report import report_html

        page = report_html(profile(load(source)), source=source.name)
        pages = {"cartesian": page, "full": page.replace(cartesian, full)}
    assert page.count(cartesian) == 1, "the report does not embed the cartesian bundle"
    return pages


def chromium_load(path: Path) -> tuple[float, float, float | None]:
    """Seconds from navigation start to the load event and to every figure drawn but the lazy
    ones; then seconds to draw the lazy ones once scrolled to (None: none)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        start = time.perf_counter()
        page.goto(path.as_uri(), wait_until="load", timeout=120_000)
        load = time.perf_counter() - start
        page.wait_for_function(SHOWN, timeout=120_000)
        drawn = time.perf_counter() - start
        lazy = None
        if page.locator(".gpuviz-lazy").count():
            start = time.perf_counter()
            page.evaluate("document.querySelectorAll('.gpuviz-lazy').forEach(d => d.scrollIntoView())")
            page.wait_for_function(DRAWN, timeout=120_000)
            lazy = time.perf_counter() - start
        browser.close()
    return load, drawn, lazy


def _text(t: tuple[float, float, float | None]) -> str:
    return f"{t[0]:.2f} / {t[1]:.2f}" + (f" / {t[2]:.2f}" if t[2] is not None else "") + " s"


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script too
    from benchmarks._results import Results, add_json_option

    parser = argparse.ArgumentParser()
    parser.add_argument("sources", type=Path, nargs="+", help="log files or run directories")
    parser.add_argument("--loads", type=int, default=4, help="loads of each page, alternated")
    add_json_option(parser)
    args = parser.parse_args()
    results = Results("plotlyjs", "Chromium loads a report: plotly.js's cartesian bundle vs the full one.", vars(args))
    for source in args.sources:
        start = time.perf_counter()
        documents = pages_html(source)
        print(f"{source}: reports built in {time.perf_counter() - start:.1f} s")
        with tempfile.TemporaryDirectory() as tmp:
            pages = {name: Path(tmp) / f"{name}.html" for name in documents}
            for name, document in documents.items():
                pages[name].write_text(document, encoding="utf-8")
            sizes = ", ".join(f"{name} {path.stat().st_size / 1e6:.2f} MB" for name, path in pages.items())
            print(f"  sizes: {sizes}")
            times: dict[str, list[tuple[float, float, float | None]]] = {name: [] for name in pages}
            for attempt in range(args.loads):
                order = list(pages)[attempt % len(pages) :] + list(pages)[: attempt % len(pages)]  # rotated
                for name in order:
                    times[name].append(chromium_load(pages[name]))
                pair = ", ".join(f"{name} {_text(times[name][-1])}" for name in pages)
                print(f"  #{attempt + 1} (load event / drawn [/ lazy]): {pair}; load average {os.getloadavg()[0]:.2f}")
            for name, values in times.items():
                loads, drawn = sorted(t[0] for t in values), sorted(t[1] for t in values)
                print(f"  {name}: load event {loads[0]:.2f}-{loads[-1]:.2f} s, drawn {drawn[0]:.2f}-{drawn[-1]:.2f} s "
                      f"(median {drawn[len(drawn) // 2]:.2f} s)")  # fmt: skip
                results.add(
                    f"{source.name}, {name} bundle: drawn (median of {len(drawn)})", drawn[len(drawn) // 2], "s"
                )
    results.write(args.json)


if __name__ == "__main__":
    main()
