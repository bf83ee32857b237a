"""Live capture of TensorFlow memory: ``with gpuviz.tf.record() as rec: ...`` then ``rec.log``.

The block runs under TensorFlow's profiler (``tf.profiler.experimental.start``/``stop``, into a
temporary log directory, or ``logdir`` to keep it for TensorBoard); when it ends, the XSpace
TensorFlow wrote is imported (``gpuviz.importers.xplane``): every decision of TensorFlow's BFC
allocators, on every device, exactly as TensorFlow made them. With ``placement=True`` (the
default) TensorFlow logs where it runs each op (``tf.debugging.set_log_device_placement``);
those lines are taken from the process's output (``gpuviz.tf.output``) and become
``placement`` events of the same log, on the profile's clock; so do the lines in which a BFC
allocator refuses a request (``oom`` events: the profile has no event for them).

On a GPU, TensorFlow's GPU memory always comes from its BFC allocator. On the CPU it does only
when ``TF_CPU_ALLOCATOR_USE_BFC=true`` is in the environment when TensorFlow creates its CPU
allocator (at its first tensor); otherwise the profile holds no memory events. Importing this
module sets it (unless the environment already sets it) when TensorFlow has not been imported
yet, and so do ``%load_ext gpuviz`` and ``gpuviz run``. When it is too late, ``record()``
warns at the start and the log's ``problems`` say why it is empty and what to do.

TensorFlow is imported only when recording starts; ``pip install 'gpuviz[tensorflow]'``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuviz.importers import xplane
from gpuviz.importers.source import NullProgress, Source
from gpuviz.log.eventlog import EventLog
from gpuviz.tf.output import FdTee
from gpuviz.tf.placement import is_kept_line, is_oom_line, is_placement_line, with_log_events

__all__ = ["record", "Recording", "prepare_cpu_bfc", "CPU_BFC_VARIABLE", "cpu_bfc_problem"]

CPU_BFC_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"
_TRUE = ("true", "1")


def prepare_cpu_bfc() -> bool:
    """Make TensorFlow's CPU allocator its BFC (``TF_CPU_ALLOCATOR_USE_BFC=true``) unless the
    environment already names a value; True when TensorFlow will read it (it has not been
    imported yet, or it has been imported but the variable was already true)."""
    os.environ.setdefault(CPU_BFC_VARIABLE, "true")
    return os.environ[CPU_BFC_VARIABLE].lower() in _TRUE


_imported_before = "tensorflow" in sys.modules and os.environ.get(CPU_BFC_VARIABLE) is None
prepare_cpu_bfc()


def cpu_bfc_problem() -> str | None:
    """Why TensorFlow's CPU memory may not be recorded, or None when nothing stands in the way."""
    value = os.environ.get(CPU_BFC_VARIABLE, "")
    if value.lower() not in _TRUE:
        return (
            f"{CPU_BFC_VARIABLE}={value!r}: TensorFlow's CPU allocator is not its BFC, so its profile holds no CPU "
            f"memory events; unset it or set it to true before TensorFlow starts"
        )
    if _imported_before:
        return (
            f"TensorFlow was imported before gpuviz.tf set {CPU_BFC_VARIABLE}=true: it takes effect only if "
            f"TensorFlow had not yet made a tensor; if the recording holds no CPU memory events, restart and "
            f"import gpuviz.tf (or run %load_ext gpuviz) before tensorflow, or set {CPU_BFC_VARIABLE}=true in "
            f"the environment"
        )
    return None


@dataclass
class Recording:
    """What ``record()`` yields: ``mode`` ("gpu" or "cpu") at once; ``log`` when the block ends,
    with ``problems`` (also ``log.problems``): why the log may lack memory events, in words."""

    mode: str
    log: EventLog = field(default_factory=EventLog)
    problems: list[str] = field(default_factory=list)
    xplane: Path | None = None  # the XSpace file, when ``logdir`` keeps it


def _tf() -> Any:
    try:
        import tensorflow as tf
    except ImportError:
        raise ImportError("gpuviz.tf.record needs TensorFlow: pip install 'gpuviz[tensorflow]'") from None
    return tf


@contextmanager
def record(*, placement: bool = True, logdir: str | Path | None = None) -> Iterator[Recording]:
    """Record TensorFlow's memory (and, with ``placement``, its op placement) while the block runs.

    ``logdir``: keep TensorFlow's profile there (``plugins/profile/<run>/<host>.xplane.pb``, what
    TensorBoard opens); by default it goes to a temporary directory, removed after the import.
    The log is built even when the block raises; then the exception propagates. A recording
    without memory events says why in ``Recording.problems`` (and warns).
    """
    prepare_cpu_bfc()
    tf = _tf()
    mode = "gpu" if tf.config.list_physical_devices("GPU") else "cpu"
    recording = Recording(mode)
    late = cpu_bfc_problem() if mode == "cpu" else None
    if late:
        warnings.warn(f"gpuviz.tf: {late}", RuntimeWarning, stacklevel=3)
    temporary = tempfile.TemporaryDirectory(prefix="gpuviz-tf-") if logdir is None else nullcontext(str(logdir))
    with temporary as name:
        folder = Path(name)
        before = set(folder.glob("plugins/profile/*/*.xplane.pb"))
        tee = FdTee(is_kept_line, echo=is_oom_line)
        was_logging = bool(tf.debugging.get_log_device_placement())
        tee.__enter__()
        if placement:
            tf.debugging.set_log_device_placement(True)
        try:
            tf.profiler.experimental.start(str(folder))
        except BaseException:
            _stop_placement(tf, tee, was_logging)
            raise
        try:
            yield recording
        finally:
            try:
                tf.profiler.experimental.stop()
            finally:
                _stop_placement(tf, tee, was_logging)
            _import(recording, folder, before, tee.kept, placement, late, tf.__version__)
            if logdir is None:
                recording.xplane = None  # the temporary folder goes now


def _stop_placement(tf: Any, tee: FdTee, was_logging: bool) -> None:
    try:
        tf.debugging.set_log_device_placement(was_logging)
    finally:
        tee.__exit__(None, None, None)


def _import(
    recording: Recording,
    folder: Path,
    before: set[Path],
    lines: list[str],
    placement: bool,
    late: str | None,
    version: str,
) -> None:
    written = sorted(set(folder.glob("plugins/profile/*/*.xplane.pb")) - before, key=lambda p: p.stat().st_mtime)
    if not written:
        recording.problems.append(f"TensorFlow's profiler wrote no XSpace under {folder}; nothing was recorded")
        log = EventLog()
    else:
        recording.xplane = written[-1]
        log = xplane.read(Source(written[-1]), progress=NullProgress())
    log = with_log_events(log, lines, Source(written[-1]) if written else None)
    memory = int(sum(log.meta.get("source", {}).get("allocators", {}).values()))
    if memory == 0 and written:
        why = late or (
            "TensorFlow allocated nothing through a BFC allocator while the profiler ran (tensors made before the "
            "block and reused are not recorded)"
        )
        recording.problems.append(f"the recording holds no memory events: {why}")
    quiet = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") not in ("", "0")
    if placement and quiet and not any(map(is_placement_line, lines)):
        recording.problems.append(
            "no placement lines: TF_CPP_MIN_LOG_LEVEL hides TensorFlow's INFO log, where placement is written; "
            "set it to 0 to record placement"
        )
    log.meta["live"] = {
        "framework": "tensorflow",
        "version": version,
        "mode": recording.mode,
        "recorded": "TensorFlow's profiler (XSpace): every BFC allocator decision"
        + (", its device-placement log" if placement else "")
        + " and its out-of-memory log lines",
        "problems": list(recording.problems),
    }
    log.problems.extend(recording.problems)
    for problem in recording.problems:
        warnings.warn(f"gpuviz.tf: {problem}", RuntimeWarning, stacklevel=4)
    recording.log = log
