"""A per-thread stack of values set by ``with`` blocks (device scopes, active logs)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

__all__ = ["ThreadStack"]

T = TypeVar("T")


class ThreadStack(Generic[T]):
    """The innermost value pushed on this thread (``top()``), pushed with ``with stack.pushed(v):``."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _stack(self) -> list[T]:
        stack: list[T] = self._local.__dict__.setdefault("stack", [])
        return stack

    def top(self) -> T | None:
        stack: list[T] | None = self._local.__dict__.get("stack")  # (no list made for a thread without one)
        return stack[-1] if stack else None

    @contextmanager
    def pushed(self, value: T) -> Iterator[T]:
        stack = self._stack()
        stack.append(value)
        try:
            yield value
        finally:
            stack.pop()
