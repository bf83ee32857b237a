"""Workloads for the C extensions of csrc/importers/ (see benchmarks/bench_native.py).

``WORKLOADS``: extension name -> (what the workload is, a set-up function returning the
callable to time). The same code runs the C extension and, with GPUVIZ_NATIVE_SKIP, its Python
twin: it calls gpuviz's public or module-level API, never the extension directly.
"""

from __future__ import annotations

from collections.abc import Callable

WORKLOADS: dict[str, tuple[str, Callable[[], Callable[[], object]]]] = {}
