"""The JupyterLab extension and the result format it renders: both sides of the wire
format agree, the extension is installed, and results are written as documented.
(Rendering in a real JupyterLab is in test_browser.py.)"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import plotly.offline
import pytest

import gpuviz
from gpuviz.analysis.profile import profile
from gpuviz.frontends.cli import main
from gpuviz.views import result as result_module
from gpuviz.views.result import FILE_EXTENSION, FORMAT, FORMAT_VERSION, MIME_TYPE, result

EXTENSION = Path(__file__).resolve().parent.parent / "labextension"


def ts_constant(name: str) -> str | int:
    source = (EXTENSION / "src" / "format.ts").read_text()
    match = re.search(rf"export const {name} = ('([^']*)'|(\d+));", source)
    assert match is not None, f"format.ts declares no {name}"
    return match.group(2) if match.group(2) is not None else int(match.group(3))


def test_both_sides_declare_the_same_wire_format() -> None:
    from gpuviz_labextension.handlers import ROUTE

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
    assert package["dependencies"]["plotly.js-dist-min"] == plotly.offline.get_plotlyjs_version()
    assert (package["jupyterlab"]["mimeExtension"], package["jupyterlab"]["extension"]) == (
        "lib/index.js",
        "lib/plugin.js",
    )


def test_extension_is_installed_and_enabled() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"], capture_output=True, text=True, check=True
    )
    listing = proc.stdout + proc.stderr  # jupyter prints the list on stderr
    assert re.search(r"gpuviz-labextension v0\.1\.0 \S*enabled\S* \S*OK", listing), (
        "the JupyterLab extension is not installed: pip install ./labextension (the README's test command does)"
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
    (live,) = data["tables"]
    assert live["name"] == "live:GPU:0" and live["title"].startswith("GPU:0: live at the out-of-memory error (1 ")
    assert live["headers"] == ["tag", "shape", "dtype", "requested", "chunk", "call site", "age", "address"]
    assert live["kinds"] == ["text", "text", "text", "bytes", "bytes", "text", "ns", "address"]
    assert live["rows"][0][:5] == ["weights", None, None, 3 << 20, 4 << 20] and live["rows"][0][7] == 1 << 40
    assert live["total"] == ["total", None, None, 3 << 20, 4 << 20, None, None, None]


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


def get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=60) as reply:
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
    assert declared is not None and ".xplane.pb" in re.findall(r"'([^']*)'", declared.group(1))
    fixture = Path(__file__).resolve().parent / "fixtures" / "tf_bfc" / "oom.xplane.pb.gz"
    (root / "host.xplane.pb").write_bytes(gzip.decompress(fixture.read_bytes()))
    status, body = get(f"{base}/gpuviz/result?token={token}&path=host.xplane.pb")
    assert status == 200
    assert body == result(profile(gpuviz.load(root / "host.xplane.pb")), title="host.xplane.pb")
