"""The options every front-end shares: how a profile is viewed and how a report is written.

The CLI and the IPython magics both build their parsers from ``add_view_arguments`` and
turn the result into ``ViewOptions`` with ``view_options``; both write reports with
``write_report``. Neither imports the other.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gpuviz.analysis.viewoptions import COLOR_BY, GROUP_BY, ViewOptions
from gpuviz.base.devices import parse_device

if TYPE_CHECKING:  # the analysis and views are imported when a report is written: `gpuviz --help` stays quick
    from gpuviz.log.eventlog import EventLog

__all__ = ["add_view_arguments", "view_options", "write_report"]


def add_view_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", help="device for the single-device views, e.g. GPU:0")
    parser.add_argument("--color-by", choices=COLOR_BY, default="state", help="color of used chunks in maps")
    parser.add_argument("--group-by", choices=GROUP_BY, default="tag", help="grouping of the top allocations")
    parser.add_argument("--points", type=int, default=2000, help="most points a timeline draws")
    parser.add_argument("--scrub-points", type=int, default=40, help="instants the time scrubber offers")


def view_options(args: argparse.Namespace) -> ViewOptions:
    """``ViewOptions`` from parsed arguments; ``ValueError`` names a bad value."""
    return ViewOptions(
        device=parse_device(args.device).short if args.device else None,
        color_by=args.color_by,
        group_by=args.group_by,
        points=args.points,
        scrub_points=args.scrub_points,
    )


def write_report(
    log: EventLog, path: str | Path, options: ViewOptions | None = None, *, cdn: bool = False, title: str | None = None
) -> Path:
    """Write the self-contained HTML report of ``log`` to ``path``; returns the path.

    A path ending in ``.gpuviz.json`` gets the result as JSON instead (what the JupyterLab
    extension opens; ``cdn`` does not apply).
    """
    from gpuviz.analysis.profile import profile
    from gpuviz.views.report import report_html
    from gpuviz.views.result import FILE_EXTENSION, result_json

    target = Path(path)
    if target.name.endswith(FILE_EXTENSION):
        target.write_text(result_json(profile(log, options), title=title or target.name), encoding="utf-8")
        return target
    document = report_html(
        profile(log, options),
        plotlyjs="cdn" if cdn else "inline",
        title=title or "gpuviz report",
        source=target.stem,
    )
    target.write_text(document, encoding="utf-8")
    return target
