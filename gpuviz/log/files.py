"""Loading, saving and exporting event logs: the functions users call.

``load(path)`` reads a gpuviz event-log file (either form, format version 1 or 2) into a
read-only ``EventLog``, memory-mapped (``reader.read_log`` checks and parses it); ``save`` and
``to_parquet`` (``export.py``) write a whole log. ``EventLog(path)`` records into a file as it
goes instead (``writer.LogWriter``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa

from gpuviz.base.errors import LogFormatError
from gpuviz.log.eventlog import EventLog
from gpuviz.log.export import PARQUET_SCHEMA, save, to_parquet
from gpuviz.log.reader import read_log

__all__ = ["load", "save", "to_parquet", "PARQUET_SCHEMA"]

logger = logging.getLogger("gpuviz")


def load(path: str | Path) -> EventLog:
    """Read a gpuviz event-log file (format version 1 or 2), memory-mapped.

    Raises ``LogFormatError`` with the reason when the file is not a gpuviz log, has another
    format version, has a damaged header, or holds an index outside its side tables;
    ``OSError`` when it cannot be opened. A file cut short (a crashed recorder) or damaged
    after its header loads up to its last intact batch (or checksummed chunk): the log then
    has ``truncated == True``, ``corrupt == True`` when damage (not only a cut) ended it,
    and ``problems`` says where.
    """
    path = Path(path)
    if path.is_file() and path.stat().st_size == 0:
        raise LogFormatError(f"{path} is not a gpuviz event log (it is empty, truncated before its header)")
    buffer = pa.memory_map(str(path)).read_buffer()  # OSError for a missing or unreadable file
    try:
        log = read_log(buffer, str(path))
    except LogFormatError:
        raise
    except Exception as exc:  # whatever damage made the reader trip on: a clear error naming the file
        raise LogFormatError(f"{path} cannot be read as a gpuviz event log ({type(exc).__name__}: {exc})") from None
    for problem in log.problems:
        logger.warning("%s: %s", path, problem)
    return log
