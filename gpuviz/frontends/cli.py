"""The ``gpuviz`` command line (also ``python -m gpuviz``)."""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from gpuviz.demo import run_demo
    from gpuviz.log.eventlog import EventLog
    from gpuviz.views.text import summary_text

    out = Path(args.output)
    log = EventLog(out)
    run_demo(log, capacity=args.capacity)
    log.close()
    print(summary_text(log))
    if "demo_oom" in log.meta:
        print("\nThe demo's last request failed:\n  " + str(log.meta["demo_oom"]))
    print(f"\nevent log written to {out} (load it with gpuviz.load)")
    return 0


def _info(args: argparse.Namespace) -> int:
    import numpy
    import pyarrow

    import gpuviz

    print(f"gpuviz {gpuviz.__version__} on Python {platform.python_version()} ({platform.platform()})")
    print(f"numpy {numpy.__version__}, pyarrow {pyarrow.__version__}")
    print("devices: CPU:0, GPU:0 (simulated; no GPU backend in this version)")
    return 0


def _summary(args: argparse.Namespace) -> int:
    from gpuviz.log.fileio import load
    from gpuviz.views.text import summary_text

    log = load(args.log)
    print(summary_text(log))
    if log.truncated:
        print("(the file is truncated: events after the last complete batch are lost)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuviz", description="GPU memory profiler and visualizer")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a demo workload on the default device and write its log")
    demo.add_argument("-o", "--output", default="gpuviz-demo.arrow", help="event-log file to write")
    demo.add_argument("--capacity", default="1GiB", help="simulated GPU memory, e.g. 1GiB")
    demo.set_defaults(run=_demo)
    info = commands.add_parser("info", help="versions and devices")
    info.set_defaults(run=_info)
    summary = commands.add_parser("summary", help="print the summary of a saved event log")
    summary.add_argument("log", help="an event-log file (.arrow)")
    summary.set_defaults(run=_summary)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except (OSError, ValueError) as error:
        print(f"gpuviz {args.command}: {error}", file=sys.stderr)
        return 2
