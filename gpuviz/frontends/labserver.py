"""The Jupyter server extension of gpuviz (enabled by the ``jupyter_server_config.d/gpuviz.json``
that ``pip install gpuviz`` puts in place), for the JupyterLab extension's file viewers:

``GET <base_url>/gpuviz/result?path=RUN.arrow``: the result of a saved log, as JSON; for a run
manifest (``RUN.gpuviz-run``), the result of the distributed run it names (``run_result_json``).

The path is checked through the server's contents manager (only files the user may open,
relative to the server's root) and resolved on disk; a path whose symlinks lead outside
the root is refused like any path outside it. The file is then opened where it lies by
``gpuviz.load`` — any format it reads: gpuviz event logs,
and the foreign traces its importers know (PyTorch snapshots, XPlane, ...) — and
analysed in a worker process: the server never reads the file itself, its event loop
stays free while a large log is analysed, and its memory does not grow with the log
(one worker, so one analysis at a time; later requests wait their turn).

Errors are JSON replies: 400 for a file gpuviz cannot read (the reason, naming the path
as requested), 404 for a missing file or one outside the root, 501 when the contents are not on a local
file system, 500 when the worker died.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import posixpath
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import tornado
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import ensure_async, url_path_join

ROUTE = ("gpuviz", "result")

_workers: list[ProcessPoolExecutor] = []  # at most one: created at the first request


def result_json(os_path: str, title: str) -> tuple[bool, str]:
    """In the worker: (True, the ``gpuviz-result`` JSON of the file at ``os_path``), or
    (False, why gpuviz cannot read it), the file named ``title`` in the reason."""
    from gpuviz import LogFormatError, load
    from gpuviz.analysis.profile import profile
    from gpuviz.views.result import result_json as to_json

    if os_path.endswith(".gpuviz-run"):
        return run_result_json(os_path, title)
    try:
        log = load(os_path)
    except LogFormatError as error:
        return False, str(error).replace(os_path, title)
    return True, to_json(profile(log), title=title)


def run_result_json(os_path: str, title: str) -> tuple[bool, str]:
    """In the worker: the result of the run that the manifest at ``os_path`` names (its
    heatmaps and per-rank table), each table row linked to its rank's file by that file's
    path under the server's root (None for a file outside the manifest's tree), so that the
    extension opens a rank through this route; or (False, why the run cannot be read)."""
    from gpuviz import GpuvizError
    from gpuviz.analysis.cluster import cluster_summary
    from gpuviz.analysis.run import load_run
    from gpuviz.views.cluster import cluster_result

    folder, base = os.path.dirname(os_path), posixpath.dirname(title)
    try:
        run = load_run(os_path)
        summary = cluster_summary(run)
    except (OSError, ValueError, GpuvizError) as error:
        return False, str(error).replace(os_path, title).replace(folder, base or ".")
    by_name = {path.name: os.path.relpath(path, folder).replace(os.sep, "/") for path in run.paths}
    links = [
        None if by_name[name].startswith("../") else posixpath.normpath(posixpath.join(base, by_name[name]))
        for name in summary.table["file"]
    ]
    return True, json.dumps(cluster_result(summary, title=title, links=links), separators=(",", ":"))


def _lower_priority() -> None:
    """The worker yields the CPU to the server (and everything else): analysis is batch work."""
    os.nice(10)


def _worker() -> ProcessPoolExecutor:
    if not _workers:  # spawned, not forked: the server has threads of its own
        context = multiprocessing.get_context("spawn")
        _workers.append(ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_lower_priority))
    return _workers[0]


class ResultHandler(APIHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        path = self.get_query_argument("path")
        os_path = await self._os_path(path)
        try:
            # submitted from a thread: the first submission starts the worker process
            future = await asyncio.to_thread(lambda: _worker().submit(result_json, os_path, path))
            readable, text = await asyncio.wrap_future(future)
        except BrokenProcessPool:
            _workers.clear()  # the next request starts a new worker
            raise tornado.web.HTTPError(500, f"the worker analysing {path} died (out of memory?)") from None
        if not readable:
            raise tornado.web.HTTPError(400, text)
        self.set_header("Content-Type", "application/json")
        self.finish(text)

    async def _os_path(self, path: str) -> str:
        """The real path of the file ``path`` names; 404 when it is missing or lies outside the root."""
        manager: Any = self.contents_manager
        model = await ensure_async(manager.get(path, content=False, type="file"))  # 404, 400 for a folder
        root = getattr(manager, "root_dir", None)
        if root is None or not hasattr(manager, "_get_os_path"):
            raise tornado.web.HTTPError(501, "gpuviz results need the contents on the server's local file system")
        real_root = os.path.realpath(root)
        os_path = os.path.realpath(str(manager._get_os_path(model["path"])))
        if os.path.commonpath([real_root, os_path]) != real_root:
            raise tornado.web.HTTPError(404, f"file does not exist: {path}")  # a symlink out of the root
        return os_path


def _load_jupyter_server_extension(server_app: Any) -> None:
    """Called by the Jupyter server at start (``gpuviz._jupyter_server_extension_points``)."""
    setup_handlers(server_app.web_app)


def setup_handlers(web_app: Any) -> None:
    route = url_path_join(web_app.settings["base_url"], *ROUTE)
    web_app.add_handlers(".*$", [(route, ResultHandler)])
