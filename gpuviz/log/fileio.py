"""Deprecated: the event-log file's functions moved (``gpuviz.log.files``: ``load``, ``save``,
``to_parquet``; ``gpuviz.log.writer``: ``LogWriter``; ``gpuviz.log.arrowfile``: the layout).
The old names still work here, with a ``DeprecationWarning``."""

from __future__ import annotations

import warnings
from typing import Any

from gpuviz.log import arrowfile, files, writer

_MOVED: dict[str, Any] = {
    "load": files,
    "save": files,
    "to_parquet": files,
    "PARQUET_SCHEMA": files,
    "LogWriter": writer,
    "ARROW_SCHEMA": arrowfile,
    "write_random_access": arrowfile,
}


def __getattr__(name: str) -> Any:
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"gpuviz.log.fileio.{name} moved to {home.__name__}.{name}", DeprecationWarning, stacklevel=2)
    return getattr(home, name)
