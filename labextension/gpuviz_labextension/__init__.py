"""The JupyterLab extension that renders gpuviz results (a prebuilt federated extension)."""

__version__ = "0.1.0"


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "gpuviz-labextension"}]
