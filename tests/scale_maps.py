"""A PyTorch snapshot of many segments, made here (no real trace needed): what the tests of the
map at scale open. Each segment is 2 MiB and holds one 1 MiB allocation made at
``/home/user/train.py:10 + s % 3`` (``s`` the segment's number); then, ``rounds`` times, every
segment allocates and frees a smaller block (128-512 KiB) at ``train.py:20 + round``."""

from __future__ import annotations

from typing import Any

MiB = 1 << 20
USER_FILE = "/home/user/train.py"


def site(line: int) -> list[dict[str, Any]]:
    """A stack: the user's line, then a library frame beneath it (innermost first)."""
    library = "/usr/lib/python3/site-packages/torch/nn/modules/module.py"
    return [
        {"filename": USER_FILE, "line": line, "name": "step"},
        {"filename": library, "line": 1, "name": "_call_impl"},
    ]


def many_segments(segments: int, rounds: int = 4) -> dict[str, Any]:
    """The snapshot (a dict as ``torch.cuda.memory._snapshot()`` gives it) of ``segments`` segments."""
    trace: list[dict[str, Any]] = []
    for s in range(segments):
        base = s * 4 * MiB
        trace.append({"action": "segment_alloc", "addr": base, "size": 2 * MiB, "stream": 0, "frames": []})
        trace.append({"action": "alloc", "addr": base, "size": MiB, "stream": 0, "frames": site(10 + s % 3)})
    for r in range(rounds):
        for s in range(segments):
            base, size = s * 4 * MiB + MiB, (s % 4 + 1) * 128 * 1024
            for action in ("alloc", "free_requested", "free_completed"):
                trace.append({"action": action, "addr": base, "size": size, "stream": 0, "frames": site(20 + r)})
    return {"segments": [], "device_traces": [trace]}
