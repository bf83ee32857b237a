"""Capture what TensorFlow's C++ code prints while a block runs: its placement log.

``tf.debugging.set_log_device_placement(True)`` makes TensorFlow write one line per op it
runs (``Executing op MatMul in device /job:localhost/.../device:CPU:0``) and per graph node
it places, through absl logging to file descriptor 2; the graph placer also prints each
node to file descriptor 1. Python's ``sys.stderr`` never sees those lines, so they are taken
at the descriptors: ``FdTee`` puts a pipe on each, a thread reads it, keeps the lines
``keep`` selects, and passes every other line on to where the descriptor pointed before, as
it is written (a user still sees their own output and TensorFlow's warnings).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from collections.abc import Callable
from types import TracebackType

__all__ = ["FdTee"]

_DRAIN_S = 5.0
"""How long closing waits for the output already written to be read (seconds); longer only when
a child process started during the block still holds the pipe."""


def _flush_c_streams() -> None:
    """Flush C's stdio buffers (the placer's ``std::cout`` lines), so they go through the pipe."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


class _Pipe:
    """One descriptor redirected into a pipe read by a thread."""

    def __init__(self, fd: int, keep: Callable[[str], bool], echo: Callable[[str], bool], kept: list[str]) -> None:
        self.fd = fd
        self.saved = os.dup(fd)  # where the descriptor pointed: lines not kept go there
        read, write = os.pipe()
        os.dup2(write, fd)
        os.close(write)
        self._read = read
        self._keep = keep
        self._echo = echo
        self._kept = kept
        self._thread = threading.Thread(target=self._pump, name=f"gpuviz-fd{fd}", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        pending = b""
        with os.fdopen(self._read, "rb", buffering=0) as pipe:
            while chunk := pipe.read(1 << 16):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                self._route(lines, newline=True)
        if pending:
            self._route([pending], newline=False)

    def _route(self, lines: list[bytes], *, newline: bool) -> None:
        passed = []
        for raw in lines:
            text = raw.decode("utf-8", errors="replace")
            if self._keep(text):
                self._kept.append(text)
                if not self._echo(text):
                    continue
            passed.append(raw + b"\n" if newline else raw)
        if passed:
            with contextlib.suppress(OSError):
                os.write(self.saved, b"".join(passed))

    def close(self) -> None:
        os.dup2(self.saved, self.fd)  # the write end of the pipe closes: the thread reads to its end
        self._thread.join(_DRAIN_S)
        if not self._thread.is_alive():
            os.close(self.saved)
        # else a child process still holds the pipe: the thread keeps passing its output on until it exits


class FdTee:
    """``with FdTee(keep) as tee:`` ... ``tee.kept``: the lines written to file descriptors 1
    and 2 during the block for which ``keep(line)`` is true (without their newline), in the
    order each descriptor received them (stderr's first); every other line is passed on, and
    so are the kept lines for which ``echo(line)`` is true."""

    def __init__(
        self, keep: Callable[[str], bool], *, echo: Callable[[str], bool] | None = None, fds: tuple[int, ...] = (2, 1)
    ) -> None:
        self._keep = keep
        self._echo = echo or (lambda line: False)
        self._fds = fds
        self._pipes: list[_Pipe] = []
        self._kept: dict[int, list[str]] = {fd: [] for fd in fds}

    @property
    def kept(self) -> list[str]:
        return [line for fd in self._fds for line in self._kept[fd]]

    def __enter__(self) -> FdTee:
        self._flush()
        try:
            for fd in self._fds:
                self._pipes.append(_Pipe(fd, self._keep, self._echo, self._kept[fd]))
        except OSError:
            self._close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._close()

    @staticmethod
    def _flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a stream replaced by the user may not flush
                stream.flush()
        _flush_c_streams()

    def _close(self) -> None:
        self._flush()
        pipes, self._pipes = self._pipes, []
        for pipe in reversed(pipes):
            pipe.close()
