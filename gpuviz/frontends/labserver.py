"""The Jupyter server extension of gpuviz (enabled by the ``jupyter_server_config.d/gpuviz.json``
that ``pip install gpuviz`` puts in place), for the JupyterLab extension's file viewers:

``GET <base_url>/gpuviz/result?path=RUN.arrow``: the result of a saved log, as JSON; for a run
manifest (``RUN.gpuviz-run``), the result of the distributed run it names (``run_result_json``).

Confinement: the path is checked through the server's contents manager (only files the user
may open, relative to the server's root) and resolved on disk, links followed; a path that
leads outside the root, a link loop and a missing file answer 404; a FIFO, device or socket
is refused (400) without being opened. A run manifest's directory or glob is confined the
same way: every log it names must resolve inside the root, or the run is refused without
naming, opening or quoting anything outside it.

Isolation: each analysis runs in a process of its own (forked from a preloaded fork server,
so it starts in milliseconds), off the server's event loop and off other requests, with an
address-space limit (``GPUVIZ_RESULT_MEMORY_MB``, default 4096 MiB above what the process
holds at its start) and a time limit (``GPUVIZ_RESULT_TIMEOUT_S``, default 120 s); at most
``GPUVIZ_RESULT_WORKERS`` (default 4) run at once. A file that needs more memory answers 400
with the reason, one that needs more time 503 and its process is killed: neither holds up
the next request.

Errors are JSON replies with the same message the CLI prints: 400 for a file gpuviz cannot
read (the reason, naming the path as requested), 404 for a missing file or one outside the
root, 501 when the contents are not on a local file system, 503 when the analysis ran past
its time limit, 500 when its process died.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import posixpath
from multiprocessing.connection import Connection
from typing import Any

import tornado
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import ensure_async, url_path_join

from gpuviz.importers import special_kind

ROUTE = ("gpuviz", "result")


def _setting(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


TIMEOUT_S = _setting("GPUVIZ_RESULT_TIMEOUT_S", 120.0)
"""Seconds one analysis may take before its process is killed and the request answers 503."""
MEMORY_BYTES = int(_setting("GPUVIZ_RESULT_MEMORY_MB", 4096.0) * 2**20)
"""Bytes of address space one analysis may add to what its process holds when it starts."""
WORKERS = int(_setting("GPUVIZ_RESULT_WORKERS", 4.0))
"""Analyses that run at once; later requests wait for a free slot."""


def result_json(os_path: str, title: str, root: str | None = None) -> tuple[int, str]:
    """(200, the ``gpuviz-result`` JSON of the file at ``os_path``), or (400, why gpuviz
    cannot read it), the file named ``title`` in the reason; a run manifest's logs must lie
    inside ``root`` (when given), else (404, ...)."""
    from gpuviz import GpuvizError, load
    from gpuviz.analysis.profile import profile
    from gpuviz.views.result import result_json as to_json

    if os_path.endswith(".gpuviz-run"):
        return run_result_json(os_path, title, root)
    try:
        log = load(os_path)
    except (GpuvizError, OSError, ValueError) as error:
        return 400, str(error).replace(os_path, title)
    return 200, to_json(profile(log), title=title)


def run_result_json(os_path: str, title: str, root: str | None = None) -> tuple[int, str]:
    """The result of the run that the manifest at ``os_path`` names (its heatmaps and
    per-rank table), each table row linked to its rank's file by that file's path under the
    server's root (None for a file outside the manifest's tree), so that the extension opens
    a rank through this route; or (400, why the run cannot be read). With ``root``, every
    log of the run must resolve inside it, else (404, ...) naming nothing outside."""
    from gpuviz import GpuvizError
    from gpuviz.analysis.cluster import cluster_summary
    from gpuviz.analysis.run import RunOutsideRoot, load_run
    from gpuviz.views.cluster import cluster_result

    folder, base = os.path.dirname(os_path), posixpath.dirname(title)
    try:
        run = load_run(os_path, within=root)
        summary = cluster_summary(run)
    except RunOutsideRoot:
        return 404, f"{title}: the run's logs must lie inside the server's root"
    except (OSError, ValueError, GpuvizError) as error:
        return 400, str(error).replace(os_path, title).replace(folder, base or ".")
    by_name = {path.name: os.path.relpath(path, folder).replace(os.sep, "/") for path in run.paths}
    links = [
        None if by_name[name].startswith("../") else posixpath.normpath(posixpath.join(base, by_name[name]))
        for name in summary.table["file"]
    ]
    return 200, json.dumps(cluster_result(summary, title=title, links=links), separators=(",", ":"))


def _analyse(conn: Connection, os_path: str, title: str, root: str | None, memory_bytes: int) -> None:
    """In the analysis process: cap its memory, lower its priority, send back ``result_json``."""
    import resource

    os.nice(10)  # batch work: the server (and everything else) goes first
    held = 0
    with open("/proc/self/statm") as statm:  # pages of address space held at the start
        held = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = held + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        answer = result_json(os_path, title, root)
    except MemoryError:
        answer = (400, f"{title}: analysing it needs more than {memory_bytes >> 20} MiB of memory "
                         "(GPUVIZ_RESULT_MEMORY_MB); open it with `gpuviz report` instead")  # fmt: skip
    except RecursionError:
        answer = (400, f"{title}: nested too deeply to analyse")
    conn.send(answer)
    conn.close()


_context: list[Any] = []  # the fork-server context, made at the first request


def _process_context() -> Any:
    if not _context:  # a fork server, not fork: the Jupyter server has threads of its own
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["gpuviz.frontends.labserver", "gpuviz", "gpuviz.importers"])
        _context.append(context)
    return _context[0]


def run_analysis(os_path: str, title: str, root: str | None) -> tuple[int, str]:
    """Run ``result_json`` in a process of its own under the time and memory limits:
    (200, JSON), (400, reason), (503, time-out) or (500, the process died). Blocking: the
    route calls it from a thread."""
    context = _process_context()
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_analyse, args=(send, os_path, title, root, MEMORY_BYTES), daemon=True)
    process.start()
    send.close()
    try:
        if not receive.poll(TIMEOUT_S):
            return 503, (f"{title}: the analysis ran past its time limit of {TIMEOUT_S:g} s "
                         "(GPUVIZ_RESULT_TIMEOUT_S); open it with `gpuviz report` instead")  # fmt: skip
        try:
            status, text = receive.recv()
        except (EOFError, OSError):
            process.join()
            return 500, f"the process analysing {title} died (exit code {process.exitcode}, out of memory?)"
        return status, text
    finally:
        receive.close()
        if process.is_alive():
            process.kill()
        process.join()


_slots: list[asyncio.Semaphore] = []


class ResultHandler(APIHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        path = self.get_query_argument("path")
        os_path, root = await self._os_path(path)
        if not _slots:
            _slots.append(asyncio.Semaphore(WORKERS))
        async with _slots[0]:
            status, text = await asyncio.to_thread(run_analysis, os_path, path, root)
        if status != 200:
            raise tornado.web.HTTPError(status, text)
        self.set_header("Content-Type", "application/json")
        self.finish(text)

    async def _os_path(self, path: str) -> tuple[str, str]:
        """(the real path of the file ``path`` names, the server's real root); 404 when it
        is missing, a link loop or lies outside the root; 400 for a special file."""
        manager: Any = self.contents_manager
        missing = tornado.web.HTTPError(404, f"file does not exist: {path}")
        try:
            model = await ensure_async(manager.get(path, content=False, type="file"))  # 404, 400 for a folder
        except OSError:  # a link loop, a name too long
            raise missing from None
        root = getattr(manager, "root_dir", None)
        if root is None or not hasattr(manager, "_get_os_path"):
            raise tornado.web.HTTPError(501, "gpuviz results need the contents on the server's local file system")
        real_root = os.path.realpath(root)
        os_path = os.path.realpath(str(manager._get_os_path(model["path"])))
        if os.path.commonpath([real_root, os_path]) != real_root:
            raise missing  # a symlink out of the root
        try:
            mode = os.stat(os_path).st_mode
        except OSError:
            raise missing from None
        kind = special_kind(mode)
        if kind is not None:
            raise tornado.web.HTTPError(400, f"{path}: {kind}, not a file gpuviz opens")
        return os_path, real_root


def _load_jupyter_server_extension(server_app: Any) -> None:
    """Called by the Jupyter server at start (``gpuviz._jupyter_server_extension_points``)."""
    setup_handlers(server_app.web_app)


def setup_handlers(web_app: Any) -> None:
    route = url_path_join(web_app.settings["base_url"], *ROUTE)
    web_app.add_handlers(".*$", [(route, ResultHandler)])
