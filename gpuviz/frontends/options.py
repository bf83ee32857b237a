"""The options every front-end shares: how a profile is viewed and how a report is written.

The CLI and the IPython magics both build their parsers from ``add_view_arguments`` and
turn the result into ``ViewOptions`` with ``view_options``; both write reports with
``write_report``. Neither imports the other.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from gpuviz.analysis.viewoptions import COLOR_BY, GROUP_BY, ViewOptions
from gpuviz.base.devices import parse_device

if TYPE_CHECKING:  # the analysis and views are imported when a report is written: `gpuviz --help` stays quick
    from gpuviz.analysis.advice import Advice
    from gpuviz.log.eventlog import EventLog

__all__ = [
    "add_view_arguments",
    "add_user_code_argument",
    "view_options",
    "write_report",
    "advice_or_none",
    "output_problem",
    "report",
]


def advice_or_none(log: EventLog) -> Advice | None:
    """``gpuviz.advise(log)`` (the run replayed under its allocator's settings), or None for a log
    without allocations to replay."""
    from gpuviz.scenarios.advise import advise

    try:
        return advise(log)
    except ValueError:
        return None


def add_user_code_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--user-code", metavar="PATTERN",
                        help="regular expression matching your own files: call sites are the first frame it matches "
                        "(default: the first frame outside PyTorch, TensorFlow, JAX, CuPy, the standard library, "
                        "site-packages and gpuviz)")  # fmt: skip


def output_problem(path: str | Path) -> str | None:
    """Why no file can be written at ``path`` (a folder, a missing or unwritable folder, an
    unwritable file), or None: checked before any work, with a nameless temporary file in
    the folder, so nothing is left behind."""
    target = Path(path).expanduser()
    folder = target.parent
    if target.is_dir():
        return "that is a folder, not a file"
    if not folder.is_dir():
        return f"the folder {folder} does not exist"
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        return f"cannot write in {folder} ({error.strerror})"
    if target.exists() and not os.access(target, os.W_OK):
        return "the file is not writable"
    return None


def add_view_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", help="device for the single-device views, e.g. GPU:0")
    parser.add_argument("--color-by", choices=COLOR_BY, default="state", help="color of used chunks in maps")
    parser.add_argument(
        "--group-by",
        choices=GROUP_BY,
        default="auto",
        help="grouping of the top allocations (auto: by tag where there are tags, else call site)",
    )
    add_user_code_argument(parser)
    parser.add_argument("--points", type=int, default=2000, help="most points a timeline draws")
    parser.add_argument("--scrub-points", type=int, default=40, help="instants the time scrubber offers")


def view_options(args: argparse.Namespace) -> ViewOptions:
    """``ViewOptions`` from parsed arguments; ``ValueError`` names a bad value."""
    return ViewOptions(
        device=parse_device(args.device).short if args.device else None,
        color_by=args.color_by,
        group_by=args.group_by,
        user_code=args.user_code,
        points=args.points,
        scrub_points=args.scrub_points,
    )


def report(
    log: EventLog,
    path: str | Path,
    options: ViewOptions | None = None,
    *,
    cdn: bool = False,
    title: str | None = None,
    advise: bool = True,
) -> Path:
    """``gpuviz.report(log, "run.html")``: write the self-contained HTML report of ``log`` (or,
    for a path ending in ``.gpuviz.json``, the result JupyterLab opens); returns the path.
    ``options``: what the views show (``ViewOptions``); ``cdn``: load plotly.js from its CDN
    instead of embedding it; ``advise``: add the section of replayed advice. The file's folder
    must exist and be writable (``OSError`` naming it otherwise, before any work)."""
    from gpuviz.analysis.profile import profile
    from gpuviz.views.report import report_html
    from gpuviz.views.result import FILE_EXTENSION, result_json

    problem = output_problem(path)
    if problem is not None:
        raise OSError(f"{path}: {problem}")
    target = Path(path)
    if target.name.endswith(FILE_EXTENSION):
        target.write_text(result_json(profile(log, options), title=title or target.name), encoding="utf-8")
        return target
    document = report_html(
        profile(log, options),
        plotlyjs="cdn" if cdn else "inline",
        title=title or "gpuviz report",
        source=target.stem,
        advice=advice_or_none(log) if advise else None,
    )
    target.write_text(document, encoding="utf-8")
    return target


write_report = report
"""The name the front-ends have always called ``report`` by."""
