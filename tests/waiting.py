"""Waiting in tests for what another thread or process does: on a condition, never on a duration.

``wait_until`` polls a condition until it holds. It sets no deadline that a busy machine could
miss: the only bound, ``HANG_GUARD_S``, turns a hang (the condition never coming true) into a
failure that names what was awaited, and is far beyond any wait the code's speed explains.
"""

from __future__ import annotations

import time
from collections.abc import Callable

HANG_GUARD_S = 600.0
"""Seconds after which a wait is taken for a hang (a failure), not for a slow machine."""


def wait_until(condition: Callable[[], object], what: str, *, poll_s: float = 0.01) -> None:
    """Return once ``condition()`` is true; fail naming ``what`` if it never becomes true (a hang)."""
    guard = time.monotonic() + HANG_GUARD_S
    while not condition():
        if time.monotonic() > guard:
            raise AssertionError(f"never happened (waited {HANG_GUARD_S:.0f} s, a hang): {what}")
        time.sleep(poll_s)
