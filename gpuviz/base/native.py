"""The registry of gpuviz's native (C) modules: which exist, what each speeds up, and whether
this process uses it.

Every C extension is optional: where one could not be built (no C compiler, or the Python
headers missing) gpuviz runs its Python twin, which gives the same results more slowly.
This module is the one place that says, for each of them:

    loaded          built and imported; used
    not built       the build skipped it; the reason comes from the build record that
                    ``setup.py``'s ``build_ext`` writes (``_native_build.json`` here)
    failed to load  built, but importing it raised (the ImportError's text)
    disabled        ``GPUVIZ_NATIVE=0``: the explicit opt-out, every switchable module
                    runs its Python twin (the two storage modules, ``switchable=False``,
                    are used all the same)

``import gpuviz`` calls ``warn_problems()``: one ``RuntimeWarning`` naming each module that
was not built or failed to load, and why (none with ``GPUVIZ_NATIVE=0``). The environment
variable ``GPUVIZ_NATIVE_SKIP=NAME[,NAME]`` makes the registry treat those modules as not
built, so that a test can run gpuviz as it runs where they failed to build.

A module not built is told by its missing file; one that is there is imported (with its
package) to tell whether it loads.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

__all__ = [
    "BUILD_RECORD",
    "MODULES",
    "NativeModule",
    "NativeStatus",
    "available",
    "disabled",
    "load",
    "problems",
    "status",
    "statuses",
    "warn_problems",
    "why_not",
]

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # gpuviz/
BUILD_RECORD = Path(__file__).resolve().with_name("_native_build.json")  # written by setup.py's build_ext


@dataclass(frozen=True)
class NativeModule:
    """A C extension of gpuviz: its import ``name``, what it speeds up (``speeds_up``), and
    whether ``GPUVIZ_NATIVE=0`` switches it off (``switchable``)."""

    name: str
    speeds_up: str
    switchable: bool = True


MODULES: tuple[NativeModule, ...] = (
    NativeModule("gpuviz.capture._bfcnative", "the BFC allocator's hot path (gpuviz.BFCAllocator)"),
    NativeModule("gpuviz.capture._pluggable", "PyTorch on gpuviz's BFC (gpuviz.torch.pluggable)"),
    NativeModule(
        "gpuviz.log._staging", "event-log storage: rows kept in huge-page chunks, split into columns", switchable=False
    ),
    NativeModule("gpuviz.log._batchwriter", "event-log files written off the recording thread", switchable=False),
    NativeModule("gpuviz.log._heapcore", "rebuilding heaps from imported traces (HeapBuilder)"),
    NativeModule("gpuviz.importers._snapshotpickle", "reading PyTorch snapshot pickles"),
    NativeModule("gpuviz.importers._xplanewire", "decoding TensorFlow/JAX XPlane memory events"),
    NativeModule("gpuviz.scenarios._whatifcore", "what-if replays under every policy"),
    NativeModule("gpuviz.analysis._replaykernel", "replaying long logs: heap maps, scrub frames, allocation tables"),
    NativeModule("gpuviz.analysis._livekernel", "live views following a recording"),
)
_BY_NAME = {module.name: module for module in MODULES}
# packages whose __init__ imports nothing heavy: import gpuviz loads their native modules to check them
_LIGHT_PACKAGES = frozenset({"gpuviz.capture", "gpuviz.log", "gpuviz.importers", "gpuviz.analysis"})


@dataclass(frozen=True)
class NativeStatus:
    """Where a native module stands in this process: ``state`` is ``"loaded"``, ``"not built"``,
    ``"failed to load"`` or ``"disabled"``; ``reason`` says why (empty when loaded)."""

    module: NativeModule
    state: str
    reason: str

    @property
    def used(self) -> bool:
        return self.state == "loaded"

    @property
    def problem(self) -> bool:
        """Whether gpuviz warns about it: not built or failed to load, and not switched off."""
        return self.state in ("not built", "failed to load")


_loaded: dict[str, ModuleType | str] = {}  # name -> module, or why it could not be imported
_warned: set[str] = set()


def disabled() -> bool:
    """Whether ``GPUVIZ_NATIVE=0`` switches the native modules off."""
    return os.environ.get("GPUVIZ_NATIVE", "1") == "0"


def _skipped(name: str) -> bool:
    return name in {part.strip() for part in os.environ.get("GPUVIZ_NATIVE_SKIP", "").split(",")}


def _module(name: str) -> NativeModule:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"{name} is not one of gpuviz's native modules: {', '.join(_BY_NAME)}") from None


def _file(name: str) -> Path | None:
    """The compiled file of module ``name``, or None where it was not built."""
    *packages, stem = name.split(".")[1:]
    folder = _PACKAGE_DIR.joinpath(*packages)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = folder / (stem + suffix)
        if path.is_file():
            return path
    return None


def _build_record() -> dict[str, str]:
    """Module name -> why the build skipped it, from the record ``build_ext`` wrote."""
    try:
        record = json.loads(BUILD_RECORD.read_text())
    except (OSError, ValueError):
        return {}
    failed = record.get("failed", {}) if isinstance(record, dict) else {}
    return {str(name): str(reason) for name, reason in failed.items()} if isinstance(failed, dict) else {}


def _not_built_reason(name: str) -> str:
    if _skipped(name):
        return "skipped by GPUVIZ_NATIVE_SKIP"
    reason = _build_record().get(name)
    if reason:
        return reason
    if BUILD_RECORD.is_file():
        return "its compiled file is missing (the build recorded no failure)"
    return "gpuviz was installed without building its C extensions"


def _probe(name: str) -> ModuleType | str:
    """Import module ``name`` (once): the module, or why it cannot be imported."""
    if name in _loaded:
        return _loaded[name]
    if _file(name) is None:
        return "not built"
    try:
        _loaded[name] = importlib.import_module(name)
    except ImportError as error:
        _loaded[name] = f"{type(error).__name__}: {error}"
    return _loaded[name]


def status(name: str) -> NativeStatus:
    """Where the native module ``name`` stands (see the module docstring); loads it to find out."""
    module = _module(name)
    if _skipped(name):
        return NativeStatus(module, "not built", _not_built_reason(name))
    if module.switchable and disabled():
        return NativeStatus(module, "disabled", "GPUVIZ_NATIVE=0")
    probed = _probe(name)
    if isinstance(probed, ModuleType):
        return NativeStatus(module, "loaded", "")
    if probed == "not built":
        return NativeStatus(module, "not built", _not_built_reason(name))
    return NativeStatus(module, "failed to load", probed)


def statuses() -> list[NativeStatus]:
    """Every native module's status, in ``MODULES`` order."""
    return [status(module.name) for module in MODULES]


def problems() -> list[NativeStatus]:
    """The native modules that were not built or failed to load (none are with ``GPUVIZ_NATIVE=0``)."""
    if disabled():
        return []
    return [entry for entry in statuses() if entry.problem]


def load(name: str) -> ModuleType | None:
    """The native module ``name`` imported, or None where it was not built or failed to load
    (whatever ``GPUVIZ_NATIVE`` says: ``available`` is the switch). A module that fails to load
    here is warned about (``warn_problems``)."""
    _module(name)
    if _skipped(name):
        return None
    first = name not in _loaded
    probed = _probe(name)
    if isinstance(probed, ModuleType):
        return probed
    if first and probed != "not built":
        _warn([status(name)])
    return None


def available(name: str) -> bool:
    """Whether gpuviz uses the native module ``name`` now: built, loaded, and not switched off
    (``GPUVIZ_NATIVE=0``; read at each call)."""
    module = _module(name)
    if module.switchable and disabled():
        return False
    return load(name) is not None


def why_not(name: str) -> str:
    """Why gpuviz does not use the native module ``name``, in words: ``"GPUVIZ_NATIVE=0"``, or
    its state and reason (``"not built: no C compiler ..."``); empty when it is used."""
    entry = status(name)
    if entry.used:
        return ""
    return entry.reason if entry.state == "disabled" else f"{entry.state}: {entry.reason}"


def warn_problems() -> None:
    """One ``RuntimeWarning`` naming each native module not built or failed to load and why;
    each module is named once per process. Silent with ``GPUVIZ_NATIVE=0``.

    Called by ``import gpuviz``: a module whose package is light to import is loaded to find
    out; the others (``gpuviz.scenarios``, whose package imports the what-if code) are only
    looked for, and warned about when first loaded if they then fail."""
    if disabled():
        return
    found = []
    for module in MODULES:
        package = module.name.rpartition(".")[0]
        if package in _LIGHT_PACKAGES or package in sys.modules or _skipped(module.name) or not _file(module.name):
            found.append(status(module.name))
    _warn([entry for entry in found if entry.problem])


def _warn(entries: list[NativeStatus]) -> None:
    fresh = [entry for entry in entries if entry.module.name not in _warned]
    if not fresh or disabled():
        return
    _warned.update(entry.module.name for entry in fresh)
    lines = "\n".join(f"  {e.module.name} ({e.module.speeds_up}): {e.state}: {e.reason}" for e in fresh)
    warnings.warn(
        f"gpuviz runs {len(fresh)} of its native modules as pure Python (same results, slower):\n{lines}\n"
        "Rebuild gpuviz with a C compiler and the Python headers to get them (`gpuviz info` lists every module); "
        "GPUVIZ_NATIVE=0 selects pure Python without this warning.",
        RuntimeWarning,
        stacklevel=4,
    )
