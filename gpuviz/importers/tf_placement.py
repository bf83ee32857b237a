"""TensorFlow device-placement logs (``tf.debugging.set_log_device_placement(True)``), as text or a notebook.

Lines understood (each optionally after a glog ``2021-10-01 12:00:00.123456: I file.cc:123] `` or
absl ``I0000 00:00:1700000000.123456   1234 file.cc:123] `` prefix):

- eager: ``Executing op MatMul in device /job:localhost/replica:0/task:0/device:GPU:0``
- graph placer (TF 2): ``dense/MatMul: (MatMul): /job:localhost/replica:0/task:0/device:GPU:0``
- graph placer (TF 1): ``dense/MatMul: (MatMul)/job:localhost/replica:0/task:0/device:GPU:0``

Each becomes a ``placement`` event: tag = op type, device = where it ran. The log says
nothing of the device the op asked for (``peer`` is -1) nor whether soft placement moved it
(``flags`` 0), nor of time: events keep the source's line order at 1 µs apart (``time_ns``
inferred). The placer prints each node's assignment to stdout and to the log, so a placer
line is counted once per (node, op, device). A notebook (``.ipynb``) is read from its stored
outputs (stream text and ``text/plain``), cell by cell.

Device names: ``/job:localhost/replica:0/task:0/device:GPU:0``, ``/device:GPU:0`` and TF < 1.4's
``/gpu:0`` -> ``GPU:0``; ``XLA_GPU:0`` stays ``XLA_GPU:0``; a device of another job or task keeps
its full name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from gpuviz.base.errors import LogFormatError
from gpuviz.importers.builder import event_row, finish, set_source_meta
from gpuviz.importers.source import Progress, Source
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind

__all__ = ["NAME", "DESCRIPTION", "sniff", "read", "placements", "device_name"]

NAME = "tf-placement"
DESCRIPTION = "a TensorFlow device-placement log (text or notebook outputs with 'Executing op X in device ...')"

_PREFIX = (
    r"(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?: [IWEF] [^\]\n]*\] "  # glog
    r"|[IWEF]\d{4} [\d:.]+\s+\d+ [^\]\n]*\] )?"  # absl
)
_DEVICE = r"(/(?:job:[^/\s]+/replica:\d+/task:\d+/)?(?:device:)?[A-Za-z_]+:\d+)"
_EAGER = re.compile(rf"^{_PREFIX}Executing op (\S+) in device {_DEVICE}\s*$", re.MULTILINE)
_PLACER = re.compile(rf"^{_PREFIX}(\S+): \(([A-Za-z0-9_]+)\):? ?{_DEVICE}\s*$", re.MULTILINE)
_PARTS = re.compile(r"^/(?:job:([^/]+)/replica:(\d+)/task:(\d+)/)?(?:device:)?([A-Za-z_]+):(\d+)$")
_STEP_NS = 1000
_NOTEBOOK = re.compile(rb'^\s*\{\s*"(?:cells|nbformat|metadata)"')


def device_name(device: str) -> str:
    """gpuviz's name of a TF device string: ``GPU:0``, ``CPU:0``, ``XLA_GPU:0``; other jobs/tasks keep the full name."""
    match = _PARTS.match(device)
    if match is None:
        raise LogFormatError(f"not a TensorFlow device name: {device!r}")
    job, replica, task, kind, index = match.groups()
    short = f"{kind.upper()}:{index}"
    if job is None or (job == "localhost" and replica == "0" and task == "0"):
        return short
    return f"/job:{job}/replica:{replica}/task:{task}/device:{short}"


def placements(text: str) -> Iterator[tuple[int, str, str, str | None]]:
    """``(offset, op type, device name, node name or None)`` of every placement line in ``text``, in order."""
    found: list[tuple[int, str, str, str | None]] = [(m.start(), m[1], m[2], None) for m in _EAGER.finditer(text)]
    found += [(m.start(), m[2], m[3], m[1]) for m in _PLACER.finditer(text)]
    for offset, op, device, node in sorted(found):
        yield offset, op, device_name(device), node


def sniff(head: bytes) -> bool:
    """A placement line in the head (text), or in a notebook's head (lines inside JSON strings)."""
    text = head.decode("utf-8", errors="replace")
    if _NOTEBOOK.match(head):
        text = text.replace("\\n", "\n").replace('",', "\n").replace('"', "\n")
    return _EAGER.search(text) is not None or _PLACER.search(text) is not None


def _notebook_text(data: bytes, name: str) -> str:
    try:
        notebook = json.loads(data)
    except ValueError as exc:
        raise LogFormatError(f"{name} looks like a notebook but is not valid JSON ({exc})") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise LogFormatError(f"{name} is JSON but not a notebook (no 'cells' list)")
    parts: list[str] = []
    for cell in notebook["cells"]:
        for output in cell.get("outputs", ()) if isinstance(cell, dict) else ():
            if not isinstance(output, dict):
                continue
            text = output.get("text")
            if text is None:
                text = (output.get("data") or {}).get("text/plain")
            if isinstance(text, list):
                text = "".join(str(piece) for piece in text)
            if isinstance(text, str):
                parts.append(text if text.endswith("\n") else text + "\n")
    return "".join(parts)


def read(source: Source, *, progress: Progress) -> EventLog:
    data = source.read_all()
    is_notebook = _NOTEBOOK.match(data) is not None
    text = _notebook_text(data, source.name) if is_notebook else data.decode("utf-8", errors="replace")
    rows = []
    seen: set[tuple[str, str, str]] = set()
    duplicates = 0
    for _, op, device, node in placements(text):
        if node is not None:
            if (node, op, device) in seen:
                duplicates += 1
                continue
            seen.add((node, op, device))
        rows.append((op, device))
    log = EventLog()
    names = sorted({device for _, device in rows}, key=_device_order)
    index = {name: log.add_device(name) for name in names}
    for i, (op, device) in enumerate(rows):
        log.append(event_row(time_ns=i * _STEP_NS, kind=int(Kind.PLACEMENT), device=index[device],
                             tag=log.intern_string(op)))  # fmt: skip
    notes = [
        "time: the log has none; events keep the line order, 1 µs apart",
        "requested device: not in the log (peer -1); soft placement: unknown (flags 0)",
    ]
    if duplicates:
        notes.append(f"{duplicates} repeated graph-placer lines (printed to stdout and to the log) counted once")
    set_source_meta(
        log,
        format=NAME,
        file=source.name,
        tool="TensorFlow (log_device_placement)",
        columns={"time_ns": "inferred", "device": "exact", "tag": "exact", "peer": "absent", "flags": "absent"},
        notes=notes,
        extra={"container": "notebook outputs" if is_notebook else "text"},
    )
    return finish(log)


def _device_order(name: str) -> tuple[int, bool, str]:
    """GPUs first, then XLA GPUs, other kinds, CPUs; local devices before remote ones."""
    short = name.rsplit("device:", 1)[-1]
    kind = short.split(":")[0]
    return (0 if kind == "GPU" else 1 if "GPU" in kind else 3 if kind == "CPU" else 2, short != name, name)
