"""A PyTorch snapshot made here whose map has more segments than fit (its answer is known):
70 segments of 2 MiB with 512 KiB in use from ``train.py:10``, 30 of 20 MiB wholly in use
from ``model.py:20`` and one of 100 MiB with 60 MiB in use from ``optim.py:30``."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from gpuviz.base.units import KiB, MiB

FIRST = 0x7F0000000000
GAP = 1 << 30  # between segments
GROUPS = [  # (name, segments, reserved, in use): the overview's rows, in order
    ("≤ 2.0 MiB", 70, 70 * 2 * MiB, 70 * 512 * KiB),
    ("16 MiB–32 MiB", 30, 30 * 20 * MiB, 30 * 20 * MiB),  # noqa: RUF001
    ("64 MiB–128 MiB", 1, 100 * MiB, 60 * MiB),  # noqa: RUF001
]
SITES = {"≤ 2.0 MiB": "train.py:10 (step)", "16 MiB–32 MiB": "model.py:20 (forward)",  # noqa: RUF001
         "64 MiB–128 MiB": "optim.py:30 (update)"}  # noqa: RUF001  # fmt: skip


def _segment(address: int, size: int, used: int, site: str) -> dict[str, Any]:
    filename, rest = site.split(":")
    line, name = rest.split(" ")
    frames = [{"filename": filename, "line": int(line), "name": name.strip("()")}]
    blocks = [{"address": address, "size": used, "requested_size": used, "state": "active_allocated", "frames": frames}]
    if size > used:
        blocks.append({"address": address + used, "size": size - used, "requested_size": 0, "state": "inactive",
                       "frames": []})  # fmt: skip
    return {"device": 0, "address": address, "total_size": size, "allocated_size": used, "active_size": used,
            "requested_size": used, "stream": 0, "segment_type": "small" if size <= 2 * MiB else "large",
            "blocks": blocks}  # fmt: skip


def dense_groups(small: int) -> list[tuple[str, int, int, int]]:
    """``GROUPS`` with ``small`` segments of 2 MiB (512 KiB in use each) in the first group."""
    return [("≤ 2.0 MiB", small, small * 2 * MiB, small * 512 * KiB), *GROUPS[1:]]


def segments(groups: list[tuple[str, int, int, int]] = GROUPS) -> list[tuple[int, int, int, str]]:
    """``(base, size, bytes in use, call site)`` of every segment of ``groups``, by address."""
    out, address = [], FIRST
    for name, count, reserved, in_use in groups:
        for _ in range(count):
            out.append((address, reserved // count, in_use // count, SITES[name]))
            address += reserved // count + GAP
    return out


def write_snapshot(path: Path, groups: list[tuple[str, int, int, int]] = GROUPS) -> Path:
    """The snapshot of ``groups``, as ``torch.cuda.memory._dump_snapshot`` would write it (no trace)."""
    data = {"segments": [_segment(*s) for s in segments(groups)], "device_traces": [[]]}
    path.write_bytes(pickle.dumps(data))
    return path
