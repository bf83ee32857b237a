"""The what-if options every front-end shares (``gpuviz whatif`` and ``%gpuviz whatif``).

``add_whatif_arguments`` builds the arguments; ``run_whatif`` turns parsed arguments into a
``Comparison``; ``write_comparison`` writes it as HTML or as a ``.gpuviz.json`` result.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from gpuviz.base.devices import parse_device

if TYPE_CHECKING:  # imported where used: building the parser stays quick (`gpuviz --help`)
    from gpuviz.analysis.comparison import Comparison
    from gpuviz.log.eventlog import EventLog

__all__ = ["add_whatif_arguments", "run_whatif", "write_comparison", "DEFAULT_POLICIES"]

DEFAULT_POLICIES = ("tf-bfc", "torch", "rmm-pool", "no-pool")  # every policy (scenarios.policies.POLICY_NAMES)


def add_whatif_arguments(parser: argparse.ArgumentParser, *, device: bool = True) -> None:
    """``--policy`` (repeatable), ``--capacity``, ``--keep-going`` and, unless the parser has one, ``--device``."""
    parser.add_argument(
        "--policy", action="append", dest="policies", metavar="POLICY",
        help=f"a policy to replay under, repeatable: {', '.join(DEFAULT_POLICIES)}, with options as "
        "name:key=value,... (default: all four)",
    )  # fmt: skip
    parser.add_argument("--capacity", help="the device's memory, e.g. 16GiB (default: unbounded)")
    if device:
        parser.add_argument("--device", help="the device whose requests are replayed (default: the busiest)")
    parser.add_argument("--keep-going", action="store_true", help="skip failed requests instead of stopping")


def run_whatif(log: EventLog, args: argparse.Namespace) -> Comparison:
    """The comparison the parsed arguments ask for; ``ValueError`` names a bad policy or size."""
    from gpuviz.scenarios.whatif import whatif

    device = parse_device(args.device).short if args.device else None
    return whatif(
        log, args.policies or DEFAULT_POLICIES, capacity=args.capacity, device=device, stop_at_oom=not args.keep_going
    )


def write_comparison(c: Comparison, path: str | Path, *, cdn: bool = False) -> Path:
    """HTML report, or the result JSON when ``path`` ends in ``.gpuviz.json``; returns the path."""
    from gpuviz.views.comparison import comparison_html, comparison_result
    from gpuviz.views.result import FILE_EXTENSION

    target = Path(path)
    if target.name.endswith(FILE_EXTENSION):
        target.write_text(json.dumps(comparison_result(c, title=target.name), separators=(",", ":")), encoding="utf-8")
    else:
        target.write_text(comparison_html(c, plotlyjs="cdn" if cdn else "inline"), encoding="utf-8")
    return target
