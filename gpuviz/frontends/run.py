"""``gpuviz run [--torch|--tf|--jax|--gpuviz] [-o OUT] [--report HTML] (script.py | -m module) [args...]``.

Runs a Python program in this process, as ``python script.py args`` / ``python -m module args``
would (``sys.argv``, ``sys.path[0]``, ``__main__``), with recording on, and writes its event
log and HTML report when it ends: normally, by ``sys.exit``, by an uncaught exception (an
out-of-memory error included), by Ctrl-C (SIGINT) or SIGTERM. What was recorded is kept; the
report's title, ``log.meta["run_end"]`` and the summary printed at the end say how the program
ended. The exit status is the program's (1 for an exception, 130 for Ctrl-C, 143 for SIGTERM).

The framework: the flag, else the first of torch, tensorflow, jax the program imports
(``gpuviz.frontends.run_recorder``), else gpuviz's own runtime.

Processes: the Python processes the program starts (``torchrun`` workers, ``multiprocessing``
with the spawn or forkserver start method, ``subprocess`` of Python) record too, through a
``sitecustomize`` put on their ``PYTHONPATH`` (``gpuviz/frontends/run_child``). Each writes
its log, when it recorded something, into the run directory (``OUT`` without ``.arrow``; or
``OUT`` itself when it names a directory), named by its launcher rank (``RANK``...) or the next
free number; the program's own process joins them when it recorded memory events. Then the
report is the run's (``gpuviz report DIR``). Forked children (``multiprocessing``'s default
start method on Linux before Python 3.14) are not recorded on their own.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported when a program runs: `gpuviz --help` builds this parser without them
    from gpuviz.frontends.run_recorder import ProcessRecorder
    from gpuviz.log.eventlog import EventLog

__all__ = ["add_run_arguments", "run_command", "Ending", "CHILD_VARIABLE", "write_process_log"]

CHILD_VARIABLE = "GPUVIZ_RUN_CHILDREN"
"""JSON ``{"dir": RUN_DIR, "framework": F, "parent": PID}``: what a child process records, and where."""
_BOOTSTRAP = Path(__file__).resolve().parent / "run_child"


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``gpuviz run`` (everything from the program on is the program's)."""
    group = parser.add_mutually_exclusive_group()
    for name, words in (("torch", "PyTorch's"), ("tf", "TensorFlow's"), ("jax", "JAX's")):
        group.add_argument(f"--{name}", action="store_const", const=name, dest="framework",
                           help=f"record {words} memory (default: the framework the program imports)")  # fmt: skip
    group.add_argument("--gpuviz", action="store_const", const="gpuviz", dest="framework",
                       help="record gpuviz's own device runtime (gpuviz.empty, gpuviz.asarray...)")  # fmt: skip
    parser.add_argument("-o", "--output", help="event log to write (default gpuviz-NAME.arrow); a directory: "
                        "one log per process (a run)")  # fmt: skip
    parser.add_argument("--report", help="HTML report to write (default: the log's name with .html)")
    parser.add_argument("-m", dest="module", action="store_true", help="run a module, as python -m does")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="script.py [args...] (with -m: module [args...])")


@dataclass(frozen=True)
class Ending:
    """How the program ended: ``how`` is "exit", "exception", "interrupted" or "terminated"."""

    how: str
    code: int
    text: str

    def as_meta(self) -> dict[str, Any]:
        return {"how": self.how, "exit_code": self.code, "text": self.text}


class _Terminated(SystemExit):
    """SIGTERM, raised in the program's main thread so that what it recorded is written."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated(128 + signum)


def _print_user_traceback(error: BaseException) -> None:
    """The traceback Python would print for the program: from its own first frame on (no gpuviz, no runpy)."""
    tb = error.__traceback__
    skipped = (__file__, runpy.__file__, "<frozen runpy>")
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in skipped:
        tb = tb.tb_next
    traceback.print_exception(type(error), error, tb)


def run_program(target: str, args: list[str], *, module: bool, keep: list[object] | None = None) -> Ending:
    """Run the program as ``python [-m] target args`` would; how it ended (its traceback printed).

    ``keep`` receives the program's globals (or its exception, whose traceback holds them), so
    that what the program left alive stays alive until the caller lets go, as it does until a
    Python process exits."""
    kept = keep if keep is not None else []
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [target, *args]
    if not module:
        sys.path.insert(0, str(Path(target).resolve().parent))
    else:  # python -m: the current directory first
        sys.path.insert(0, os.getcwd())
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if module:
            kept.append(runpy.run_module(target, run_name="__main__", alter_sys=True))
        else:
            kept.append(runpy.run_path(target, run_name="__main__"))
        return Ending("exit", 0, "exit code 0")
    except BaseException as error:
        kept.append(error)
        return _ending(error)
    finally:
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.argv, sys.path[:] = saved_argv, saved_path


def _ending(error: BaseException) -> Ending:
    """How a program that raised ``error`` ended (its traceback printed, as Python prints it)."""
    if isinstance(error, _Terminated):
        return Ending("terminated", int(error.code or 143), "terminated by SIGTERM")
    if isinstance(error, SystemExit):
        if error.code is None or isinstance(error.code, int):
            code = int(error.code or 0)
            return Ending("exit", code, f"exit code {code}")
        print(error.code, file=sys.stderr)
        return Ending("exit", 1, f"exit code 1 ({error.code})")
    _print_user_traceback(error)
    if isinstance(error, KeyboardInterrupt):
        return Ending("interrupted", 130, "interrupted (KeyboardInterrupt, Ctrl-C)")
    message = " ".join(str(error).split())[:300]
    return Ending("exception", 1, f"exception {type(error).__name__}: {message}".rstrip(": "))


def _outputs(args: argparse.Namespace, name: str) -> tuple[Path, Path | None]:
    """(the log or run directory, the run directory children write to when the output is one file)."""
    if args.output and (args.output.endswith(os.sep) or Path(args.output).is_dir()):
        return Path(args.output), None
    output = Path(args.output or f"gpuviz-{name}.arrow")
    return output, output.with_name(output.name.removesuffix(".arrow") + "-run")


def _clean(folder: Path) -> None:
    """Remove the logs an earlier run left in ``folder`` (only gpuviz's own ``*-rank*.arrow``)."""
    for old in folder.glob("*-rank*.arrow"):
        old.unlink()


def write_process_log(log: EventLog, folder: Path) -> Path:
    """Write this process's log into the run ``folder``: named by its launcher rank, else the next free number."""
    from gpuviz.base.ranks import RankInfo, rank_file_name, rank_from_env

    folder.mkdir(parents=True, exist_ok=True)
    info = rank_from_env()
    launched = any(name in os.environ for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"))
    number = 0
    while True:
        if not launched:
            info = RankInfo(number, number, number + 1, info.host)
        path = folder / rank_file_name(info)
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            break
        except FileExistsError:
            launched = False  # a rank taken twice (a launcher inside the run): the next free number
            number += 1
    log.meta["run"] = info.as_meta()
    log.save(path)
    return path


def _has_memory(log: EventLog) -> bool:
    from gpuviz.log.schema import Kind

    kinds = log["kind"]
    return bool(len(kinds)) and bool(((kinds == int(Kind.ALLOC)) | (kinds == int(Kind.FREE))).any())


def run_command(args: argparse.Namespace) -> int:
    """``gpuviz run``: the program's exit status (after the log, the report and the summary)."""
    from gpuviz.frontends.run_recorder import ProcessRecorder

    if not args.program:
        raise ValueError("gpuviz run: name the program: gpuviz run script.py [args...] or gpuviz run -m module")
    target, program_args = args.program[0], args.program[1:]
    if not args.module and not Path(target).is_file():
        raise FileNotFoundError(2, "no such script", target)
    name = target.rsplit(".", 1)[-1] if args.module else Path(target).stem
    output, children_dir = _outputs(args, name)
    run_dir = output if children_dir is None else children_dir
    if run_dir.is_dir():
        _clean(run_dir)
    framework = args.framework or "auto"
    saved_env = {key: os.environ.get(key) for key in (CHILD_VARIABLE, "PYTHONPATH")}
    os.environ[CHILD_VARIABLE] = json.dumps({"dir": str(run_dir.resolve()), "framework": framework,
                                             "parent": os.getpid()})  # fmt: skip
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(_BOOTSTRAP), saved_env["PYTHONPATH"]) if p)
    recorder = ProcessRecorder(framework)
    alive: list[object] = []  # what the program left alive, kept until the recording ends
    try:
        recorder.start()
        ending = run_program(target, program_args, module=args.module, keep=alive)
    finally:
        log = recorder.stop()
        alive.clear()
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    log.meta["run_end"] = ending.as_meta()
    log.meta["recorded_by"] = {"framework": recorder.framework, "reason": recorder.reason}
    _write(log, args, output, run_dir, children_dir, name, ending, recorder)
    return ending.code


def _write(
    log: EventLog, args: argparse.Namespace, output: Path, run_dir: Path, children_dir: Path | None, name: str,
    ending: Ending, recorder: ProcessRecorder,
) -> None:  # fmt: skip
    from gpuviz.frontends.options import write_report
    from gpuviz.frontends.run_recorder import framework_names
    from gpuviz.frontends.run_summary import summary_lines

    children = sorted(run_dir.glob("*.arrow")) if run_dir.is_dir() else []
    title = f"gpuviz run: {name} ({ending.text})"
    lines = [f"gpuviz run: {name} ended: {ending.text}"]
    lines.append(f"recorded: {framework_names(recorder.framework or 'gpuviz')} ({recorder.reason})")
    if children_dir is None or children:  # a run: one log per process
        if _has_memory(log) or not children:
            write_process_log(log, run_dir)
        else:
            lines.append("this process recorded no memory events: only its child processes are in the run")
        from gpuviz.analysis.cluster import cluster_summary
        from gpuviz.analysis.run import load_run
        from gpuviz.frontends.run_report import write_run_report
        from gpuviz.views.cluster import cluster_text

        run = load_run(run_dir)
        summary = cluster_summary(run)
        if not len(summary.table):  # no process used a GPU: the run's CPUs, not an empty table
            summary = cluster_summary(run, gpus_only=False)
        lines += cluster_text(summary).splitlines()
        report = Path(args.report) if args.report else run_dir.with_name(run_dir.name + ".html")
        write_run_report(run, report, summary=summary, title=title)
        lines.append(f"{len(run)} process logs in {run_dir}/ (gpuviz report {run_dir})")
        lines.append(f"report:    {report}")
    else:
        log.save(output)
        lines += summary_lines(log)
        report = Path(args.report) if args.report else output.with_suffix(".html")
        try:
            write_report(log, report, title=title)
            lines.append(f"event log: {output}\nreport:    {report}")
        except Exception as error:  # the log is saved: say why there is no report
            lines.append(f"event log: {output}\nreport:    not written ({type(error).__name__}: {error})")
    print("\n".join(lines), file=sys.stderr)
