"""Whether a log is whole, in words: what every view that shows a log says first when it is not."""

from __future__ import annotations

from gpuviz.log.eventlog import EventLog

__all__ = ["integrity_lines"]


def integrity_lines(log: EventLog) -> list[str]:
    """One line per way ``log`` is incomplete — damaged, cut short, a recording whose file
    failed — naming what is missing; ``[]`` for a whole log."""
    lines: list[str] = []
    problems = "; ".join(log.problems)
    if log.corrupt:
        lines.append(
            "the file is damaged: only the events before the damage are shown" + (f" ({problems})" if problems else "")
        )
    elif log.truncated:
        lines.append(
            "the file is truncated (cut short before its end): the events after its last complete part are lost"
            + (f" ({problems})" if problems else "")
        )
    elif problems:
        lines.append(f"problems while reading: {problems}")
    if log.file_error:
        lines.append(f"recording to the file stopped: {log.file_error}")
    return lines
