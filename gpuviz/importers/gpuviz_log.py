"""gpuviz's own event-log file (an Arrow IPC stream; see ``gpuviz.log.files``)."""

from __future__ import annotations

from gpuviz.importers.source import Progress, Source
from gpuviz.log.eventlog import EventLog
from gpuviz.log.files import load as load_log

NAME = "gpuviz"
DESCRIPTION = "a gpuviz event log (Arrow IPC stream, .arrow)"
_ARROW_STREAM = b"\xff\xff\xff\xff"  # an IPC stream's first message starts with the continuation marker
_ARROW_FILE = b"ARROW1"


def sniff(head: bytes) -> bool:
    """Any Arrow IPC data: ``load_log`` then says whether it is a gpuviz log, and of which version."""
    return head.startswith((_ARROW_STREAM, _ARROW_FILE))


def read(source: Source, *, progress: Progress) -> EventLog:
    return load_log(source.path)
