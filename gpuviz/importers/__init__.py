"""Importers: traces of real runs, written by other tools, opened as ordinary EventLogs.

``load(path)`` opens a gpuviz event log or any supported foreign format, chosen by the
file's content (magic bytes, JSON keys, pickle structure), never by its name; gzip-compressed
files are decompressed on the fly. An importer is a module of this package with

    NAME: str                  the format's name, e.g. "pytorch-snapshot"
    DESCRIPTION: str           what the format is, in words (used in error messages)
    sniff(head: bytes) -> bool whether the first ``HEAD_BYTES`` (decompressed) are this format
    read(source: Source, *, progress: Progress) -> EventLog

``read`` parses only (the source framework is never needed), records what the source
allocator decided, and says in ``log.meta`` where the log came from and which columns are
exact, inferred or absent (``builder.set_source_meta``). It raises ``LogFormatError`` for
input it cannot read; a file cut short yields its readable prefix with ``truncated`` set,
or ``LogFormatError``.
"""

from __future__ import annotations

import importlib
import json
import pickle
import struct
import zlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from gpuviz.base.errors import LogFormatError

if TYPE_CHECKING:  # imported where used: the package stays light (it is also the C readers' parent)
    from gpuviz.importers.source import Source
    from gpuviz.log.eventlog import EventLog

__all__ = ["load", "detect", "formats", "IMPORTERS"]

# Sniffed in this order; the first whose ``sniff`` accepts the head reads the file.
IMPORTERS: tuple[str, ...] = (
    "gpuviz.importers.gpuviz_log",
    "gpuviz.importers.torch_snapshot",
    "gpuviz.importers.xplane",
    "gpuviz.importers.xprof_memory",
    "gpuviz.importers.torch_profiler",
    "gpuviz.importers.torch_memory_timeline",
    "gpuviz.importers.rmm_csv",
    "gpuviz.importers.tf_placement",
)

# What a broken foreign file may raise from inside a parser; ``load`` turns each into LogFormatError.
_PARSE_ERRORS = (
    ValueError, KeyError, IndexError, TypeError, AttributeError, EOFError, UnicodeDecodeError,
    struct.error, zlib.error, pickle.UnpicklingError, OverflowError, RecursionError,
)  # fmt: skip


def _modules() -> list[ModuleType]:
    return [importlib.import_module(name) for name in IMPORTERS]


def formats() -> list[tuple[str, str]]:
    """``(name, description)`` of every format ``load`` reads, in sniffing order."""
    return [(module.NAME, module.DESCRIPTION) for module in _modules()]


def _describe(head: bytes) -> str:
    """A few words on what an unrecognised file looks like."""
    text = head.lstrip()
    if not text:
        return "it is empty"
    if text[:1] in (b"{", b"["):
        try:
            value = json.loads(head)
        except ValueError:
            return "it looks like JSON (cut at the sniffed bytes or invalid)"
        if isinstance(value, dict):
            return f"it is JSON with keys {sorted(value)[:8]}"
        return f"it is a JSON {type(value).__name__}"
    if head[:1] == b"\x80":
        return "it is a pickle of another structure"
    return f"it starts with bytes {head[:8]!r}"


def detect(path: str | Path) -> str:
    """The name of the format of the file at ``path`` (``LogFormatError`` when none fits)."""
    from gpuviz.importers.source import Source

    return _choose(Source(path)).NAME  # type: ignore[no-any-return]


def _choose(source: Source) -> ModuleType:
    modules = _modules()
    for module in modules:
        if module.sniff(source.head):
            return module
    tried = "; ".join(module.DESCRIPTION for module in modules)
    compressed = " (gzip-compressed)" if source.compressed else ""
    raise LogFormatError(
        f"{source.path}{compressed} is not a gpuviz event log nor a trace gpuviz can open: {_describe(source.head)}. "
        f"Formats tried: {tried}"
    )


def load(path: str | Path, *, progress: bool | None = None) -> EventLog:
    """Open ``path`` as an EventLog: a gpuviz log or any supported foreign trace.

    ``progress``: ``None`` shows a progress bar (tqdm) for large files only, ``True`` always,
    ``False`` never. ``log.meta["source"]`` says what the file was. Raises ``LogFormatError``
    naming the file and the reason when it cannot be read, ``FileNotFoundError`` when missing.
    """
    from gpuviz.importers.source import Progress, Source, make_progress

    source = Source(path)
    module = _choose(source)
    bar: Progress = make_progress(source.size, f"importing {source.path.name}", progress)
    source.progress = bar
    try:
        log: EventLog = module.read(source, progress=bar)
    except LogFormatError:
        raise
    except _PARSE_ERRORS as exc:
        raise LogFormatError(
            f"{source.path} is not a readable {module.DESCRIPTION}: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        bar.close()
    return log
