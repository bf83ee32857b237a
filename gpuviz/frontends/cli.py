"""The ``gpuviz`` command line (also ``python -m gpuviz``).

gpuviz demo [-o gpuviz-demo.html] [--log gpuviz-demo.arrow] [--gpu-memory 1GiB] [--cdn]
gpuviz report RUN.arrow [-o RUN.html] [--cdn] [--device D] [--color-by ...] [--group-by ...] [--user-code RE]
    [--no-advise]
gpuviz report RUN_DIR [-o RUN_DIR.html] [--cdn] [--rank-reports outliers|all|none] [--align auto|clock|start]
    (a distributed run; also RUN.gpuviz-run, a run manifest; -o run.gpuviz.json: its result, for JupyterLab)
gpuviz summary RUN.arrow | RUN_DIR | RUN.gpuviz-run
gpuviz whatif RUN [--policy torch --policy tf-bfc ...] [--capacity 16GiB] [-o whatif.html]
gpuviz advise RUN [--device GPU:0] [--capacity 80GiB]
gpuviz import SRC [-o RUN.arrow]
gpuviz export RUN.arrow --to torch-snapshot -o RUN.pickle
gpuviz export RUN_DIR --to parquet -o DATASET_DIR   (a run, or one log: host=.../rank=.../part-0.parquet)
gpuviz run [--torch|--tf|--jax|--gpuviz] [-o RUN.arrow] [--report RUN.html] (script.py | -m module) [args...]
gpuviz info
"""

from __future__ import annotations

import argparse
import errno
import json
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuviz.base.errors import GpuvizError
from gpuviz.frontends.options import add_user_code_argument, add_view_arguments, view_options, write_report

if TYPE_CHECKING:
    from gpuviz.log.eventlog import EventLog

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from gpuviz.demo import run_demo
    from gpuviz.log.eventlog import EventLog
    from gpuviz.views.text import summary_text

    log_path = Path(args.log)
    log = EventLog(log_path)
    run_demo(log, gpu_memory=args.gpu_memory)
    log.close()
    print(summary_text(log))
    if "demo_oom" in log.meta:
        print("\nThe demo's last request failed:\n  " + str(log.meta["demo_oom"]))
    report = write_report(log, args.output, view_options(args), cdn=args.cdn, title="gpuviz demo")
    print(f"\nevent log: {log_path}\nreport:    {report} (open it in a browser)")
    return 0


def _printable(text: str) -> str:
    """``text`` with control characters (but newlines and tabs) escaped: names read from a
    file reach the terminal as text, never as escape sequences that retitle or clear it."""
    return "".join(c if c in "\n\t" or (c.isprintable() and c != "\x7f") else repr(c)[1:-1] for c in text)


def _check_output(path: Path) -> None:
    """``OSError`` naming ``path`` when no file can be written there: checked before the work."""
    from gpuviz.frontends.options import output_problem

    problem = output_problem(path)
    if problem is not None:
        raise OSError(errno.EINVAL, problem, str(path))


def _report(args: argparse.Namespace) -> int:
    from gpuviz.importers import load

    if _is_run(args.log):
        return _run_report(args)
    output = Path(args.output) if args.output else Path(args.log).with_suffix(".html")
    _check_output(output)
    log = load(args.log)
    write_report(log, output, view_options(args), cdn=args.cdn, title=f"gpuviz report: {Path(args.log).name}",
                 advise=not args.no_advise)  # fmt: skip
    print(f"report written to {output}" + (" (the log was truncated)" if log.truncated else ""))
    return 0


def _info(args: argparse.Namespace) -> int:
    import numpy
    import plotly
    import pyarrow

    from gpuviz._version import __version__
    from gpuviz.capture.recorder import recorder_description
    from gpuviz.runtime.config import list_physical_devices

    print(f"gpuviz {__version__} on Python {platform.python_version()} ({platform.platform()})")
    print(f"numpy {numpy.__version__}, pyarrow {pyarrow.__version__}, plotly {plotly.__version__}")
    from gpuviz.views.plotlyjs import bundle_status

    print(f"plotly.js: {bundle_status()}")
    print(f"event recorder: {recorder_description()}")
    from gpuviz.capture.native import allocator_description

    print(f"allocator: {allocator_description()}")
    from gpuviz.scenarios.native import replay_description

    print(f"what-if replays: {replay_description()}")
    from gpuviz.base.native import statuses

    print("native modules:")
    for entry in statuses():
        state = entry.state + (f" ({entry.reason})" if entry.reason else "")
        print(f"  {entry.module.name}: {state} - {entry.module.speeds_up}")
    from gpuviz.capture.nvml import device_facts, nvml_status

    try:
        import cupy

        gpus = cupy.cuda.runtime.getDeviceCount() if cupy.cuda.is_available() else 0
        cupy_line = f"cupy {cupy.__version__}, {gpus} GPU(s) visible to CUDA"
    except ImportError:
        cupy_line = "cupy not installed (pip install gpuviz[cuda12] or [cuda13])"
    status = nvml_status()
    print(cupy_line)
    print(f"NVML: {status.reason}" + (f", driver {status.driver_version}" if status.driver_version else ""))
    for facts in device_facts():
        print(
            f"  {facts.index}: {facts.name} ({facts.pci_bus_id}), {facts.used_bytes} of {facts.total_bytes} bytes used"
        )
    from gpuviz.runtime.config import get_backend

    print(f"device runtime: {get_backend()} devices")
    for device in list_physical_devices():
        print(f"  {device.name}")
    return 0


def _is_run(path: str) -> bool:
    """A distributed run: a directory of logs or a run manifest (``*.gpuviz-run``)."""
    from gpuviz.analysis.run import RUN_EXTENSION

    return Path(path).is_dir() or path.endswith(RUN_EXTENSION)


def _run_report(args: argparse.Namespace) -> int:
    """``gpuviz report RUN_DIR``: the run's heatmaps and per-rank table, and the chosen ranks' reports."""
    from gpuviz.analysis.run import load_run
    from gpuviz.frontends.run_report import write_run_report

    folder = Path(args.log)
    name = folder.name.removesuffix(".gpuviz-run")
    output = Path(args.output) if args.output else folder.with_name(name + ".html")
    _check_output(output)
    written = write_run_report(
        load_run(folder), output, rank_reports=args.rank_reports, options=view_options(args), cdn=args.cdn,
        title=f"gpuviz run: {name}", align=args.align,
    )  # fmt: skip
    ranks = written.rank_reports
    where = f" ({len(ranks)} rank report{'s' if len(ranks) != 1 else ''} in {output.name.split('.')[0]}-ranks/)"
    print(f"report written to {output}" + (where if ranks else ""))
    return 0


def _summary(args: argparse.Namespace) -> int:
    from gpuviz.importers import load
    from gpuviz.views.text import summary_text

    if _is_run(args.log):
        from gpuviz.analysis.cluster import cluster_summary
        from gpuviz.analysis.run import load_run
        from gpuviz.views.cluster import cluster_text

        print(_printable(cluster_text(cluster_summary(load_run(args.log)))))
        return 0
    log = load(args.log)
    from gpuviz.analysis.integrity import integrity_lines

    print(_printable(summary_text(log, user_code=args.user_code)))
    for line in integrity_lines(log):
        print(_printable(f"({line})"))
    return 0


def _whatif(args: argparse.Namespace) -> int:
    from gpuviz.frontends.whatif_options import run_whatif, write_comparison
    from gpuviz.importers import load

    comparison = run_whatif(load(args.log), args)
    print(comparison.headline())
    for note in comparison.notes:
        print(f"note: {note}")
    if args.output:
        print(f"report written to {write_comparison(comparison, args.output, cdn=args.cdn)}")
    return 0


def _advise(args: argparse.Namespace) -> int:
    from gpuviz.base.units import parse_bytes
    from gpuviz.importers import load
    from gpuviz.scenarios.advise import advise

    capacity = parse_bytes(args.capacity, name="capacity") if args.capacity else None
    print(advise(load(args.log), device=args.device, capacity=capacity).text)
    return 0


def _import(args: argparse.Namespace) -> int:
    from gpuviz.importers import load

    source = Path(args.source)
    output = Path(args.output) if args.output else Path(source.name.split(".")[0] + ".arrow")
    if output.exists() and output.resolve() == source.resolve():
        raise ValueError(f"the output {output} is the file being imported; name another with -o")
    _check_output(output)
    log = load(source)
    log.save(output)
    print(_printable(_imported(log, source)))
    print(f"event log written to {output}")
    return 0


def _export(args: argparse.Namespace) -> int:
    if args.to == "parquet":
        from gpuviz.analysis.run import load_run
        from gpuviz.exporters.parquet import export_run_parquet

        parts = export_run_parquet(load_run(args.log), args.output)
        print(f"Parquet dataset of {len(parts)} rank(s) written to {args.output} (partitioned by host and rank)")
        return 0
    from gpuviz.exporters.torch_snapshot import write_torch_snapshot
    from gpuviz.importers import load

    log = load(args.log)
    path = write_torch_snapshot(log, args.output)
    print(f"PyTorch memory snapshot written to {path} (open it at https://pytorch.org/memory_viz)")
    return 0


def _imported(log: EventLog, source: Path) -> str:
    """What an import read: the format, each device's events by kind, the columns not exact, the notes."""
    from collections import Counter

    from gpuviz.log.schema import KIND_NAMES

    meta = log.meta.get("source", {"format": "gpuviz"})
    tool = f", written by {meta['tool']}" if meta.get("tool") else ""
    lines = [f"imported {source.name}: {meta.get('format')}{tool}; {len(log)} events"]
    kinds = Counter(zip(log["device"].tolist(), log["kind"].tolist(), strict=True))
    for index, name in [*enumerate(log.device_names), (-1, "no device")]:
        counts = {KIND_NAMES[k]: n for (d, k), n in sorted(kinds.items()) if d == index}
        if counts:
            by_kind = ", ".join(f"{k} {n}" for k, n in counts.items())
            lines.append(f"  {name}: {sum(counts.values())} events ({by_kind})")
    columns = log.meta.get("columns", {})
    for fidelity in ("inferred", "absent"):
        names = [c for c, f in columns.items() if f == fidelity]
        if names:
            lines.append(f"  {fidelity}: {', '.join(names)}")
    lines.extend(f"  note: {note}" for note in log.meta.get("notes", []))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuviz", description="GPU memory profiler and visualizer")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a demo workload on the default device and write its report")
    demo.add_argument("-o", "--output", default="gpuviz-demo.html", help="report to write (HTML, or .gpuviz.json)")
    demo.add_argument("--log", default="gpuviz-demo.arrow", help="event-log file to write")
    demo.add_argument("--gpu-memory", default="1GiB", help="memory of the simulated GPU, e.g. 1GiB")
    demo.add_argument("--cdn", action="store_true", help="load plotly.js from its CDN (smaller file, needs internet)")
    add_view_arguments(demo)
    demo.set_defaults(run=_demo)
    report = commands.add_parser("report", help="write the HTML report (or .gpuviz.json result) of a saved event log")
    report.add_argument("log", help="an event-log file (.arrow), or a directory of per-rank logs (a run)")
    report.add_argument(
        "-o",
        "--output",
        help="HTML file to write (default: the log's name with .html); a name ending in .gpuviz.json "
        "gets the result as JSON, for JupyterLab",
    )
    report.add_argument("--cdn", action="store_true", help="load plotly.js from its CDN (smaller file, needs internet)")
    report.add_argument("--rank-reports", choices=["outliers", "all", "none"], default="outliers",
                        help="a run: which ranks get their own report, opened by a click on their row "
                        "(outliers: the outliers and the highest peak)")  # fmt: skip
    report.add_argument("--align", choices=["auto", "clock", "start"], default="auto",
                        help="a run: line ranks up by wall clock or by their first events (auto: by wall clock "
                        "when every rank has an anchor)")  # fmt: skip
    report.add_argument("--no-advise", action="store_true",
                        help="leave out the advice section (the run replayed under its allocator's "
                        "settings)")  # fmt: skip
    add_view_arguments(report)
    report.set_defaults(run=_report)
    summary = commands.add_parser("summary", help="print the summary of a saved event log")
    summary.add_argument("log", help="an event-log file (.arrow), or a directory of per-rank logs (a run)")
    add_user_code_argument(summary)
    summary.set_defaults(run=_summary)
    from gpuviz.frontends.whatif_options import add_whatif_arguments

    whatif = commands.add_parser("whatif", help="replay a run's requests under other allocator policies")
    whatif.add_argument("log", help="an event log or any trace gpuviz.load reads")
    whatif.add_argument("-o", "--output", help="write the comparison: HTML, or .gpuviz.json for JupyterLab")
    whatif.add_argument("--cdn", action="store_true", help="load plotly.js from its CDN (smaller file, needs internet)")
    add_whatif_arguments(whatif)
    whatif.set_defaults(run=_whatif)
    advice = commands.add_parser("advise", help="replay a run under its allocator's settings and say which fits")
    advice.add_argument("log", help="an event log or any trace gpuviz.load reads")
    advice.add_argument("--device", help="device to replay (default: the first to run out of memory, else the busiest)")
    advice.add_argument("--capacity", help="the GPU's memory, e.g. 80GiB (default: the log's, else inferred)")
    advice.set_defaults(run=_advise)
    imported = commands.add_parser("import", help="open a trace of another tool (PyTorch, TensorFlow, RMM...) "
                                   "and save it as a gpuviz event log")  # fmt: skip
    imported.add_argument("source", help="a trace file in any format gpuviz reads (gzip-compressed too)")
    imported.add_argument("-o", "--output", help="event log to write (default: the source's name with .arrow, here)")
    imported.set_defaults(run=_import)
    export = commands.add_parser("export", help="write an event log (or any trace gpuviz reads) in another format")
    export.add_argument("log", help="an event-log file (.arrow) or any trace gpuviz reads")
    export.add_argument("--to", required=True, choices=["torch-snapshot", "parquet"],
                        help="torch-snapshot: PyTorch's memory snapshot, for PyTorch's memory viewer; "
                        "parquet: a run (or one log) as a Parquet dataset partitioned by host and rank")  # fmt: skip
    export.add_argument("-o", "--output", required=True,
                        help="file to write (.pickle as _dump_snapshot; .json: JSON); parquet: the dataset's folder "
                        "(new or empty)")  # fmt: skip
    export.set_defaults(run=_export)
    from gpuviz.frontends.run import add_run_arguments, run_command

    run = commands.add_parser("run", help="run a Python program with recording on; write its log and report at exit")
    add_run_arguments(run)
    run.set_defaults(run=run_command)
    info = commands.add_parser("info", help="versions and devices")
    info.set_defaults(run=_info)
    return parser


def _describe(error: Exception, log_path: str | None) -> str:
    """``<file>: <what is wrong>`` for an error of a command, on one line.

    The file is the one the error names (an output that cannot be written) or else the
    event log the command reads. Decoder errors say what was being decoded; errors that
    are not gpuviz's own name their type, since they come from a damaged input.
    """
    if isinstance(error, OSError) and error.filename is not None:
        where: str | None = str(error.filename)
        reason = error.strerror or str(error)
    else:
        where = log_path
        if isinstance(error, UnicodeDecodeError):
            bad = error.object[error.start]
            reason = f"text in the file is not valid {error.encoding} (byte {bad:#04x} at offset {error.start})"
        elif isinstance(error, json.JSONDecodeError):
            reason = f"JSON in the file is malformed ({error.msg} at line {error.lineno}, column {error.colno})"
        elif isinstance(error, (OSError, ValueError, GpuvizError)):
            reason = str(error)
        else:
            reason = f"cannot be read as a gpuviz event log ({type(error).__name__}: {error})"
        if where is not None and reason.startswith(where):  # messages that already name the file
            reason = reason[len(where) :].lstrip(": ").removeprefix("is ")
    text = f"{where}: {reason}" if where is not None else reason
    return " ".join(text.split())


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every error is one line ``gpuviz: error: <file>: <reason>`` and exit status 2."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except Exception as error:  # the one place errors become messages: no traceback for bad input
        # the input file of the command (demo's --log is an output; its errors name their own file)
        reads = None if args.command == "demo" else getattr(args, "log", None) or getattr(args, "source", None)
        print(f"gpuviz: error: {_describe(error, reads)}", file=sys.stderr)
        return 2
