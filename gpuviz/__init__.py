"""gpuviz: a Jupyter-integrated GPU memory profiler and visualizer.

Data flows one way: capture (allocators, upstreams) -> log (EventLog) -> analysis
(replay, timelines) -> views -> front-ends (CLI, magics, widgets, reports).

``import gpuviz`` is light: each public name is imported when first used (``__getattr__``),
so a process that only records never loads the plotting and notebook libraries (plotly,
pandas, ipywidgets, anywidget, IPython); they load when a view is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpuviz._version import __version__ as __version__
from gpuviz.base import display as _display
from gpuviz.base import native as _native

if TYPE_CHECKING:
    from gpuviz import config as config
    from gpuviz import dask as dask
    from gpuviz import jax as jax
    from gpuviz import tf as tf
    from gpuviz import torch as torch
    from gpuviz.analysis.cluster import ClusterSummary as ClusterSummary
    from gpuviz.analysis.cluster import cluster_summary
    from gpuviz.analysis.explain import explain
    from gpuviz.analysis.replay import Replay as Replay
    from gpuviz.analysis.replay import replay
    from gpuviz.analysis.run import Run as Run
    from gpuviz.analysis.run import load_run
    from gpuviz.analysis.timeline import internal_waste as internal_waste
    from gpuviz.analysis.timeline import peak, timeline_series
    from gpuviz.analysis.timeline import resample as resample
    from gpuviz.base.devices import DeviceSpec as DeviceSpec
    from gpuviz.base.devices import parse_device
    from gpuviz.base.errors import (
        GpuvizError,
        InvalidFreeError,
        LogFormatError,
        OutOfMemoryError,
    )
    from gpuviz.base.errors import (
        InvariantError as InvariantError,
    )
    from gpuviz.base.heapstate import ChunkState as ChunkState
    from gpuviz.base.heapstate import HeapState as HeapState
    from gpuviz.base.heapstate import SegmentState as SegmentState
    from gpuviz.base.units import format_bytes, parse_bytes
    from gpuviz.capture.bfc import AllocatorStats as AllocatorStats
    from gpuviz.capture.marks import activate, current_log, default_log, mark, span
    from gpuviz.capture.native import BFCAllocator
    from gpuviz.capture.upstream import (
        SIM_BASE as SIM_BASE,
    )
    from gpuviz.capture.upstream import (
        SimUpstream,
    )
    from gpuviz.capture.upstream import (
        Upstream as Upstream,
    )
    from gpuviz.capture.upstream import (
        UpstreamOutOfMemory as UpstreamOutOfMemory,
    )
    from gpuviz.frontends.options import report
    from gpuviz.importers import load
    from gpuviz.log.eventlog import Event as Event
    from gpuviz.log.eventlog import EventLog
    from gpuviz.runtime.array import DeviceArray, asarray, empty
    from gpuviz.runtime.context import Session, device, reconfigure, record_into, record_run, reset
    from gpuviz.scenarios.advise import advise
    from gpuviz.scenarios.whatif import whatif

# What users call: name -> the module it comes from (imported when the name is first used).
_PUBLIC = {
    "BFCAllocator": "gpuviz.capture.native",  # the native allocator wherever it was built
    "SimUpstream": "gpuviz.capture.upstream",
    "EventLog": "gpuviz.log.eventlog",
    "load": "gpuviz.importers",
    "replay": "gpuviz.analysis.replay",
    "peak": "gpuviz.analysis.timeline",
    "timeline_series": "gpuviz.analysis.timeline",
    "whatif": "gpuviz.scenarios.whatif",
    "advise": "gpuviz.scenarios.advise",
    "explain": "gpuviz.analysis.explain",
    "report": "gpuviz.frontends.options",
    "load_run": "gpuviz.analysis.run",
    "cluster_summary": "gpuviz.analysis.cluster",
    "mark": "gpuviz.capture.marks",
    "span": "gpuviz.capture.marks",
    "activate": "gpuviz.capture.marks",
    "current_log": "gpuviz.capture.marks",
    "default_log": "gpuviz.capture.marks",
    "DeviceArray": "gpuviz.runtime.array",
    "asarray": "gpuviz.runtime.array",
    "empty": "gpuviz.runtime.array",
    "Session": "gpuviz.runtime.context",
    "device": "gpuviz.runtime.context",
    "reconfigure": "gpuviz.runtime.context",
    "record_into": "gpuviz.runtime.context",
    "record_run": "gpuviz.runtime.context",
    "reset": "gpuviz.runtime.context",
    "parse_device": "gpuviz.base.devices",
    "format_bytes": "gpuviz.base.units",
    "parse_bytes": "gpuviz.base.units",
    "GpuvizError": "gpuviz.base.errors",
    "InvalidFreeError": "gpuviz.base.errors",
    "LogFormatError": "gpuviz.base.errors",
    "OutOfMemoryError": "gpuviz.base.errors",
}
# Importable from gpuviz for compatibility, not in ``__all__``: each lives in its module.
_COMPAT = {
    "AllocatorStats": "gpuviz.capture.bfc",
    "ChunkState": "gpuviz.base.heapstate",
    "ClusterSummary": "gpuviz.analysis.cluster",
    "DeviceSpec": "gpuviz.base.devices",
    "Event": "gpuviz.log.eventlog",
    "HeapState": "gpuviz.base.heapstate",
    "InvariantError": "gpuviz.base.errors",
    "Replay": "gpuviz.analysis.replay",
    "Run": "gpuviz.analysis.run",
    "SIM_BASE": "gpuviz.capture.upstream",
    "SegmentState": "gpuviz.base.heapstate",
    "Upstream": "gpuviz.capture.upstream",
    "UpstreamOutOfMemory": "gpuviz.capture.upstream",
    "internal_waste": "gpuviz.analysis.timeline",
    "resample": "gpuviz.analysis.timeline",
}
# gpuviz.dask.profile_run(), gpuviz.torch.record(), gpuviz.tf.record(), gpuviz.jax.record(), gpuviz.config;
# importing gpuviz.tf sets TF_CPU_ALLOCATOR_USE_BFC=true while TensorFlow is not imported, which
# ``import gpuviz`` alone never does
_SUBMODULES = ("config", "dask", "torch", "tf", "jax")


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name) or _COMPAT.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"gpuviz.{name}")
    else:
        raise AttributeError(f"module 'gpuviz' has no attribute {name!r}")
    globals()[name] = value  # later uses skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC, *_COMPAT, *_SUBMODULES})


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


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the prebuilt JupyterLab extension lies in a source checkout (``jupyter labextension
    develop``); installed packages ship it under ``share/jupyter/labextensions``."""
    return [{"src": "../labextension/dist", "dest": "gpuviz-labextension"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """The Jupyter server extension: the route that turns saved logs into results."""
    return [{"module": "gpuviz.frontends.labserver"}]


# An EventLog or a what-if Comparison displays through the views, imported at the first display.
_display.defer("EventLog", "gpuviz.views.static")
_display.defer("Comparison", "gpuviz.views.comparison")

__all__ = [
    "BFCAllocator",
    "DeviceArray",
    "EventLog",
    "GpuvizError",
    "InvalidFreeError",
    "LogFormatError",
    "OutOfMemoryError",
    "Session",
    "SimUpstream",
    "activate",
    "asarray",
    "cluster_summary",
    "config",
    "current_log",
    "dask",
    "default_log",
    "device",
    "empty",
    "format_bytes",
    "load",
    "load_run",
    "mark",
    "parse_bytes",
    "parse_device",
    "peak",
    "reconfigure",
    "record_into",
    "record_run",
    "replay",
    "report",
    "reset",
    "show_run",
    "span",
    "timeline_series",
    "torch",
    "tf",
    "jax",
    "whatif",
    "advise",
    "explain",
]

_native.warn_problems()  # native modules that were not built or failed to load, once
