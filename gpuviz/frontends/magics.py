"""IPython magics: ``%load_ext gpuviz``, then

    %%gpuviz [--device D] [--memory-limit 4GiB] [--growth/--no-growth] [--live/--no-live]
             [--stacks] [--save run.arrow] [--report report.html] [view options]
    %%gpuviz --torch [--save run.arrow] [--report report.html] [view options]   (PyTorch's own memory)
    %%gpuviz --tf | --jax [...]           (TensorFlow's / JAX's own memory, from their profilers)
    %gpuviz start [--live/--no-live] [--run-dir DIR] | stop | status | show [view options] | report PATH [--cdn] | reset
    %gpuviz show SRC [view options]      a saved event log or any trace gpuviz imports (PyTorch snapshot, ...)
    %gpuviz show RUN_DIR                 a distributed run: heatmap, per-rank table, a rank's views on selection

A profiled cell records into a fresh EventLog (which then stays the runtime's log) and
keeps every array; the cell runs inside a ``cell`` span so allocations still alive at its
end show as possible leaks. Options that change devices (``--memory-limit``,
``--growth``, ``--stacks``) re-initialise the runtime first, which releases the arrays of
earlier cells.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import shlex
import sys
import warnings
from contextlib import suppress
from pathlib import Path
from types import TracebackType
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display as _display

from gpuviz.base.devices import parse_device
from gpuviz.capture.marks import run_log, span
from gpuviz.frontends.options import add_view_arguments, advice_or_none, output_problem, view_options, write_report
from gpuviz.frontends.whatif_options import add_whatif_arguments, run_whatif
from gpuviz.log.eventlog import EventLog
from gpuviz.runtime import config
from gpuviz.runtime.context import device, device_names, get_runtime, reconfigure, record_into, reset
from gpuviz.widgets.dashboard import Dashboard
from gpuviz.widgets.plots import plotly_library

__all__ = ["GpuvizMagics", "load_ipython_extension"]

_FRAMEWORKS = {  # flag -> (name, module to find, how to install it)
    "torch": ("PyTorch", "torch", "pip install 'gpuviz[torch]' (or torch)"),
    "tf": ("TensorFlow", "tensorflow", "pip install 'gpuviz[tensorflow]' (or tensorflow-cpu)"),
    "jax": ("JAX", "jax", "pip install 'gpuviz[jax]'"),
}


def display(obj: object) -> None:
    _display(obj)  # type: ignore[no-untyped-call]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would exit the kernel
        raise UsageError(f"%gpuviz: {message}\n{self.format_usage()}")


def _cell_parser() -> _Parser:
    parser = _Parser(prog="%%gpuviz", add_help=False)
    parser.add_argument("--memory-limit", help="cap GPU:0's allocator, e.g. 4GiB (re-initialises the runtime)")
    parser.add_argument("--growth", action=argparse.BooleanOptionalAction, default=None,
                        help="memory growth on every GPU, not preallocation (re-initialises the runtime)")  # fmt: skip
    parser.add_argument("--live", action=argparse.BooleanOptionalAction, default=True, help="refresh while it runs")
    parser.add_argument("--stacks", action="store_true", help="record call sites (re-initialises the runtime)")
    parser.add_argument("--save", help="save the event log to this .arrow file")
    parser.add_argument("--report", help="write the HTML report (or a .gpuviz.json result) to this file")
    frameworks = parser.add_mutually_exclusive_group()
    frameworks.add_argument("--torch", action="store_const", const="torch", dest="framework",
                            help="record PyTorch's memory instead (gpuviz.torch.record)")  # fmt: skip
    frameworks.add_argument("--tf", action="store_const", const="tf", dest="framework",
                            help="record TensorFlow's memory and placement instead (gpuviz.tf.record)")  # fmt: skip
    frameworks.add_argument("--jax", action="store_const", const="jax", dest="framework",
                            help="record JAX's memory instead (gpuviz.jax.record)")  # fmt: skip
    add_view_arguments(parser)
    return parser


def _line_parser() -> _Parser:
    parser = _Parser(prog="%gpuviz", add_help=False)
    parser.add_argument("command", choices=["start", "stop", "status", "show", "report", "reset", "whatif"])
    parser.add_argument(
        "path",
        nargs="?",
        help="report: the HTML (or .gpuviz.json) file to write; show: a log or trace to open; "
        "whatif: the run to replay",
    )
    parser.add_argument("--live", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--cdn", action="store_true")
    parser.add_argument("--run-dir", help="start: record to this process's file in a run directory (GPUVIZ_LOG_DIR)")
    parser.add_argument(
        "--align", choices=["auto", "clock", "start"], help="show RUN_DIR: line ranks up by wall clock or first events"
    )
    add_view_arguments(parser)
    add_whatif_arguments(parser, device=False)
    return parser


def _parse(parser: _Parser, line: str) -> argparse.Namespace:
    try:
        words = shlex.split(line)
    except ValueError as error:
        raise UsageError(f"%gpuviz: cannot read the options: {error}") from None
    args = parser.parse_args(words)
    try:
        args.view = view_options(args)
    except ValueError as error:
        raise UsageError(f"%gpuviz: {error}") from None
    return args


def _check_writable(option: str, path: str) -> None:
    """``UsageError`` unless a file can be written at ``path`` (``output_problem``)."""
    problem = output_problem(path)
    if problem is not None:
        raise UsageError(f"%gpuviz {option} {path}: {problem}")


def check_cell_options(args: argparse.Namespace) -> None:
    """Check every option of a ``%%gpuviz`` cell before anything happens: a bad value raises
    ``UsageError`` while the runtime, the user's arrays and the files are untouched and the
    cell has not run."""
    try:
        if args.memory_limit is not None:
            config.check_gpu_options("GPU:0", memory_limit=args.memory_limit)
        if args.growth is not None:  # growth applies to every GPU: it cannot differ between them
            gpus: list[config.PhysicalDevice | str] = [*config.list_physical_devices("GPU")] or ["GPU:0"]
            for gpu in gpus:  # no GPU at all: the check names GPU:0 as unknown
                config.check_gpu_options(gpu, memory_growth=args.growth)
    except (ValueError, TypeError) as error:
        raise UsageError(f"%%gpuviz: {error}") from None
    if args.device:
        names = device_names()
        if parse_device(args.device).short not in names:
            raise UsageError(f"%%gpuviz --device {args.device}: no such device; the devices are {', '.join(names)}")
    for option, path in (("--save", args.save), ("--report", args.report)):
        if path:
            _check_writable(option, path)


def _user_traceback(tb: TracebackType | None, filename: str) -> TracebackType | None:
    """``tb`` from the first frame of the cell's own code on (gpuviz's frames dropped)."""
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    return tb


def run_cell_code(shell: Any, line: str, cell: str) -> Any:
    """Run ``cell`` as IPython runs a plain cell: in the user's namespace, with its source
    cached so tracebacks show its lines (numbered as in the notebook, the magic's line being
    line 1), and the value of a last bare expression returned (unless it ends with ``;``).

    An exception propagates unchanged, but IPython shows it from the cell's own frames on,
    as it would for a plain cell: no gpuviz or IPython frames."""
    body = shell.transform_cell(cell)
    source = f"# %%gpuviz {line}\n{body}"  # valid Python, numbered as the notebook shows the cell
    filename = shell.compile.cache(source, shell.execution_count)
    tree = ast.parse(source, filename)
    last: ast.Expression | None = None
    final = tree.body[-1] if tree.body else None
    if isinstance(final, ast.Expr) and not body.rstrip().endswith(";"):
        tree.body.pop()
        last = ast.Expression(final.value)
    try:
        exec(shell.compile(tree, filename, "exec"), shell.user_ns)
        return eval(shell.compile(last, filename, "eval"), shell.user_ns) if last is not None else None
    except BaseException as error:
        user_tb = _user_traceback(error.__traceback__, filename)
        if user_tb is not None and not hasattr(error, "_render_traceback_"):
            shown = shell.InteractiveTB.structured_traceback(type(error), error, user_tb, tb_offset=0)
            with suppress(AttributeError):  # a type without a __dict__ is shown with every frame
                error._render_traceback_ = lambda: shown  # type: ignore[attr-defined]  # IPython's hook
        raise


@magics_class
class GpuvizMagics(Magics):
    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.recording: EventLog | None = None  # the log of ``%gpuviz start`` while it runs
        self.last: EventLog | None = None  # the last profiled log (cell or start/stop)
        self.dashboard: Dashboard | None = None
        self.cluster: Any = None  # the last run shown by ``%gpuviz show RUN_DIR`` (a ClusterDashboard)

    @line_cell_magic
    def gpuviz(self, line: str, cell: str | None = None) -> Any:
        """Profile a cell (``%%gpuviz``) or control recording across cells (``%gpuviz ...``)."""
        if cell is None:
            return self._line(line)
        return self._cell(line, cell)

    # --------------------------------------------------------------------- cell
    def _cell(self, line: str, cell: str) -> Any:
        args = _parse(_cell_parser(), line)
        check_cell_options(args)
        if args.framework is not None:
            return self._framework_cell(args, line, cell)
        if args.memory_limit is not None or args.growth is not None or args.stacks:
            reconfigure()
            try:
                if args.growth is not None:
                    for gpu in config.list_physical_devices("GPU"):
                        config.set_memory_growth(gpu, args.growth)
                if args.memory_limit is not None:
                    config.set_memory_limit("GPU:0", args.memory_limit)
                config.set_record_stacks(args.stacks)
            except (ValueError, TypeError) as error:
                raise UsageError(f"%%gpuviz: {error}") from None
        log = EventLog()
        record_into(log)
        self.last = log
        dashboard = Dashboard(log, args.view, live=args.live, title="%%gpuviz", advisor=advice_or_none)
        self.dashboard = dashboard
        if args.live:
            display(dashboard)
        shell = self.shell
        assert shell is not None, "the magics are registered on a running IPython shell"
        failure: BaseException | None = None
        value: Any = None
        try:
            with span("cell"):
                if args.device:  # run the cell there (the dashboard shows that device too)
                    with device(args.device):
                        value = run_cell_code(shell, line, cell)
                else:
                    value = run_cell_code(shell, line, cell)
        except BaseException as error:  # shown after the dashboard is final
            failure = error
        finally:  # live: the final draw happens on the dashboard's thread, the cell returns at once
            dashboard.stop_live(wait=not args.live)
        if not args.live:
            display(dashboard)
        self._finish(log, args, failure, title="%%gpuviz report")
        return value

    @staticmethod
    def _finish(log: EventLog, args: argparse.Namespace, failure: BaseException | None, *, title: str) -> None:
        """The end of a profiled cell: ``--save``, ``--report``, then the cell's own error, if any."""
        if args.save:
            log.save(args.save)
        if args.report:
            write_report(log, args.report, args.view, title=title)
        if failure is not None:
            raise failure

    def _framework_cell(self, args: argparse.Namespace, line: str, cell: str) -> Any:
        """``%%gpuviz --torch|--tf|--jax``: the cell's memory as the framework records it, shown when it ends."""
        name, module, install = _FRAMEWORKS[args.framework]
        flag = f"%%gpuviz --{args.framework}"
        if importlib.util.find_spec(module) is None:
            raise UsageError(f"{flag} needs {name}, which is not installed here: {install}, then restart the kernel")
        record = importlib.import_module(f"gpuviz.{args.framework}").record
        shell = self.shell
        assert shell is not None, "the magics are registered on a running IPython shell"
        failure: BaseException | None = None
        value: Any = None
        recording: Any = None
        with warnings.catch_warnings():  # the recorder's warnings are said once, below
            warnings.filterwarnings("ignore", message=r"gpuviz\.(tf|jax): ", category=RuntimeWarning)
            try:
                with record() as recording:
                    value = run_cell_code(shell, line, cell)
            except BaseException as error:  # the log is built all the same; shown, then raised
                failure = error
        if recording is None:  # the recorder did not start: the cell did not run
            raise UsageError(f"{flag}: {name}'s recording could not start: {failure}") from failure
        log = recording.log
        self.last = log
        for problem in getattr(recording, "problems", []):
            print(f"{flag}: {problem}", file=sys.stderr)
        self.dashboard = Dashboard(
            log, args.view, live=False, title=f"{flag} ({recording.mode})", advisor=advice_or_none
        )
        display(self.dashboard)
        self._finish(log, args, failure, title=f"{flag} report")
        return value

    # --------------------------------------------------------------------- line
    def _line(self, line: str) -> Any:
        args = _parse(_line_parser(), line)
        command = args.command
        if command == "start":
            if self.recording is not None:
                raise UsageError("%gpuviz: already recording; use %gpuviz stop first")
            self.recording = self.last = run_log(args.run_dir) if args.run_dir else EventLog()
            record_into(self.recording)
            self.recording.mark("gpuviz start")
            if args.live:
                self.dashboard = Dashboard(self.recording, args.view, live=True, title="%gpuviz recording")
                display(self.dashboard)
            return None
        if command == "stop":
            if self.recording is None:
                raise UsageError("%gpuviz: not recording; use %gpuviz start first")
            self.recording.mark("gpuviz stop")
            if self.dashboard is not None and self.dashboard.event_log is self.recording:
                self.dashboard.stop_live()
            record_into(EventLog())  # later work no longer lands in the stopped log
            recording, self.recording = self.recording, None
            try:
                recording.close()  # finishes a --run-dir file; no-op otherwise
            except OSError as exc:  # the file could not be written: the log in memory has every event
                raise UsageError(f"%gpuviz stop: {exc}; %gpuviz show and report still have every event") from exc
            return None
        if command == "status":
            print(self._status())
            return None
        if command == "reset":
            reset()
            print("gpuviz: every array released, every segment returned upstream")
            return None
        if command == "whatif":
            return self._whatif(args)
        if args.align is not None and not (command == "show" and args.path):
            raise UsageError("%gpuviz --align: only for %gpuviz show RUN_DIR (a run directory or .gpuviz-run file)")
        if command == "show" and args.path:
            self._show_file(args.path, args.view, align=args.align)
            return None
        log = self.recording or self.last
        if log is None:
            raise UsageError(f"%gpuviz {command}: nothing recorded yet; run %%gpuviz or %gpuviz start first")
        if command == "show":
            self.dashboard = Dashboard(log, args.view, title="gpuviz", advisor=advice_or_none)
            display(self.dashboard)
            return None
        if not args.path:
            raise UsageError("%gpuviz report: give the HTML file to write, e.g. %gpuviz report run.html")
        _check_writable("report", args.path)
        path = write_report(log, args.path, args.view, cdn=args.cdn)
        print(f"gpuviz: report written to {path}")
        return None

    def _whatif(self, args: argparse.Namespace) -> Any:
        """``%gpuviz whatif [RUN] --policy P ... --capacity C``: the comparison, displayed (and returned)."""
        if args.path:
            from gpuviz.importers import load

            log = load(args.path)
        elif self.last is not None:
            log = self.last
        else:
            raise UsageError("%gpuviz whatif: give a run to replay (a log or trace file), or profile a cell first")
        try:
            return run_whatif(log, args)
        except ValueError as error:
            raise UsageError(f"%gpuviz whatif: {error}") from None

    def _show_file(self, path: str, view: Any, *, align: str | None = None) -> None:
        """``%gpuviz show SRC``: the dashboard of a saved log or an imported trace; of a run
        (a directory or a ``.gpuviz-run`` manifest), its cluster view lined up by ``align``."""

        from gpuviz.base.errors import GpuvizError
        from gpuviz.importers import load

        if Path(path).is_dir() or path.endswith(".gpuviz-run"):  # a run: its cluster view
            from gpuviz.widgets.cluster import show_run

            try:
                self.cluster = show_run(path, view, align=align or "auto")
            except (OSError, GpuvizError, ValueError) as error:
                raise UsageError(f"%gpuviz show: {error}") from None
            display(self.cluster)
            return
        if align is not None:
            raise UsageError(f"%gpuviz show --align: {path} is not a run (a directory or a .gpuviz-run file)")
        try:
            log = load(path)
        except (OSError, GpuvizError) as error:
            raise UsageError(f"%gpuviz show: {error}") from None
        self.dashboard = Dashboard(log, view, title=f"gpuviz: {Path(path).name}", advisor=advice_or_none)
        display(self.dashboard)

    def _status(self) -> str:
        from gpuviz.base.units import format_bytes

        runtime = get_runtime()
        state = "recording" if self.recording is not None else "not recording (use %gpuviz start)"
        lines = [f"gpuviz: {state}; the runtime's log has {len(runtime.log)} events"]
        for name, dev in runtime.devices.items():
            s = dev.allocator.stats()
            lines.append(
                f"  {name}: {format_bytes(s.bytes_in_use)} in use, pool {format_bytes(s.pool_bytes)}"
                f" of {format_bytes(s.bytes_limit)}, peak {format_bytes(s.peak_bytes_in_use)}"
            )
        return "\n".join(lines)


def load_ipython_extension(ipython: Any) -> None:
    import gpuviz.tf  # sets TF_CPU_ALLOCATOR_USE_BFC=true while TensorFlow is not yet imported

    late = gpuviz.tf.cpu_bfc_problem() if "tensorflow" in sys.modules else None
    if late:  # %%gpuviz --tf may then find no CPU memory events: said now, when it can still be fixed
        print(f"%load_ext gpuviz: {late}", file=sys.stderr)
    ipython.register_magics(GpuvizMagics)
    plotly_library()  # plotly.js goes to the front-end now, not with the first dashboard
