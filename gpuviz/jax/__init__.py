"""Live capture of JAX memory: ``with gpuviz.jax.record() as rec: ...`` then ``rec.log``.

The block runs under JAX's profiler (``jax.profiler.start_trace``/``stop_trace``, into a
temporary log directory, or ``logdir`` to keep it for TensorBoard/XProf). When it ends:

- GPU (and TPU): XLA's BFC allocator writes every allocation and free into the profile's
  XSpace, which is imported (``gpuviz.importers.xplane``): the whole history of the block,
  exact, as for TensorFlow.
- CPU: JAX's CPU client has no BFC allocator and its profile holds no memory events (checked
  with jax 0.10: the XSpace has only host-thread planes). What JAX records there is its
  device memory profile (``jax.profiler.device_memory_profile()``, pprof): the buffers alive
  at one moment with their sizes and Python stacks. It is taken when the block ends and
  imported as a heap at that moment (``gpuviz.importers.jax_memory_profile``): what the
  block left alive, not its history nor its peak. ``log.meta["live"]`` and
  ``Recording.problems`` say which of the two a log is.

``Recording.memory_profile`` keeps the pprof bytes either way (``pprof`` opens them once
written to a file). JAX is imported only when recording starts; ``pip install 'gpuviz[jax]'``.
"""

from __future__ import annotations

import importlib
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

__all__ = ["record", "Recording", "CPU_DIFFERENCE"]

CPU_DIFFERENCE = (
    "JAX on the CPU records no allocator events (its profile's XSpace holds none): what it records is its device "
    "memory profile, taken when the block ended: the buffers alive then (no allocation history, no peak); "
    "on a GPU the profile holds every allocation and free of XLA's BFC allocator"
)


@dataclass
class Recording:
    """What ``record()`` yields: ``mode`` (JAX's default backend: "cpu", "gpu", "tpu") at once;
    ``log``, ``problems`` (also ``log.problems``) and ``memory_profile`` (pprof bytes, or None)
    when the block ends."""

    mode: str
    log: EventLog = field(default_factory=EventLog)
    problems: list[str] = field(default_factory=list)
    memory_profile: bytes | None = None
    xplane: Path | None = None  # the XSpace file, when ``logdir`` keeps it


def _jax() -> Any:
    try:
        import jax
    except ImportError:
        raise ImportError("gpuviz.jax.record needs JAX: pip install 'gpuviz[jax]'") from None
    return jax


@contextmanager
def record(*, logdir: str | Path | None = None, memory_profile: bool = True) -> Iterator[Recording]:
    """Record JAX's memory while the block runs; ``Recording.log`` holds it afterwards.

    ``logdir``: keep JAX's profile there (``plugins/profile/<run>/<host>.xplane.pb``); by default
    a temporary directory, removed after the import. ``memory_profile``: take the device memory
    profile when the block ends (the CPU's only record of memory). The log is built even when
    the block raises; then the exception propagates.
    """
    jax = _jax()
    recording = Recording(str(jax.default_backend()))
    temporary = tempfile.TemporaryDirectory(prefix="gpuviz-jax-") if logdir is None else nullcontext(str(logdir))
    with temporary as name:
        folder = Path(name)
        before = set(folder.glob("plugins/profile/*/*.xplane.pb"))
        jax.profiler.start_trace(str(folder))
        try:
            yield recording
        finally:
            try:
                if memory_profile:
                    recording.memory_profile = bytes(jax.profiler.device_memory_profile())
            finally:
                jax.profiler.stop_trace()
            _import(recording, folder, before, jax.__version__)
            if logdir is None:
                recording.xplane = None  # the temporary folder goes now


def _from_memory_profile(data: bytes) -> EventLog | None:
    try:  # gpuviz's reader of JAX device memory profiles (pprof)
        reader = importlib.import_module("gpuviz.importers.jax_memory_profile")
    except ImportError:
        return None
    log: EventLog = reader.load_jax_memory_profile(data)
    return log


def _import(recording: Recording, folder: Path, before: set[Path], version: str) -> None:
    written = sorted(set(folder.glob("plugins/profile/*/*.xplane.pb")) - before, key=lambda p: p.stat().st_mtime)
    log: EventLog | None = None
    events = 0
    if written:
        recording.xplane = written[-1]
        log = xplane.read(Source(written[-1]), progress=NullProgress())
        events = int(sum(log.meta.get("source", {}).get("allocators", {}).values()))
    recorded = "JAX's profiler (XSpace): every allocator decision"
    if events == 0:
        recorded = "JAX's profiler (XSpace): no memory events"
        profile_log = _from_memory_profile(recording.memory_profile) if recording.memory_profile else None
        if recording.mode == "cpu":
            recording.problems.append(CPU_DIFFERENCE)
        if profile_log is not None:
            log, recorded = profile_log, "JAX's device memory profile at the end of the block (live buffers)"
        elif recording.memory_profile is not None:
            recording.problems.append(
                "the recording holds no memory events: JAX's profile has no allocator events and this gpuviz cannot "
                "read device memory profiles (gpuviz.importers.jax_memory_profile is missing); "
                "Recording.memory_profile has the pprof bytes"
            )
        else:
            recording.problems.append(
                "the recording holds no memory events: JAX's profile has no allocator events; "
                "record with memory_profile=True to get the buffers alive at the end"
            )
    if log is None:
        log, recorded = EventLog(), "nothing"
    log.meta["live"] = {
        "framework": "jax",
        "version": version,
        "mode": recording.mode,
        "recorded": recorded,
        "problems": list(recording.problems),
    }
    log.problems.extend(recording.problems)
    for problem in recording.problems:
        if problem != CPU_DIFFERENCE:
            warnings.warn(f"gpuviz.jax: {problem}", RuntimeWarning, stacklevel=4)
    recording.log = log
