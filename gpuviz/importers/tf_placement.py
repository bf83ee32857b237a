"""TensorFlow device-placement logs (``tf.debugging.set_log_device_placement(True)``), as text or a notebook.

Lines understood (each optionally after a glog ``2021-10-01 12:00:00.123456: I file.cc:123] `` or
absl ``I0000 00:00:1700000000.123456   1234 file.cc:123] `` prefix):

- eager: ``Executing op MatMul in device /job:localhost/replica:0/task:0/device:GPU:0``
- graph placer (TF 2): ``dense/MatMul: (MatMul): /job:localhost/replica:0/task:0/device:GPU:0``
- graph placer (TF 1): ``dense/MatMul: (MatMul)/job:localhost/replica:0/task:0/device:GPU:0``

Each becomes a ``placement`` event: tag = op type, device = where it ran. The log says
nothing of the device the op asked for (``peer`` is -1) nor whether soft placement moved it
(``flags`` 0). Time: from the glog/absl prefix when every line has one (``time_ns`` exact;
glog's local wall clock is read as UTC), else the line order at 1 µs apart (inferred). The
placer prints each node's assignment to stdout and to the log, so a placer line is counted
once per (node, op, device). A notebook (``.ipynb``) is read from its stored
outputs (stream text and ``text/plain``), cell by cell.

Device names: ``/job:localhost/replica:0/task:0/device:GPU:0``, ``/device:GPU:0`` and TF < 1.4's
``/gpu:0`` -> ``GPU:0``; ``XLA_GPU:0`` stays ``XLA_GPU:0``; a device of another job or task keeps
its full name.
"""

from __future__ import annotations

import io
import json
import re
from array import array
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from typing import IO, NamedTuple

from gpuviz.base.errors import LogFormatError
from gpuviz.importers.builder import event_row, finish, set_source_meta
from gpuviz.importers.source import Progress, Source
from gpuviz.importers.textlines import TextLines
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind

__all__ = ["NAME", "DESCRIPTION", "sniff", "read", "placements", "Placement", "device_name"]

NAME = "tf-placement"
DESCRIPTION = "a TensorFlow device-placement log (text or notebook outputs with 'Executing op X in device ...')"

_PREFIX = (
    r"(?:(?P<glog>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?): [IWEF] [^\]\n]*\] "  # glog
    r"|[IWEF](?:0000 00:00:(?P<epoch>\d+\.\d+)|\d{4} [\d:.]+)\s+\d+ [^\]\n]*\] )?"  # absl
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


class Placement(NamedTuple):
    """One placement line: where it starts in the text, the op type, gpuviz's device name, the graph
    node (placer lines; None for eager ones) and the time of its log prefix (ns since the epoch, None without)."""

    offset: int
    op: str
    device: str
    node: str | None
    time_ns: int | None


def _prefix_time(match: re.Match[str]) -> int | None:
    """The time written in a glog prefix (as UTC: glog writes local time without a zone) or absl's epoch form."""
    if match["glog"]:
        day, clock = match["glog"].split(" ")
        seconds, _, fraction = clock.partition(".")
        moment = datetime.strptime(f"{day} {seconds}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
        return int(moment.timestamp()) * 10**9 + int(fraction.ljust(9, "0")[:9] or 0)
    if match["epoch"]:
        whole, _, fraction = match["epoch"].partition(".")
        return int(whole) * 10**9 + int(fraction.ljust(9, "0")[:9])
    return None


def placements(lines: Iterable[str]) -> Iterator[Placement]:
    """Every placement line among ``lines``, in order (``offset``: the line's index)."""
    for number, line in enumerate(lines):
        if "Executing op " in line:
            match = _EAGER.match(line)
            if match is not None:
                yield Placement(number, match[3], device_name(match[4]), None, _prefix_time(match))
        elif ": (" in line:
            match = _PLACER.match(line)
            if match is not None:
                yield Placement(number, match[4], device_name(match[5]), match[3], _prefix_time(match))


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


NOTEBOOK_BYTES = 256 << 20
"""The largest notebook read for its placement lines (decoded whole as JSON: a few times its
size in memory); a larger one is refused before it is read."""


def _open_text(source: Source, is_notebook: bool) -> IO[str]:
    """The log's text, streamed, or a notebook's stored outputs."""
    if is_notebook:
        with source.open() as stream:
            data = stream.read(NOTEBOOK_BYTES + 1)
        if len(data) > NOTEBOOK_BYTES:
            raise LogFormatError(
                f"{source.name} is a notebook of more than {NOTEBOOK_BYTES >> 20} MiB: too large to read for its "
                "placement lines (save the log's text instead)"
            )
        return io.StringIO(_notebook_text(data, source.name))
    return io.TextIOWrapper(source.open(), encoding="utf-8", errors="replace")


def read(source: Source, *, progress: Progress) -> EventLog:
    is_notebook = _NOTEBOOK.match(source.head) is not None
    log = EventLog(arena=False)  # built at once, then read whole
    devices: dict[str, int] = {}  # name -> local index, in order of appearance
    kept_devices, tags, times = array("l"), array("l"), array("q")
    seen: set[tuple[str, str, str]] = set()
    duplicates = 0
    timed = True
    with _open_text(source, is_notebook) as text:
        lines = TextLines(text)
        for line in placements(lines):
            if line.node is not None:
                if (line.node, line.op, line.device) in seen:
                    duplicates += 1
                    continue
                seen.add((line.node, line.op, line.device))
            kept_devices.append(devices.setdefault(line.device, len(devices)))
            tags.append(log.intern_string(line.op))
            timed = timed and line.time_ns is not None
            times.append(line.time_ns or 0)
    index = {local: log.add_device(name) for name, local in sorted(devices.items(), key=lambda d: _device_order(d[0]))}
    timed = timed and bool(tags)
    previous = 0
    for i, (local, tag, stamp) in enumerate(zip(kept_devices, tags, times, strict=True)):
        time_ns = max(stamp, previous) if timed else i * _STEP_NS
        previous = time_ns
        log.append(event_row(time_ns=time_ns, kind=int(Kind.PLACEMENT), device=index[local], tag=tag))
    notes = [
        "time: from the glog/absl prefix of every line (glog's local time read as UTC)"
        if timed
        else "time: not on every line; events keep the line order, 1 µs apart",
        "requested device: not in the log (peer -1); soft placement: unknown (flags 0)",
    ]
    if duplicates:
        notes.append(f"{duplicates} repeated graph-placer lines (printed to stdout and to the log) counted once")
    if lines.cut is not None:
        log.truncated = True
        notes.append(f"the compressed file is cut short ({lines.cut}): imported the lines before the cut")
    elif not lines.complete:
        log.truncated = True
        notes.append("the file ends inside a line (no newline after it): it may have been cut short there")
    set_source_meta(
        log,
        format=NAME,
        file=source.name,
        tool="TensorFlow (log_device_placement)",
        columns={
            "time_ns": "exact" if timed else "inferred",
            "device": "exact",
            "tag": "exact",
            "peer": "absent",
            "flags": "absent",
        },
        notes=notes,
        extra={"container": "notebook outputs" if is_notebook else "text"},
    )
    return finish(log)


def _device_order(name: str) -> tuple[int, bool, str]:
    """GPUs first, then XLA GPUs, other kinds, CPUs; local devices before remote ones."""
    short = name.rsplit("device:", 1)[-1]
    kind = short.split(":")[0]
    return (0 if kind == "GPU" else 1 if "GPU" in kind else 3 if kind == "CPU" else 2, short != name, name)
