"""The JupyterLab extension that renders gpuviz results: a prebuilt federated extension
(mime renderer and file viewers) and a server extension that turns saved event logs into
results (``handlers.py``)."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "gpuviz-labextension"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "gpuviz_labextension"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    from gpuviz_labextension.handlers import setup_handlers

    setup_handlers(server_app.web_app)
