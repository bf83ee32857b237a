"""The JupyterLab route on hostile input, against a real Jupyter server: it reads nothing outside
its root (manifests and their globs included), opens no special file, and one bad file holds
up no other request (each analysis in its own process, under a time and a memory limit)."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import gpuviz

pytestmark = pytest.mark.slow


def get(url: str, timeout: float = 300) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def small_log() -> gpuviz.EventLog:
    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), memory_limit="8MiB", log=log)
    alloc.free(alloc.allocate(1 << 20, tag="grads"))
    assert alloc.allocate(3 << 20, tag="weights")
    return log


def test_manifests_cannot_reach_outside_the_root(lab_server, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    base, token, root = lab_server
    outside = tmp_path_factory.mktemp("outside")
    small_log().save(outside / "secret.arrow")
    (root / "jobs").mkdir()
    small_log().save(root / "jobs" / "inside.arrow")
    manifests = {
        "up.gpuviz-run": {"logs": f"../../{outside.name}/*.arrow"},
        "abs.gpuviz-run": {"logs": str(outside / "*.arrow")},
        "passwd.gpuviz-run": {"logs": "/etc/pass*"},
        "environ.gpuviz-run": {"logs": "/proc/self/environ"},
        "dir.gpuviz-run": {"logs": str(outside)},
    }
    for name, manifest in manifests.items():
        (root / "jobs" / name).write_text(json.dumps(manifest))
    (root / "jobs" / "inlink").symlink_to(outside)
    (root / "jobs" / "link.gpuviz-run").write_text(json.dumps({"logs": "inlink/*.arrow"}))
    route = f"{base}/gpuviz/result?token={token}&path="
    for name in [*manifests, "link.gpuviz-run"]:
        status, body = get(route + "jobs/" + name)
        text = json.dumps(body)
        assert status == 404, (name, body)
        assert body["message"] == f"jobs/{name}: the run's logs must lie inside the server's root"
        assert str(outside) not in text and "root:" not in text and "/etc/passwd" not in text
    (root / "jobs" / "ok.gpuviz-run").write_text(json.dumps({"logs": "*.arrow"}))
    status, body = get(route + "jobs/ok.gpuviz-run")
    assert status == 200 and body["tables"][0]["links"] == ["jobs/inside.arrow"]  # type: ignore[index]


def test_link_loops_and_special_files_are_refused_without_opening_them(lab_server) -> None:  # type: ignore[no-untyped-def]
    base, token, root = lab_server
    (root / "a.arrow").symlink_to(root / "b.arrow")
    (root / "b.arrow").symlink_to(root / "a.arrow")
    os.mkfifo(root / "x.arrow")  # opening it for reading would block until a writer comes
    small_log().save(root / "run.arrow")
    route = f"{base}/gpuviz/result?token={token}&path="
    status, body = get(route + "a.arrow")
    assert status == 404 and body["message"] == "file does not exist: a.arrow"
    status, body = get(route + "x.arrow")
    assert status == 400 and body["message"] == "x.arrow: a FIFO, not a file gpuviz opens"
    status, body = get(route + "run.arrow")
    assert status == 200 and body["title"] == "run.arrow"


# tests/route_stall/sitecustomize.py, loaded by the server at its start, stands in for a file
# that takes an analysis forever (``stall.arrow``: gpuviz.load waits on an event nobody sets,
# after creating ``stalled``, the sign that the analysis is under way) or exhausts its memory
# (``hog.arrow``: it asks for 1 TiB), whatever the importers' own limits.
STALL = Path(__file__).resolve().parent / "route_stall"
LIMITS = {
    "env": {
        "PYTHONPATH": os.pathsep.join(p for p in (str(STALL), os.environ.get("PYTHONPATH", "")) if p),
        "GPUVIZ_RESULT_TIMEOUT_S": "20",
        "GPUVIZ_RESULT_MEMORY_MB": "512",
    }
}


@pytest.mark.parametrize("lab_server", [pytest.param(LIMITS, id="limits")], indirect=True)
def test_a_file_past_the_limits_holds_up_no_other_request(lab_server) -> None:  # type: ignore[no-untyped-def]
    base, token, root = lab_server
    small_log().save(root / "stall.arrow")
    small_log().save(root / "hog.arrow")
    small_log().save(root / "run.arrow")
    route = f"{base}/gpuviz/result?token={token}&path="
    answers: dict[str, tuple[int, dict[str, object]]] = {}
    stalled = threading.Thread(target=lambda: answers.setdefault("stall", get(route + "stall.arrow")))
    stalled.start()
    deadline = time.monotonic() + 300
    while not (root / "stalled").exists():  # the stalled analysis is under way
        assert time.monotonic() < deadline and stalled.is_alive(), answers
        time.sleep(0.05)
    status, body = get(route + "run.arrow")
    assert status == 200 and body["title"] == "run.arrow"
    status, body = get(route + "hog.arrow")
    assert status == 400
    assert body["message"] == (
        "hog.arrow: analysing it needs more than 512 MiB of memory (GPUVIZ_RESULT_MEMORY_MB); "
        "open it with `gpuviz report` instead"
    )
    stalled.join()
    status, body = answers["stall"]
    assert status == 503
    assert body["message"] == (
        "stall.arrow: the analysis ran past its time limit of 20 s (GPUVIZ_RESULT_TIMEOUT_S); "
        "open it with `gpuviz report` instead"
    )
    status, body = get(route + "run.arrow")  # and the route still serves
    assert status == 200
