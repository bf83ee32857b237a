"""User call sites: for each recorded stack, the first frame in the user's own code, and its op.

A stack (``log.stacks[i]``, innermost frame first) mostly holds library frames: PyTorch's
``module.py:_call_impl``, ``torch/_tensor.py``, the optimizer's internals. What a user wants to
see is the line of *their* code that asked for the memory. Here each stack gets:

- ``site``: its innermost frame outside the libraries (``LIBRARY``: PyTorch, TensorFlow, Keras,
  JAX, Flax, Optax, CuPy, NumPy, the standard library, anything under ``site-packages`` or
  ``dist-packages``, and gpuviz itself), as ``path:line (function)``; None when every frame is
  a library's (or the stack is empty);
- ``short``: the same as ``file.py:line`` (what sentences show);
- ``op``: the library frame the user's line called (the frame just inside ``site``), or, with
  no user frame, the innermost frame: ``torch/nn/modules/linear.py:125 (forward)``.

``user_code`` (a regular expression, searched in each frame's file name) marks frames as the
user's even inside a library folder (a package of the user's installed in site-packages);
``library`` (one more expression) adds folders to the libraries. The table is a pure function of the log's stacks,
computed once per log and options (``call_sites``) and shared by every caller.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuviz.base.tags import OP_FRAME
from gpuviz.log.eventlog import EventLog, Frame

__all__ = ["CallSites", "LIBRARY", "call_sites", "is_library", "frame_label", "short_label", "NO_STACK"]

LIBRARY = re.compile(
    r"(?:site-packages|dist-packages)/"
    r"|/lib/python\d[\d.]*/"  # the standard library
    r"|/lib/python\d+\.zip/"
    r"|^<frozen |^<built-in>|^<op>$"  # <op>: a profiler's op (base.tags.OP_FRAME)
    r"|(?:^|/)(?:torch|torchvision|torchaudio|functorch|tensorflow|tf_keras|keras|jax|jaxlib|flax|optax|cupy|cupyx"
    r"|cupy_backends|numpy|gpuviz)/"
)
"""File names of library frames (forward slashes; ``\\`` is read as ``/``)."""

NO_STACK = "(no stack recorded)"
"""What grouping by call site calls allocations without a stack."""


def is_library(filename: str, *, user_code: str | re.Pattern[str] | None = None,
               library: str | re.Pattern[str] | None = None) -> bool:  # fmt: skip
    """Whether a frame in ``filename`` belongs to a library (see the module docstring)."""
    path = filename.replace("\\", "/")
    if user_code is not None and re.search(user_code, path):
        return False
    return bool(LIBRARY.search(path)) or (library is not None and bool(re.search(library, path)))


_TRIM = re.compile(r".*(?:site-packages|dist-packages|/lib/python\d[\d.]*)/")
_PACKAGE = re.compile(
    r".*?/(?=(?:torch|tensorflow|keras|jax|jaxlib|flax|optax|cupy|cupyx|numpy|gpuviz)/)"
)  # fmt: skip


def _trimmed(filename: str) -> str:
    """A library file's path from its package (``torch/nn/modules/linear.py``)."""
    path = filename.replace("\\", "/")
    trimmed = _TRIM.sub("", path, count=1)
    return trimmed if trimmed != path else _PACKAGE.sub("", path, count=1)


def frame_label(frame: Frame, *, library: bool = False) -> str:
    """``path:line (function)``; a library's path from its package down; a profiler's op: its name."""
    if frame.filename == OP_FRAME:
        return frame.function
    path = _trimmed(frame.filename) if library else frame.filename
    return f"{path}:{frame.lineno} ({frame.function})"


def short_label(frame: Frame) -> str:
    """``file.py:line``: the file's base name and the line; a profiler's op: its name."""
    if frame.filename == OP_FRAME:
        return frame.function
    return f"{frame.filename.replace(chr(92), '/').rsplit('/', 1)[-1]}:{frame.lineno}"


@dataclass(frozen=True)
class CallSites:
    """Per stack id of a log: its user frame's position and labels (None where there is none)."""

    user_frame: np.ndarray  # int64 per stack: index of the user frame in the stack, -1: none
    site: np.ndarray  # object per stack: "path:line (function)" of the user frame, or None
    short: np.ndarray  # object per stack: "file.py:line" of the user frame, or None
    op: np.ndarray  # object per stack: the library frame the user's line called, or None
    op_short: np.ndarray  # object per stack: ``op`` as ``file.py:line`` (a profiler's op: its name)
    user_code: str | None = None

    def _pick(self, table: np.ndarray, stacks: np.ndarray | Sequence[int]) -> np.ndarray:
        ids = np.asarray(stacks, dtype=np.int64)
        padded = np.empty(len(table) + 1, dtype=object)  # -1 (no stack) picks the trailing None
        padded[:-1] = table
        picked: np.ndarray = padded[np.where((ids >= 0) & (ids < len(table)), ids, -1)]
        return picked

    def sites_of(self, stacks: np.ndarray | Sequence[int]) -> np.ndarray:
        """The user call site (``path:line (function)``) of each stack id; None for none."""
        return self._pick(self.site, stacks)

    def shorts_of(self, stacks: np.ndarray | Sequence[int]) -> np.ndarray:
        """``file.py:line`` of each stack id's user frame; None for none."""
        return self._pick(self.short, stacks)

    def ops_of(self, stacks: np.ndarray | Sequence[int]) -> np.ndarray:
        """The op (library frame beneath the user's line) of each stack id; None for none."""
        return self._pick(self.op, stacks)

    def named_of(self, stacks: np.ndarray | Sequence[int]) -> np.ndarray:
        """``shorts_of``, else (a stack all in libraries, a profiler's ops) the op's short name."""
        shorts = self.shorts_of(stacks)
        ops = self._pick(self.op_short, stacks)
        named: np.ndarray = np.where(shorts != None, shorts, ops)  # noqa: E711 (elementwise)
        return named

    def labels_of(self, stacks: np.ndarray | Sequence[int]) -> np.ndarray:
        """``label`` of each stack id (computed per stack of the table, then picked per id)."""
        labels: np.ndarray = np.where(self.site != None, self.site, self.op)  # noqa: E711 (elementwise)
        return self._pick(labels.astype(object), stacks)

    def label(self, stack: int) -> str | None:
        """The user call site of ``stack``, else its op (a stack all in libraries), else None."""
        if not 0 <= stack < len(self.site):
            return None
        site = self.site[stack]
        return str(site) if site is not None else (None if self.op[stack] is None else str(self.op[stack]))


def _compute(stacks: Sequence[tuple[Frame, ...]], user_code: str | None, library: str | None) -> CallSites:
    n = len(stacks)
    user_frame = np.full(n, -1, dtype=np.int64)
    site = np.full(n, None, dtype=object)
    short = np.full(n, None, dtype=object)
    op = np.full(n, None, dtype=object)
    op_short = np.full(n, None, dtype=object)
    verdicts: dict[str, bool] = {}  # file name -> library?
    for i, frames in enumerate(stacks):
        for position, frame in enumerate(frames):
            lib = verdicts.get(frame.filename)
            if lib is None:
                lib = verdicts[frame.filename] = is_library(frame.filename, user_code=user_code, library=library)
            if not lib:
                user_frame[i] = position
                site[i] = frame_label(frame)
                short[i] = short_label(frame)
                if position:
                    op[i] = frame_label(frames[position - 1], library=True)
                    op_short[i] = short_label(frames[position - 1])
                break
        else:
            if frames:
                op[i] = frame_label(frames[0], library=True)
                op_short[i] = short_label(frames[0])
    return CallSites(user_frame, site, short, op, op_short, user_code)


_CACHE: weakref.WeakKeyDictionary[EventLog, dict[tuple[str | None, str | None], CallSites]] = (
    weakref.WeakKeyDictionary()
)
_LOCK = threading.Lock()


def _joined(old: CallSites, new: CallSites) -> CallSites:
    def both(name: str) -> np.ndarray:
        joined: np.ndarray = np.concatenate([getattr(old, name), getattr(new, name)])
        return joined

    return CallSites(both("user_frame"), both("site"), both("short"), both("op"), both("op_short"), old.user_code)


def call_sites(log: EventLog, *, user_code: str | None = None, library: str | None = None) -> CallSites:
    """The ``CallSites`` of ``log``'s stack table, computed once per log and options (a log that
    grows gets only its new stacks computed).

    ``user_code``: a regular expression; frames whose file name it matches are the user's.
    ``library``: a regular expression adding library folders. ``ValueError`` names a bad expression.
    """
    for name, pattern in (("user_code", user_code), ("library", library)):
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{name} {pattern!r} is not a regular expression: {exc}") from None
    key = (user_code, library)
    count = len(log.stacks)
    with _LOCK:
        cached = _CACHE.get(log, {}).get(key)
    if cached is not None and len(cached.site) == count:
        return cached
    done = len(cached.site) if cached is not None and len(cached.site) < count else 0
    fresh = _compute(log.stacks[done:count], user_code, library)
    result = _joined(cached, fresh) if done and cached is not None else fresh
    with _LOCK:
        _CACHE.setdefault(log, {})[key] = result
    return result
