"""The JupyterLab extension and the result format it renders: both sides of the wire
format agree, the extension is installed, and results are written as documented.
(Rendering in a real JupyterLab is in test_lab_browser.py.)"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import gpuviz
from gpuviz.analysis.profile import profile
from gpuviz.frontends.cli import main
from gpuviz.log.schema import DTYPES, Kind
from gpuviz.views import result as result_module
from gpuviz.views.plotlyjs import vendored_version
from gpuviz.views.result import FILE_EXTENSION, FORMAT, FORMAT_VERSION, MIME_TYPE, result

EXTENSION = Path(__file__).resolve().parent.parent / "labextension"


def ts_constant(name: str) -> str | int:
    source = (EXTENSION / "src" / "format.ts").read_text()
    match = re.search(rf"export const {name} = ('([^']*)'|(\d+));", source)
    assert match is not None, f"format.ts declares no {name}"
    return match.group(2) if match.group(2) is not None else int(match.group(3))


def test_both_sides_declare_the_same_wire_format() -> None:
    from gpuviz.frontends.labserver import ROUTE

    assert ts_constant("MIME_TYPE") == MIME_TYPE == "application/vnd.gpuviz.v1+json"
    route = re.search(r"export const RESULT_ROUTE = \[([^\]]*)\];", (EXTENSION / "src" / "format.ts").read_text())
    assert route is not None and tuple(re.findall(r"'([^']*)'", route.group(1))) == ROUTE
    assert ts_constant("FORMAT") == FORMAT
    assert ts_constant("FORMAT_VERSION") == FORMAT_VERSION
    assert ts_constant("FILE_EXTENSION") == FILE_EXTENSION
    interface = (EXTENSION / "src" / "format.ts").read_text()
    for key in ("format", "version", "title", "summary", "figures", "tables"):
        assert re.search(rf"^\s+{key}: ", interface, re.MULTILINE), key
    for key in ("name", "title", "figure", "columns", "rows", "headers?", "kinds?", "total?", "highlight?"):
        assert f"{key}: " in interface, key


def test_extension_draws_figures_with_the_plotly_js_of_the_python_side() -> None:
    package = json.loads((EXTENSION / "package.json").read_text())
    # plotly.js's cartesian partial bundle (scatter, bar, heatmap: every trace a result has), the version
    # vendored for reports (gpuviz/views/js/refresh.sh keeps both at plotly.py's plotly.js)
    assert package["dependencies"]["plotly.js-cartesian-dist-min"] == vendored_version()
    assert "plotly.js-dist-min" not in package["dependencies"]
    assert (package["jupyterlab"]["mimeExtension"], package["jupyterlab"]["extension"]) == (
        "lib/index.js",
        "lib/plugin.js",
    )


@pytest.mark.slow  # runs jupyter labextension list
def test_extension_is_installed_and_enabled() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"], capture_output=True, text=True, check=True
    )
    listing = proc.stdout + proc.stderr  # jupyter prints the list on stderr
    assert re.search(r"gpuviz-labextension v0\.1\.0 \S*enabled\S* \S*OK", listing), (
        "the JupyterLab extension is not installed: it comes with gpuviz (pip install -e ., as the README says)"
    )


def small_log() -> gpuviz.EventLog:
    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), memory_limit="8MiB", log=log)
    keep = alloc.allocate(3 << 20, tag="weights")
    alloc.free(alloc.allocate(1 << 20, tag="grads"))
    with pytest.raises(gpuviz.OutOfMemoryError):
        alloc.allocate(6 << 20)
    assert keep
    return log


def test_result_of_a_run() -> None:
    data = result(profile(small_log()), title="a run")
    assert json.loads(json.dumps(data)) == data  # plain JSON values only
    assert (data["format"], data["version"], data["title"]) == ("gpuviz-result", 1, "a run")
    # 3 MiB takes a whole 4 MiB segment (no split: 1 MiB remainder); 1 MiB splits a second
    # 4 MiB segment and is freed; 6 MiB cannot fit under the 8 MiB limit
    assert data["summary"] == [
        "8 events · devices: GPU:0",
        "GPU:0 at the out-of-memory error (6.0 MiB requested; 4.0 MiB in use, 8.0 MiB reserved): "
        "4.0 MiB of unknown use; 4.0 MiB reserved but unused in 2 segments",
        "hint: GPU:0: out of memory at event 7 requesting 6.0 MiB - not enough free memory under the limit.",
        "GPU:0: peak in use 5.0 MiB at event 4, peak pool 8.0 MiB, in use at end 4.0 MiB, "
        "fragmentation at peak 0.0%, internal waste at peak 1.0 MiB",
        "GPU:0: out of memory requesting 6.0 MiB:",
        "free 4.0 MiB in 1 hole, largest 4.0 MiB; no segment can hold 6.0 MiB, whatever is released",
        "out of memory on GPU:0: 6.0 MiB requested, 4.0 MiB free, largest free chunk 4.0 MiB",
    ]
    assert [(f["name"], f["title"]) for f in data["figures"]] == [
        ("map:GPU:0", "GPU:0: heap at the out-of-memory error"),
        ("timeline:GPU:0", "GPU:0: timeline"),
    ]
    for figure in data["figures"]:
        assert set(figure["figure"]) == {"data", "layout"} and figure["figure"]["data"]
    # the map opens at the OOM: the failed 6 MiB request as a ghost bar at the largest (4 MiB) hole
    ghost = next(t for t in data["figures"][0]["figure"]["data"] if t["name"] == "failed request")
    assert (ghost["base"], ghost["x"], ghost["y"]) == ([0], [6 << 20], ["0x10000400000"])
    # no ops, no stacks: only what was live at the OOM, raw values with kinds, headers and totals
    live, ooms = data["tables"]
    assert (ooms["name"], ooms["title"], ooms["headers"]) == (
        "ooms",
        "Out-of-memory events (1)",
        ["event", "device", "requested", "free", "largest free chunk"],
    )
    assert ooms["kinds"] == ["count", "text", "bytes", "bytes", "bytes"] and ooms["rows"][0][1:3] == ["GPU:0", 6 << 20]
    assert live["name"] == "live:GPU:0" and live["title"].startswith("GPU:0: live at the out-of-memory error (1 ")
    assert live["headers"] == ["tag", "shape", "dtype", "requested", "chunk", "call site", "age", "address"]
    assert live["kinds"] == ["text", "text", "text", "bytes", "bytes", "text", "ns", "address"]
    assert live["rows"][0][:5] == ["weights", None, None, 3 << 20, 4 << 20] and live["rows"][0][7] == 1 << 40
    assert live["total"] == ["total", None, None, 3 << 20, 4 << 20, None, None, None]


def test_alike_live_allocations_are_one_row_of_who_held_the_memory() -> None:
    """Five 1 MiB activations and one 3 MiB weight live at the peak: the first live table groups
    the alike ones (count x size, what, bytes), the one-by-one list follows it."""
    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), memory_limit="64MiB", log=log)
    alloc.allocate(3 << 20, tag="weights")
    for _ in range(5):
        alloc.allocate(1 << 20, tag="activations")
    tables = {t["name"]: t for t in result(profile(log))["tables"]}
    groups, live = tables["live-groups:GPU:0"], tables["live:GPU:0"]
    assert list(tables).index("live-groups:GPU:0") < list(tables).index("live:GPU:0")
    assert groups["title"] == "GPU:0: who held the memory at the peak (6 allocations in 2 groups, most bytes first)"
    assert groups["headers"] == ["count", "each", "what", "call site", "bytes", "share"]
    assert groups["kinds"] == ["count", "bytes", "text", "text", "bytes", "share"]
    assert [row[:3] + row[4:5] for row in groups["rows"]] == [
        [5, 1 << 20, "activations", 5 << 20],
        [1, 4 << 20, "weights", 4 << 20],  # 3 MiB in a whole 4 MiB chunk (the 1 MiB rest is not split off)
    ]
    assert groups["total"] == [6, None, None, None, 9 << 20, None]
    assert len(live["rows"]) == 6


def test_report_to_a_gpuviz_json_name_writes_the_result(tmp_path: Path) -> None:
    log = small_log()
    log.save(tmp_path / "run.arrow")
    assert main(["report", str(tmp_path / "run.arrow"), "-o", str(tmp_path / "run.gpuviz.json")]) == 0
    written = json.loads((tmp_path / "run.gpuviz.json").read_text())
    assert written == result(profile(gpuviz.load(tmp_path / "run.arrow")), title="gpuviz report: run.arrow")


def test_an_event_log_displays_as_a_result_with_an_html_fallback() -> None:
    bundle = small_log()._repr_mimebundle_()
    assert set(bundle) == {MIME_TYPE, "text/html", "text/plain"}
    assert bundle[MIME_TYPE]["format"] == FORMAT
    assert "<script" not in bundle["text/html"]
    assert result_module.__doc__ and "format.ts" in result_module.__doc__


def get(url: str, timeout: float = 60) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def test_server_extension_answers_with_the_result_of_a_saved_log(lab_server) -> None:  # type: ignore[no-untyped-def]
    base, token, root = lab_server
    (root / "runs").mkdir()
    small_log().save(root / "runs" / "run.arrow")
    (root / "notes.arrow").write_bytes(b"not an event log")
    route = f"{base}/gpuviz/result?token={token}&path="

    status, body = get(route + "runs/run.arrow")
    assert status == 200
    assert body == result(profile(gpuviz.load(root / "runs" / "run.arrow")), title="runs/run.arrow")

    status, body = get(route + "notes.arrow")
    assert status == 400 and "not a gpuviz event log" in str(body["message"])
    status, _ = get(route + "runs/missing.arrow")
    assert status == 404
    status, _ = get(route + "../../etc/passwd")
    assert status in (403, 404)  # nothing outside the server's root
    status, _ = get(f"{base}/gpuviz/result?path=runs/run.arrow")  # no token
    assert status == 403


def test_traces_of_other_tools_open_as_results_too(lab_server) -> None:  # type: ignore[no-untyped-def]
    """A TensorFlow XPlane in the file browser: the route tells the format by its content."""
    base, token, root = lab_server
    source = (EXTENSION / "src" / "format.ts").read_text()
    declared = re.search(r"export const TRACE_EXTENSIONS = \[([^\]]*)\];", source)
    assert declared is not None and {".xplane.pb", ".pickle"} <= set(re.findall(r"'([^']*)'", declared.group(1)))
    fixture = Path(__file__).resolve().parent / "fixtures" / "tf_bfc" / "oom.xplane.pb.gz"
    (root / "host.xplane.pb").write_bytes(gzip.decompress(fixture.read_bytes()))
    status, body = get(f"{base}/gpuviz/result?token={token}&path=host.xplane.pb")
    assert status == 200
    assert body == result(profile(gpuviz.load(root / "host.xplane.pb")), title="host.xplane.pb")


def test_server_extension_refuses_symlinks_out_of_the_root_and_names_the_requested_path(  # type: ignore[no-untyped-def]
    lab_server, tmp_path_factory
) -> None:
    base, token, root = lab_server
    outside = tmp_path_factory.mktemp("outside") / "secret.arrow"
    small_log().save(outside)
    (root / "link_out.arrow").symlink_to(outside)
    (root / "runs").mkdir()
    small_log().save(root / "runs" / "run.arrow")
    (root / "link_in.arrow").symlink_to(root / "runs" / "run.arrow")
    data = (root / "runs" / "run.arrow").read_bytes()
    (root / "runs" / "bad.arrow").write_bytes(data[:200] + bytes([data[200] ^ 0x40]) + data[201:])
    route = f"{base}/gpuviz/result?token={token}&path="

    status, body = get(route + "link_out.arrow")
    assert status == 404 and str(outside) not in json.dumps(body)
    status, body = get(route + "link_in.arrow")  # a link that stays inside the root is a file like any other
    assert status == 200 and body["title"] == "link_in.arrow"
    status, body = get(route + "runs/bad.arrow")  # the header's checksum no longer matches
    assert status == 400
    assert body["message"] == "runs/bad.arrow: the header is damaged (it does not match its checksum)"
    cut = len(data) // 2
    (root / "runs" / "cut.arrow").write_bytes(data[:cut])
    status, body = get(route + "runs/cut.arrow")  # a cut log is no error: its readable prefix is analysed
    assert status == 200 and body["summary"][1] == "0 events · devices: GPU:0"
    assert str(body["summary"][0]).startswith("warning: the file is truncated (cut short before its end)")


STALL_PROBE = textwrap.dedent(
    """
    # A server extension for the test: a 5 ms periodic callback on the server's event loop.
    # Between two ticks it measures how late the second came (wall clock), less the time the
    # loop's thread waited for a CPU (its run-queue wait in /proc/thread-self/schedstat): what
    # is left is a stall of the loop itself (code running on it, or waiting for the GIL), not
    # the machine being busy with other processes. A route reports the worst and resets.
    import json, time
    import tornado
    from jupyter_server.base.handlers import APIHandler
    from jupyter_server.utils import url_path_join
    from tornado.ioloop import PeriodicCallback

    PERIOD_MS = 5

    def schedstat():
        with open("/proc/thread-self/schedstat") as f:
            on_cpu, queued, _ = map(int, f.read().split())
            return on_cpu, queued

    STATE = {"stall_ms": 0.0, "stall_on_cpu_ms": 0.0, "late_ms": 0.0, "ticks": 0, "last": time.perf_counter()}

    def tick():
        now, (on_cpu, queued) = time.perf_counter(), schedstat()
        late = (now - STATE["last"]) * 1000 - PERIOD_MS
        stall = late - (queued - STATE["queued"]) / 1e6
        STATE["late_ms"] = max(STATE["late_ms"], late)
        if stall > STATE["stall_ms"]:  # and how much of it the loop's thread spent on a CPU
            STATE["stall_ms"], STATE["stall_on_cpu_ms"] = stall, (on_cpu - STATE["on_cpu"]) / 1e6
        STATE["ticks"] += 1
        STATE["last"], STATE["on_cpu"], STATE["queued"] = now, on_cpu, queued

    class Probe(APIHandler):
        @tornado.web.authenticated
        def get(self):
            self.finish(json.dumps({k: STATE[k] for k in ("stall_ms", "stall_on_cpu_ms", "late_ms", "ticks")}))
            STATE.update(stall_ms=0.0, stall_on_cpu_ms=0.0, late_ms=0.0, ticks=0)

    def _jupyter_server_extension_points():
        return [{"module": "stall_probe"}]

    def _load_jupyter_server_extension(app):
        STATE["on_cpu"], STATE["queued"] = schedstat()
        PeriodicCallback(tick, PERIOD_MS).start()
        route = url_path_join(app.web_app.settings["base_url"], "stall-probe")
        app.web_app.add_handlers(".*$", [(route, Probe)])
    """
)
PROBE_DIR = Path(tempfile.mkdtemp(prefix="gpuviz-stall-probe-"))
(PROBE_DIR / "stall_probe.py").write_text(STALL_PROBE)


def synthetic_log(pairs: int) -> gpuviz.EventLog:
    """A large valid log, built without an allocator: a 1 GiB segment, then ``pairs`` times a
    split, alloc, free and merge of a chunk at its base (sizes 256 B to 250 KiB)."""
    base, segment = 1 << 40, 1 << 30
    n = 1 + 4 * pairs
    sizes = (np.arange(pairs, dtype=np.int64) % 1000 + 1) * 256
    zeros, whole = np.zeros(pairs, np.int64), np.full(pairs, segment)
    columns = {name: np.zeros(n, dtype=dtype) for name, dtype in DTYPES.items()}
    columns["seq"][:] = np.arange(n)
    columns["time_ns"][:] = np.arange(n) * 1000
    columns["kind"][0] = Kind.SEGMENT_ALLOC
    columns["kind"][1:] = np.tile(np.array([Kind.SPLIT, Kind.ALLOC, Kind.FREE, Kind.MERGE], np.uint8), pairs)
    columns["address"][:] = columns["segment"][:] = base
    columns["size"][0], columns["size"][1:] = segment, np.stack([sizes, sizes, sizes, whole], axis=1).ravel()
    columns["requested"][1:] = np.stack([zeros, sizes, sizes, zeros], axis=1).ravel()
    left = segment - sizes
    columns["largest_free"][0], columns["largest_free"][1:] = (
        segment,
        np.stack([left, left, left, whole], axis=1).ravel(),
    )
    columns["peer"][:] = columns["tag"][:] = columns["stack"][:] = -1
    log = gpuviz.EventLog()
    log.add_device("GPU:0", memory_limit=segment, growth=False)
    log._set_columns(columns)
    return log


@pytest.mark.parametrize(
    "lab_server",
    [{"args": ["--ServerApp.jpserver_extensions=stall_probe=True"], "env": {"PYTHONPATH": str(PROBE_DIR)}}],
    indirect=True,
)
def test_the_event_loop_stays_free_while_a_large_log_is_analysed(lab_server) -> None:  # type: ignore[no-untyped-def]
    """A 164 MB log (2M events); ``GPUVIZ_STALL_TEST_PAIRS=3000000`` (by hand) makes it 1 GB."""
    base, token, root = lab_server
    pairs = int(os.environ.get("GPUVIZ_STALL_TEST_PAIRS", 500_000))
    log = synthetic_log(pairs)
    log.save(root / "large.arrow")
    del log
    size = (root / "large.arrow").stat().st_size
    assert size > 150 << 20
    probe = f"{base}/stall-probe?token={token}"
    for _ in range(2):  # the first request also starts the worker process
        get(probe)  # reset
        start = time.perf_counter()
        status, body = get(f"{base}/gpuviz/result?token={token}&path=large.arrow", timeout=600)
        elapsed_ms = (time.perf_counter() - start) * 1000
        assert status == 200 and body["summary"][0] == f"{1 + 4 * pairs} events · devices: GPU:0"
        _, stalls = get(probe)
        # the loop's callback ran while the log was analysed (blocked, it would have run once or
        # twice: tornado skips the ticks it missed). How long its longest stall was depends on
        # the machine's load: printed here, not bounded.
        print(f"{size / 2**20:.0f} MiB log, {elapsed_ms:.0f} ms: {stalls}")
        assert stalls["ticks"] >= 10, (stalls, elapsed_ms)
