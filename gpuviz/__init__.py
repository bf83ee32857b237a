"""gpuviz: a Jupyter-integrated GPU memory profiler and visualizer.

Data flows one way: capture (allocators, upstreams) -> log (EventLog) -> analysis
(replay, timelines) -> views -> front-ends (CLI, magics, widgets, reports).
"""

import gpuviz.views.comparison
import gpuviz.views.static  # noqa: F401 - registers the rich display of EventLog
from gpuviz import config
from gpuviz import dask as dask  # gpuviz.dask.profile_run(): Dask is imported only when a client is given
from gpuviz import torch as torch  # gpuviz.torch.record(): PyTorch is imported only when recording starts
from gpuviz._version import __version__ as __version__
from gpuviz.analysis.cluster import ClusterSummary, cluster_summary
from gpuviz.analysis.explain import explain
from gpuviz.analysis.replay import Replay, replay
from gpuviz.analysis.run import Run, load_run
from gpuviz.analysis.timeline import internal_waste, peak, resample, timeline_series
from gpuviz.base.devices import DeviceSpec, parse_device
from gpuviz.base.errors import GpuvizError, InvalidFreeError, InvariantError, LogFormatError, OutOfMemoryError
from gpuviz.base.heapstate import ChunkState, HeapState, SegmentState
from gpuviz.base.units import format_bytes, parse_bytes
from gpuviz.capture.bfc import AllocatorStats, BFCAllocator
from gpuviz.capture.marks import activate, current_log, default_log, mark, span
from gpuviz.capture.upstream import SIM_BASE, SimUpstream, Upstream, UpstreamOutOfMemory
from gpuviz.importers import load
from gpuviz.log.eventlog import Event, EventLog
from gpuviz.runtime.array import DeviceArray, asarray, empty
from gpuviz.runtime.context import Session, device, reconfigure, record_into, record_run, reset
from gpuviz.scenarios import advise, whatif


def show_run(source: str, *, threshold: float = 0.1, align: str = "auto") -> object:
    """The notebook view of the run in directory (or glob, or run manifest) ``source``: the ranks
    x time heatmap, the per-rank table, and a rank's full views on selection
    (``gpuviz.widgets.cluster``); ``align``: ``"auto"``, ``"clock"`` or ``"start"``."""
    from gpuviz.widgets.cluster import show_run as show

    return show(source, threshold=threshold, align=align)


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext gpuviz``: registers the ``%gpuviz`` / ``%%gpuviz`` magics."""
    from gpuviz.frontends.magics import load_ipython_extension as load

    load(ipython)


def __getattr__(name: str) -> object:
    """``gpuviz.tf`` and ``gpuviz.jax``, imported when first used: importing ``gpuviz.tf`` sets
    ``TF_CPU_ALLOCATOR_USE_BFC=true`` while TensorFlow is not imported, which ``import gpuviz``
    alone does not do."""
    if name in ("tf", "jax"):
        import importlib

        return importlib.import_module(f"gpuviz.{name}")
    raise AttributeError(f"module 'gpuviz' has no attribute {name!r}")


__all__ = [
    "AllocatorStats",
    "DeviceArray",
    "DeviceSpec",
    "Session",
    "asarray",
    "empty",
    "config",
    "device",
    "parse_device",
    "reconfigure",
    "record_into",
    "record_run",
    "Run",
    "load_run",
    "show_run",
    "ClusterSummary",
    "cluster_summary",
    "reset",
    "BFCAllocator",
    "ChunkState",
    "Event",
    "EventLog",
    "GpuvizError",
    "HeapState",
    "InvalidFreeError",
    "InvariantError",
    "LogFormatError",
    "OutOfMemoryError",
    "Replay",
    "SIM_BASE",
    "SegmentState",
    "SimUpstream",
    "Upstream",
    "UpstreamOutOfMemory",
    "activate",
    "current_log",
    "default_log",
    "format_bytes",
    "internal_waste",
    "load",
    "mark",
    "parse_bytes",
    "peak",
    "replay",
    "resample",
    "span",
    "timeline_series",
    "whatif",
    "advise",
    "explain",
]
