"""Live capture of PyTorch memory: ``with gpuviz.torch.record() as rec: ...`` then ``rec.log``.

On CUDA (``torch.cuda.is_available()``) it records PyTorch's caching allocator with
``torch.cuda.memory._record_memory_history`` and imports the snapshot taken at the end
(``gpuviz.importers.torch_snapshot``): every segment, block and call stack of the GPU.
On the CPU it runs ``torch.profiler.profile(profile_memory=True)``, exports the Chrome trace
and imports its ``[memory]`` events (``gpuviz.importers.torch_profiler``): every CPU
allocation and free with its address and bytes. Either way the result is an ordinary
EventLog that every view, the dashboard and the report show.

PyTorch is imported only when recording starts; ``pip install torch`` is the user's choice.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuviz.importers import torch_profiler
from gpuviz.importers.source import NullProgress, Source
from gpuviz.log.eventlog import EventLog

__all__ = ["record", "Recording", "DEFAULT_MAX_ENTRIES"]

DEFAULT_MAX_ENTRIES = 100_000  # CUDA: allocator events kept by PyTorch's ring buffer


@dataclass
class Recording:
    """What ``record()`` yields: ``mode`` ("cuda" or "cpu") at once, ``log`` when the block ends."""

    mode: str
    log: EventLog = field(default_factory=EventLog)


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError("gpuviz.torch.record needs PyTorch: pip install torch") from None
    return torch


@contextmanager
def record(*, cuda: bool | None = None, max_entries: int = DEFAULT_MAX_ENTRIES) -> Iterator[Recording]:
    """Record PyTorch's memory while the block runs; ``Recording.log`` holds it afterwards.

    ``cuda``: None records the GPU when ``torch.cuda.is_available()``, else the CPU; True
    requires CUDA (``RuntimeError`` without it), False records the CPU allocator with the
    profiler. ``max_entries``: CUDA only, how many allocator events PyTorch keeps (older ones
    are dropped; what they left alive is seeded from the snapshot's segments). The log is
    built even when the block raises, then the exception propagates.
    """
    torch = _torch()
    available = bool(torch.cuda.is_available())
    if cuda and not available:
        raise RuntimeError("record(cuda=True): PyTorch sees no CUDA device (torch.cuda.is_available() is False)")
    use_cuda = available if cuda is None else cuda
    if max_entries < 1:
        raise ValueError(f"max_entries must be >= 1, got {max_entries}")
    recording = Recording("cuda" if use_cuda else "cpu")
    if use_cuda:
        with _cuda_history(torch, recording, max_entries):
            yield recording
    else:
        with _cpu_profile(torch, recording):
            yield recording


@contextmanager
def _cuda_history(torch: Any, recording: Recording, max_entries: int) -> Iterator[None]:
    from gpuviz.importers.torch_snapshot import from_snapshot

    memory = torch.cuda.memory
    memory._record_memory_history(max_entries=max_entries)
    try:
        yield
    finally:
        try:
            snapshot = memory._snapshot()
        finally:
            memory._record_memory_history(enabled=None)
        recording.log = from_snapshot(snapshot, file="live: torch.cuda.memory._snapshot()", version=torch.__version__)


@contextmanager
def _cpu_profile(torch: Any, recording: Recording) -> Iterator[None]:
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
    profiler.__enter__()
    try:
        yield
    finally:
        profiler.__exit__(None, None, None)
        with tempfile.TemporaryDirectory(prefix="gpuviz-torch-") as folder:
            path = Path(folder) / "trace.json"
            profiler.export_chrome_trace(str(path))
            log = torch_profiler.read(Source(path), progress=NullProgress())
        log.meta["source"]["file"] = "live: torch.profiler.profile(profile_memory=True)"
        log.meta["source"]["torch"] = torch.__version__
        recording.log = log
