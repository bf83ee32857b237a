"""Real traces, timed as a user meets them: for every trace in ``$GPUVIZ_TEST_TRACES`` that
gpuviz opens, and for synthetic PyTorch snapshots 10x the largest real one and of 1M entries
(``bench_import.repeated_snapshot`` of the cs336 full-step snapshot), in one process:

- ``read``: a plain read of the file's bytes (what any viewer pays first);
- ``load``: ``gpuviz.load`` of it (the EventLog);
- ``summary``: ``gpuviz summary``'s work on the loaded log (``views.text.summary_text``);
- ``report``: the report built from the loaded log (``profile`` + ``report_html``);
- ``report_bytes``: the report's size;
- ``dashboard``: the notebook dashboard (``widgets.dashboard.Dashboard``, its full draw) built from
  a fresh load of the file (so no result cached for the log is reused), and ``dashboard_bytes``:
  the JSON of the state it syncs to the browser (plotly.js, sent once per kernel, and the
  widget's own script and style, the same for every run, not counted);
- ``lab_result`` / ``lab_result_bytes``: what JupyterLab's renderer gets (``views.result.result_json``
  of ``profile``), built from a fresh load, and its size;
- ``chromium_load`` / ``chromium_draw``: Debian's Chromium (Playwright, offline) opening the
  report: until the load event, and until every plot the page draws at load has been drawn
  (plotly's ``_fullLayout`` set and its ``plotly_afterplot`` fired), from the navigation's start.

For the synthetic snapshots, what PyTorch's own memory viewer costs on the same file, beside:

- ``pytorch_load``: ``pickle.load`` of the file (what its page decodes too);
- ``pytorch_build``: ``torch.cuda._memory_viz.trace_plot`` of the loaded snapshot (its HTML: the
  pickle in base64 and a loader of ``MemoryViz.js``); ``pytorch_report_bytes``: that HTML's size
  (``MemoryViz.js`` itself comes from a CDN: not counted). Its draw time cannot be measured
  here (offline its page is blank); measured with its JS served locally it drew the 1M-entry
  snapshot in 20-23 s (docs/guide/large-runs.md).

Targets: summary <= 0.5 s and the report <= 1 s after the file is read; Chromium <= 2 s.
A warm-up load and report of a small trace comes first, so first-use imports are not counted.

    GPUVIZ_TEST_TRACES=../shared/data/traces python benchmarks/bench_real.py [--json PATH]
        [--entries 1000000] [--no-browser] [--no-synthetic] [--only SUBSTRING] [--work DIR]

Prints one JSON object ``{"benchmark": "real_traces", "description": ..., "results": [{"name",
"value", "unit"}]}`` on stdout, or writes it to ``--json PATH``; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_import import repeated_snapshot

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]  # fmt: skip
PATTERN = "pt_snapshot_cs336_ctx128_fullstep_2025.pickle"
_DRAWN = """() => new Promise((resolve) => {
  // every plot drawn at load (lazy ones wait for a scroll): plotly's _fullLayout set, no draw pending
  const plots = Array.from(document.querySelectorAll('.gpuviz-plot:not(.gpuviz-lazy)'));
  const check = () => {
    if (plots.every((p) => p._fullLayout && p.querySelector('.main-svg') && !(p._promises || []).length)) {
      resolve(performance.now());
    } else { setTimeout(check, 10); }
  };
  check();
})"""


def traces(folder: Path, only: str | None) -> Iterator[Path]:
    for path in sorted(folder.iterdir()):
        if path.suffix in (".md", ".txt") or (only and only not in path.name):
            continue
        yield path


def synthetic(folder: Path, work: Path, entries: int) -> Path:
    """A snapshot of ``entries`` entries repeating the cs336 full-step snapshot (made once in ``work``)."""
    path = work / f"synthetic_{entries}_{PATTERN}"
    if not path.exists():
        with open(path, "wb") as file:
            pickle.dump(repeated_snapshot(folder / PATTERN, entries), file, protocol=4)
    return path


def measure(path: Path, work: Path, page: Any) -> dict[str, float]:
    """One trace's numbers (seconds, bytes)."""
    import gpuviz
    from gpuviz.analysis.profile import profile
    from gpuviz.views.report import report_html
    from gpuviz.views.text import summary_text

    out: dict[str, float] = {}
    start = time.perf_counter()
    path.read_bytes()
    out["read"] = time.perf_counter() - start
    start = time.perf_counter()
    log = gpuviz.load(str(path), progress=False)
    out["load"] = time.perf_counter() - start
    out["events"] = len(log)
    start = time.perf_counter()
    summary_text(log)
    out["summary"] = time.perf_counter() - start
    start = time.perf_counter()
    document = report_html(profile(log), title=f"gpuviz report: {path.name}")
    out["report"] = time.perf_counter() - start
    data = document.encode()
    out["report_bytes"] = len(data)
    out.update(notebook_views(path))
    if path.name.startswith("synthetic_"):
        out.update(pytorch_viewer(path))
    if page is not None:
        report = work / (path.name + ".html")
        report.write_bytes(data)
        page.goto(report.as_uri(), wait_until="load", timeout=600_000)
        timing = page.evaluate("() => performance.getEntriesByType('navigation')[0].loadEventEnd")
        out["chromium_load"] = timing / 1e3
        out["chromium_draw"] = page.evaluate(_DRAWN) / 1e3
        page.goto("about:blank")
    return out


def notebook_views(path: Path) -> dict[str, float]:
    """The notebook dashboard and JupyterLab's result of the file at ``path``, each from its own
    load (the loads are not timed): build seconds and the bytes sent to the browser."""
    import gpuviz
    from gpuviz.analysis.profile import profile
    from gpuviz.views.result import result_json
    from gpuviz.widgets.dashboard import Dashboard

    out: dict[str, float] = {}
    log = gpuviz.load(str(path), progress=False)
    start = time.perf_counter()
    dashboard = Dashboard(log)
    out["dashboard"] = time.perf_counter() - start
    state = {k: v for k, v in dashboard.get_state().items() if k not in ("library", "_esm", "_css")}
    out["dashboard_bytes"] = len(json.dumps(state, default=str).encode())
    dashboard.close()
    log = gpuviz.load(str(path), progress=False)
    start = time.perf_counter()
    payload = result_json(profile(log))
    out["lab_result"] = time.perf_counter() - start
    out["lab_result_bytes"] = len(payload.encode())
    return out


def pytorch_viewer(path: Path) -> dict[str, float]:
    """PyTorch's memory viewer on the snapshot at ``path``: unpickling, building its page, its size."""
    from torch.cuda import _memory_viz

    out: dict[str, float] = {}
    start = time.perf_counter()
    with open(path, "rb") as file:
        snapshot = pickle.load(file)
    out["pytorch_load"] = time.perf_counter() - start
    start = time.perf_counter()
    page = _memory_viz.trace_plot(snapshot)
    out["pytorch_build"] = time.perf_counter() - start
    out["pytorch_report_bytes"] = len(page.encode())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the JSON object here instead of stdout")
    parser.add_argument("--entries", type=int, default=1_000_000, help="the large synthetic snapshot's entries")
    parser.add_argument("--no-browser", action="store_true", help="skip Chromium")
    parser.add_argument("--only", help="only traces whose file name contains this")
    parser.add_argument("--no-synthetic", action="store_true", help="only the real traces")
    parser.add_argument("--work", type=Path, help="where synthetic snapshots and reports go (default: a temp dir)")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    folder = os.environ.get("GPUVIZ_TEST_TRACES")
    if not folder or not Path(folder).is_dir():
        parser.error("GPUVIZ_TEST_TRACES must name the folder of real traces")
    source = Path(folder)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpuviz-bench-real-"))
    work.mkdir(parents=True, exist_ok=True)
    import gpuviz
    from gpuviz.analysis.profile import profile
    from gpuviz.base.errors import GpuvizError
    from gpuviz.views.report import report_html

    report_html(profile(gpuviz.load(str(source / "pt_snapshot_assignment2_2026b.pickle"), progress=False)))  # warm-up
    notebook_views(source / "pt_snapshot_assignment2_2026b.pickle")
    if not args.no_synthetic:
        import torch.cuda._memory_viz  # noqa: F401  (its import is not the viewer's cost)
    with open(source / PATTERN, "rb") as file:
        largest = len(pickle.load(file)["device_traces"][0])
    inputs = list(traces(source, args.only))
    if not args.no_synthetic:
        for entries in (10 * largest, args.entries):
            if not args.only or args.only in f"synthetic_{entries}_{PATTERN}":
                inputs.append(synthetic(source, work, entries))
    results: list[dict[str, Any]] = []
    units = {"read": "s", "load": "s", "summary": "s", "report": "s", "report_bytes": "bytes",
             "chromium_load": "s", "chromium_draw": "s", "events": "events", "pytorch_load": "s",
             "pytorch_build": "s", "pytorch_report_bytes": "bytes", "dashboard": "s", "dashboard_bytes": "bytes",
             "lab_result": "s", "lab_result_bytes": "bytes"}  # fmt: skip
    browser = playwright = None
    if not args.no_browser:
        from playwright.sync_api import sync_playwright

        playwright = sync_playwright().start()
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
    try:
        for path in inputs:
            page = browser.new_page() if browser is not None else None
            if page is not None:
                page.route("http*://**", lambda route: route.abort())
            try:
                numbers = measure(path, work, page)
            except GpuvizError as error:
                print(f"{path.name}: not opened ({str(error)[:120]}...)", file=sys.stderr)
                continue
            finally:
                if page is not None:
                    page.close()
            print(f"{path.name}: " + ", ".join(f"{k} {v:.3f}" for k, v in numbers.items()), file=sys.stderr)
            results += [{"name": f"{path.name}/{key}", "value": value, "unit": units[key]}
                        for key, value in numbers.items()]  # fmt: skip
    finally:
        if browser is not None and playwright is not None:
            browser.close()
            playwright.stop()
    text = json.dumps({
        "benchmark": "real_traces",
        "description": "per trace: plain read, gpuviz.load, summary, report build (after the load), report size, "
                       "notebook dashboard and JupyterLab result (each from its own load) built and their bytes, "
                       "Chromium load event and every plot drawn (s from navigation start); for the synthetic "
                       "snapshots also PyTorch's viewer: unpickling, trace_plot's page and its size (its draw "
                       "needs MemoryViz.js from a CDN: not measured offline); one process, warmed up; "
                       f"1-min load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end",
        "results": results,
    }, indent=1)  # fmt: skip
    if args.json:
        args.json.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
