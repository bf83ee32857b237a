"""``GET <base_url>/gpuviz/result?path=RUN.arrow``: the result of a saved event log, as JSON.

Any file ``gpuviz.load`` opens works the same way (an XPlane, an XProf memory profile, ...):
the format is told by the content, never by the name.

The file is read through the server's contents manager (so only files the user may open
are read, relative to the server's root) and analysed with the ``gpuviz`` package of the
server's environment, off the event loop. Errors are JSON replies: 400 for a file that is
not a gpuviz event log nor a trace gpuviz reads, 404 for a missing file, 501 when gpuviz is not installed here.
"""

from __future__ import annotations

import asyncio
import base64
import os
import tempfile
from typing import Any

import tornado
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import ensure_async, url_path_join

ROUTE = ("gpuviz", "result")


def result_json(data: bytes, title: str) -> str:
    """The ``gpuviz-result`` JSON of the event log or trace ``data`` (raises LogFormatError)."""
    from gpuviz import load
    from gpuviz.analysis.profile import profile
    from gpuviz.views.result import result_json as to_json

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "log.arrow")
        with open(path, "wb") as file:
            file.write(data)
        return to_json(profile(load(path)), title=title)


class ResultHandler(APIHandler):  # type: ignore[misc]
    @tornado.web.authenticated
    async def get(self) -> None:
        path = self.get_query_argument("path")
        try:
            from gpuviz import LogFormatError
        except ImportError:
            raise tornado.web.HTTPError(501, "gpuviz is not installed in the Jupyter server's environment") from None
        model = await ensure_async(self.contents_manager.get(path, content=True, type="file", format="base64"))
        data = base64.b64decode(model["content"])
        try:
            text = await asyncio.get_running_loop().run_in_executor(None, result_json, data, path)
        except LogFormatError as error:
            raise tornado.web.HTTPError(400, str(error)) from None
        self.set_header("Content-Type", "application/json")
        self.finish(text)


def setup_handlers(web_app: Any) -> None:
    route = url_path_join(web_app.settings["base_url"], *ROUTE)
    web_app.add_handlers(".*$", [(route, ResultHandler)])
