"""What ``gpuviz run`` records in a process: a framework's own memory, or gpuviz's runtime.

``ProcessRecorder(framework)``: ``"torch"``, ``"tf"``, ``"jax"`` start that framework's
recorder (``gpuviz.torch/.tf/.jax.record``) at once; ``"gpuviz"`` records gpuviz's own device
runtime (arrays made with ``gpuviz.empty``/``asarray``); ``"auto"`` watches imports and starts
the recorder of the first of torch, tensorflow or jax the program imports, as soon as that
import completes (an import made while another of them is being imported, e.g. a library that
TensorFlow imports, does not count), and records gpuviz's runtime until then (the log when
none is imported). ``stop()`` ends the recording and returns its log.

The watch is a finder at the front of ``sys.meta_path`` that wraps the loader of those three
top-level modules only; the module is the one the rest of the import system finds, with its
own loader restored once it is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from types import ModuleType
from typing import Any

from gpuviz.log.eventlog import EventLog
from gpuviz.runtime.context import record_from_start

__all__ = ["ProcessRecorder", "FRAMEWORKS", "FRAMEWORK_MODULES", "framework_names"]

FRAMEWORKS = ("torch", "tf", "jax")
FRAMEWORK_MODULES = {"torch": "torch", "tensorflow": "tf", "jax": "jax"}  # top-level module -> framework
_NAMES = {"torch": "PyTorch", "tf": "TensorFlow", "jax": "JAX", "gpuviz": "gpuviz's runtime"}


def framework_names(framework: str) -> str:
    """The framework's name in words."""
    return _NAMES[framework]


class _Loader(importlib.abc.Loader):
    """A module's own loader, with ``done(name)`` called once the module is executed."""

    def __init__(self, loader: Any, done: Callable[[str], None]) -> None:
        self._loader = loader
        self._done = done

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            module.__loader__ = self._loader  # transparent from now on
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader
        self._done(module.__name__)

    def __getattr__(self, name: str) -> Any:  # get_filename, is_package, resource readers...
        return getattr(self._loader, name)


class _ImportWatch(importlib.abc.MetaPathFinder):
    """Calls ``started(framework)`` when the outermost import of a watched framework completes."""

    def __init__(self, modules: dict[str, str], started: Callable[[str], None]) -> None:
        self._modules = modules
        self._started = started
        self._finding = False
        self._loading: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._modules or self._finding:
            return None
        self._finding = True
        try:
            spec: importlib.machinery.ModuleSpec | None = None
            for finder in sys.meta_path:  # the finders after this one decide, as they would without it
                find = getattr(finder, "find_spec", None)
                if finder is not self and find is not None:
                    spec = find(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return None
        self._loading.append(fullname)
        spec.loader = _Loader(spec.loader, self._imported)
        return spec

    def _imported(self, name: str) -> None:
        if self._loading and self._loading[-1] == name:
            self._loading.pop()
        if not self._loading:  # the outermost watched import is complete
            self._started(self._modules[name])


class ProcessRecorder:
    """Records this process (see the module's docstring); ``framework`` is what records once
    known, ``reason`` says why it was chosen."""

    def __init__(self, framework: str = "auto", *, watch: bool = False) -> None:
        """``watch``: even a named framework starts only when the program imports it (child processes)."""
        if framework not in (*FRAMEWORKS, "gpuviz", "auto"):
            raise ValueError(f"framework must be one of torch, tf, jax, gpuviz, auto; not {framework!r}")
        self.requested = framework
        self.framework: str | None = None
        self.reason = ""
        self.recording: Any = None
        self._watch_only = watch
        self._stack = ExitStack()
        self._own = EventLog()
        self._finder: _ImportWatch | None = None
        self.failure: str | None = None  # why the framework's recorder did not start, if it did not

    def start(self) -> None:
        if self.requested in ("tf", "auto"):
            from gpuviz.tf import prepare_cpu_bfc

            prepare_cpu_bfc()  # before the program imports TensorFlow
        if self.requested in ("gpuviz", "auto"):
            record_from_start(self._own)
            if self.requested == "gpuviz":
                self.framework, self.reason = "gpuviz", "--gpuviz"
        if self.requested in FRAMEWORKS and not self._watch_only:
            self._begin(self.requested, f"--{self.requested}")
            return
        if self.requested in ("auto", *FRAMEWORKS):
            watched = {m: f for m, f in FRAMEWORK_MODULES.items() if self.requested in ("auto", f)}
            already = [f for m, f in watched.items() if m in sys.modules]
            if already:  # imported before the program ran (by sitecustomize, say): record it now
                self._begin(already[0], f"{already[0]} was imported before the program started")
                return
            self._finder = _ImportWatch(watched, self._on_import)
            sys.meta_path.insert(0, self._finder)

    def _on_import(self, framework: str) -> None:
        self._unwatch()
        module = next(m for m, f in FRAMEWORK_MODULES.items() if f == framework)
        try:
            self._begin(framework, f"the program imported {module}")
        except Exception as error:  # inside the program's import: it must go on, unrecorded by the framework
            self.failure = f"{framework_names(framework)}'s recorder could not start ({type(error).__name__}: {error})"
            print(f"gpuviz run: {self.failure}", file=sys.stderr)

    def _begin(self, framework: str, reason: str) -> None:
        if self.framework is not None and self.framework != "gpuviz":
            return
        recorder = importlib.import_module(f"gpuviz.{framework}")
        self.recording = self._stack.enter_context(recorder.record())
        self.framework, self.reason = framework, reason

    def _unwatch(self) -> None:
        if self._finder is not None:
            if self._finder in sys.meta_path:
                sys.meta_path.remove(self._finder)
            self._finder = None

    def stop(self) -> EventLog:
        """End the recording and return its log (gpuviz's runtime log when no framework recorded)."""
        self._unwatch()
        with warnings.catch_warnings():  # problems are in the log; the caller says them
            warnings.filterwarnings("ignore", message=r"gpuviz\.(tf|jax): ", category=RuntimeWarning)
            self._stack.close()
        if self.recording is not None:
            log: EventLog = self.recording.log
            return log
        if self.requested in ("auto", "gpuviz"):
            record_from_start(EventLog())  # later work no longer lands in the finished log
        if self.framework is None:
            self.framework = "gpuviz"
            self.reason = self.failure or (
                "the program imported none of torch, tensorflow, jax"
                if self.requested == "auto"
                else f"the program never imported {self.requested}"
            )
        return self._own

    @property
    def problems(self) -> list[str]:
        return list(getattr(self.recording, "problems", []))
