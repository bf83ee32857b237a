"""Importers: traces of real runs, written by other tools, opened as ordinary EventLogs.

``load(path)`` opens a gpuviz event log or any supported foreign format, chosen by the
file's content (magic bytes, JSON keys, pickle structure), never by its name; gzip-compressed
files are decompressed on the fly. An importer is a module of this package with

    NAME: str                  the format's name, e.g. "pytorch-snapshot"
    DESCRIPTION: str           what the format is, in words (used in error messages)
    sniff(head: bytes) -> bool whether the first ``HEAD_BYTES`` (decompressed) are this format
    sniff_keys(top: JsonTop) -> bool   optional, for JSON objects: whether a document with these
                               top-level keys is this format (asked when no ``sniff`` accepts the head)
    read(source: Source, *, progress: Progress) -> EventLog

``read`` parses only (the source framework is never needed), records what the source
allocator decided, and says in ``log.meta`` where the log came from and which columns are
exact, inferred or absent (``builder.set_source_meta``). It raises ``LogFormatError`` for
input it cannot read; a file cut short yields its readable prefix with ``truncated`` set,
or ``LogFormatError``.
"""

from __future__ import annotations

import csv
import importlib
import os
import pickle
import stat
import struct
import zlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from gpuviz.base.errors import LogFormatError

if TYPE_CHECKING:  # imported where used: the package stays light (it is also the C readers' parent)
    from gpuviz.importers.source import Source
    from gpuviz.log.eventlog import EventLog

__all__ = ["load", "detect", "formats", "special_kind", "IMPORTERS"]

# Sniffed in this order; the first whose ``sniff`` accepts the head reads the file.
IMPORTERS: tuple[str, ...] = (
    "gpuviz.importers.gpuviz_log",
    "gpuviz.importers.torch_snapshot",
    "gpuviz.importers.xplane",
    "gpuviz.importers.jax_memory_profile",
    "gpuviz.importers.xprof_memory",
    "gpuviz.importers.torch_profiler",
    "gpuviz.importers.torch_memory_timeline",
    "gpuviz.importers.rmm_csv",
    "gpuviz.importers.tf_placement",
)

# What a broken or hostile foreign file may raise from inside a parser (a number past every
# bound raises ArithmeticError, a declared length past memory MemoryError); ``load`` turns each
# into LogFormatError.
_PARSE_ERRORS = (
    ValueError, KeyError, IndexError, TypeError, AttributeError, EOFError, UnicodeDecodeError,
    struct.error, zlib.error, pickle.UnpicklingError, ArithmeticError, RecursionError, MemoryError, csv.Error,
)  # fmt: skip

_SPECIAL = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket"}


def special_kind(mode: int) -> str | None:
    """What a file of ``st_mode`` ``mode`` is when it is no regular file ("a FIFO", "a device",
    "a socket", "not a regular file"), else None: such a file is refused unopened (reading one
    can block forever)."""
    if stat.S_ISREG(mode):
        return None
    return _SPECIAL.get(stat.S_IFMT(mode), "not a regular file")


def _check_regular(path: str | Path) -> None:
    """``LogFormatError`` for a FIFO, device or socket (``special_kind``); ``FileNotFoundError``
    when missing, as ``open`` would."""
    mode = os.stat(path).st_mode
    kind = None if stat.S_ISDIR(mode) else special_kind(mode)
    if kind is not None:
        raise LogFormatError(f"{path} is {kind}, not a file gpuviz opens")


def _modules() -> list[ModuleType]:
    return [importlib.import_module(name) for name in IMPORTERS]


def formats() -> list[tuple[str, str]]:
    """``(name, description)`` of every format ``load`` reads, in sniffing order."""
    return [(module.NAME, module.DESCRIPTION) for module in _modules()]


def _describe(source: Source) -> str:
    """A few words on what an unrecognised file is (JSON: by a bounded scan, never decoded whole)."""
    head = source.head
    text = head.lstrip()
    if not text:
        return "it is empty"
    if text[:1] in (b"{", b"[", b'"') or text.startswith(b"\xef\xbb\xbf"):
        top = source.json_top()
        if top.kind == "object" and not top.problem:
            return f"it is {top.describe()}: not a format gpuviz opens"
        if top.kind == "object":
            return f"it looks like {top.describe()}"
        return f"it is {top.describe()}"
    if head[:1] == b"\x80":
        return "it is a pickle of another structure"
    return f"it starts with bytes {head[:8]!r}"


def detect(path: str | Path) -> str:
    """The name of the format of the file at ``path`` (``LogFormatError`` when none fits)."""
    from gpuviz.importers.source import Source

    _check_regular(path)
    return _choose(Source(path)).NAME  # type: ignore[no-any-return]


def _choose(source: Source) -> ModuleType:
    """The importer of ``source``: the first whose ``sniff`` accepts the head; for a JSON object
    no head sniffer claims, the first whose ``sniff_keys`` accepts its top-level keys (found by
    a bounded streaming scan of the whole document, wherever the keys sit)."""
    modules = _modules()
    for module in modules:
        if module.sniff(source.head):
            return module
    if source.head.lstrip().lstrip(b"\xef\xbb\xbf").startswith(b"{"):
        top = source.json_top()
        for module in modules:
            sniff_keys = getattr(module, "sniff_keys", None)
            if sniff_keys is not None and sniff_keys(top):
                return module
    tried = "; ".join(module.DESCRIPTION for module in modules)
    compressed = " (gzip-compressed)" if source.compressed else ""
    raise LogFormatError(
        f"{source.path}{compressed} is not a gpuviz event log nor a trace gpuviz can open: {_describe(source)}. "
        f"Formats tried: {tried}"
    )


def load(path: str | Path, *, progress: bool | None = None) -> EventLog:
    """Open ``path`` as an EventLog: a gpuviz log or any supported foreign trace.

    ``progress``: ``None`` shows a progress bar (tqdm) for large files only, ``True`` always,
    ``False`` never. ``log.meta["source"]`` says what the file was. Raises ``LogFormatError``
    naming the file and the reason when it cannot be read, ``FileNotFoundError`` when missing.
    """
    from gpuviz.importers.source import InputTooLarge, Progress, Source, make_progress

    _check_regular(path)
    source = Source(path)
    try:
        module = _choose(source)
    except LogFormatError:
        raise
    except _PARSE_ERRORS as exc:
        raise LogFormatError(f"{source.path}: gpuviz cannot tell its format ({type(exc).__name__}: {exc})") from None
    bar: Progress = make_progress(source.size, f"importing {source.path.name}", progress)
    source.progress = bar
    try:
        log: EventLog = module.read(source, progress=bar)
    except LogFormatError:
        raise
    except InputTooLarge as exc:
        raise LogFormatError(str(exc)) from None
    except _PARSE_ERRORS as exc:
        raise LogFormatError(
            f"{source.path} could not be read as {module.DESCRIPTION}: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        bar.close()
    return log
