"""Machine-readable benchmark results: what every benchmark writes with ``--json PATH``.

One JSON object per benchmark run (``benchmarks/write_results.py`` renders a folder of them
into ``benchmarks/RESULTS.md``)::

    {
      "benchmark": "core",                      # short name, one section of RESULTS.md
      "description": "Allocator speed ...",     # one line
      "results": [                              # the numbers, in the order printed
        {"name": "allocate+free pair, native core, on", "value": 0.41, "unit": "us"},
        ...
      ],
      # optional (written by Results.write; a hand-made file may leave them out):
      "date": "2026-11-28T02:40:00Z",           # UTC, when the run ended
      "machine": {"cpu": ..., "cores": 2, "memory_bytes": ..., "python": "3.11.7", "os": ...},
      "load": {"before": [1.0, 0.9, 0.8], "after": [...]},   # os.getloadavg() around the run
      "parameters": {"pairs": 5000, ...}        # the options the run was given
    }

``value`` is a number (or a short string for a status such as "ok"); ``unit`` is a unit
("s", "us", "ms", "MB", "events/s", "x", "%") or "" for a count. A result may carry a
``note`` string (shown beside it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["Results", "add_json_option", "machine", "load_average", "utc_now"]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    """This machine: CPU model, logical cores, memory (bytes), Python version, OS."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "python": platform.python_version(),
        "os": platform.platform(),
    }


def load_average() -> list[float]:
    """``os.getloadavg()`` (1, 5, 15 minutes), rounded to 2 decimals."""
    return [round(x, 2) for x in os.getloadavg()]


def utc_now() -> str:
    """The current time, UTC, ISO 8601 to the second (``2026-11-28T02:40:00Z``)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """``--json PATH``: also write the results as JSON (the schema of this module)."""
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")


class Results:
    """Collects one benchmark run's numbers; ``write(path)`` saves them (no-op for None).

    Created at the start of the run: the load average is read then and again at ``write``.
    """

    def __init__(self, benchmark: str, description: str, parameters: dict[str, Any] | None = None) -> None:
        self.benchmark = benchmark
        self.description = description
        self.parameters = {k: v for k, v in (parameters or {}).items() if k != "json"}
        self.results: list[dict[str, Any]] = []
        self.load_before = load_average()

    def add(self, name: str, value: float | int | str, unit: str, note: str | None = None) -> None:
        """One number: ``name`` says what was measured, ``unit`` its unit ("" for a count)."""
        if isinstance(value, float):
            value = float(f"{value:.4g}")  # 4 significant digits: what a shared machine's timings carry
        row: dict[str, Any] = {"name": name, "value": value, "unit": unit}
        if note:
            row["note"] = note
        self.results.append(row)

    def as_dict(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "description": self.description,
            "date": utc_now(),
            "machine": machine(),
            "load": {"before": self.load_before, "after": load_average()},
            "parameters": _jsonable(self.parameters),
            "results": self.results,
        }

    def write(self, path: Path | str | None) -> None:
        if path is None:
            return
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.as_dict(), indent=1) + "\n", encoding="utf-8")
        print(f"results written to {path}")


def _jsonable(parameters: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        if value is None:
            continue  # an option not given
        if isinstance(value, Path):
            value = str(value)
        elif isinstance(value, (list, tuple)):
            value = [str(v) if isinstance(v, Path) else v for v in value]
        out[key] = value
    return out
