"""Opening hostile input in a subprocess under a memory limit: the script's ``CAP`` lines, put
after its imports, let it add at most ``LIMIT_MB`` of address space to what it holds then."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

__all__ = ["LIMIT_MB", "CAP", "cap", "run_limited"]

LIMIT_MB = 1024
CAP = f"""
import resource as _resource
with open("/proc/self/statm") as _statm:
    _held = int(_statm.read().split()[0]) * _resource.getpagesize()
_resource.setrlimit(_resource.RLIMIT_AS, (_held + ({LIMIT_MB} << 20), _held + ({LIMIT_MB} << 20)))
"""


def cap(indent: str = "    ") -> str:
    """``CAP`` for a script indented by ``indent`` (as inside ``textwrap.dedent``): its first line
    takes the placeholder's indentation, the others ``indent``."""
    return CAP.strip().replace("\n", "\n" + indent)


def run_limited(script: str, args: Sequence[str], *, timeout: float) -> str:
    """The standard output of ``script`` run with ``args`` in a fresh interpreter; the test
    fails with its standard error when it exits other than 0 (a raw exception, a crash)."""
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout
