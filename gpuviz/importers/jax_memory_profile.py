"""JAX device memory profiles (``jax.profiler.save_device_memory_profile``): the buffers alive on
every device at one moment, with the Python stack that created each.

The file is a gzip-compressed pprof ``Profile`` protobuf (profile.proto, decoded with
``protowire``; field numbers below), as JAX's ``HeapProfile`` writes it:

    Profile   sample_type=1 (ValueType), sample=2, location=4, function=5, string_table=6, time_nanos=9
    ValueType type=1, unit=2 (string indices): ("allocations", "count"), ("space", "bytes")
    Sample    location_id=1 (packed, the leaf first), value=2 (packed: count, bytes), label=3
    Label     key=1, str=2, num=3 (string indices): kind = "buffer" | "executable", device = "cpu:0", "cuda:0", ...
    Location  id=1, line=4 (Line: function_id=1, line=2; inlined functions first)
    Function  id=1, name=2, system_name=3, filename=4, start_line=5

JAX groups the live buffers by (stack, size, device): a sample of ``count`` buffers holds
``bytes = count * size``. Mapping: each buffer -> one ``alloc`` of ``size`` bytes (requested =
size: the on-device size JAX reports) on its device (``cpu:N`` -> ``CPU:N``, ``cuda:N``/
``rocm:N``/``gpu:N`` -> ``GPU:N``, ``tpu:N`` -> ``TPU:N``), with the sample's stack (Python
frames, innermost first); compiled executables (``kind=executable``) -> allocations tagged
``executable`` on the device they name (on the only device when they name none; else left out).

A profile is one moment, not a history: every event is at the profile's ``time_nanos`` (0 when
absent); there are no frees. Addresses and segments are not recorded: each buffer gets a
synthetic address in a segment of its own (reserved = in use, no fragmentation invented).

Limits (``LogFormatError`` beyond them): ``MAX_BYTES`` of decompressed profile, ``MAX_BUFFERS``
buffers in all; every id and string index must resolve.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

from gpuviz.base.errors import LogFormatError
from gpuviz.importers.addressed import Unaddressed
from gpuviz.importers.builder import HeapBuilder, finish, set_source_meta
from gpuviz.importers.protowire import LEN, VARINT, WireError, as_int64, fields, read_varint
from gpuviz.importers.source import Progress, Source
from gpuviz.log.eventlog import NO_INDEX, EventLog, Frame

__all__ = ["NAME", "DESCRIPTION", "sniff", "read", "load_jax_memory_profile", "MAX_BYTES", "MAX_BUFFERS"]

NAME = "jax-memory-profile"
DESCRIPTION = "a JAX device memory profile (jax.profiler.save_device_memory_profile: gzip-compressed pprof)"
MAX_BYTES = 1 << 30  # decompressed profile
MAX_BUFFERS = 1 << 24  # buffers in all (the sum of the samples' counts)
_PLATFORMS = {"cpu": "CPU", "cuda": "GPU", "rocm": "GPU", "gpu": "GPU", "tpu": "TPU"}
_DEVICE = re.compile(r"^\s*([A-Za-z][A-Za-z_]*?)[:_ ]?(\d+)\s*$")
_GZIP_MAGIC = b"\x1f\x8b"


def sniff(head: bytes) -> bool:
    """A pprof Profile: ``sample_type`` ValueTypes (two varints each) first, then samples whose
    fields are packed location ids, packed values and labels."""
    seen_type = seen_sample = False
    try:
        for number, wire, value, pos in fields(head, 0, len(head)):
            if number == 1 and wire == LEN and not seen_sample:
                inner = [(n, w) for n, w, _, _ in fields(head, pos, value)]
                if not inner or any(n not in (1, 2) or w != VARINT for n, w in inner):
                    return False
                seen_type = True
            elif number == 2 and wire == LEN and seen_type:
                inner = [(n, w) for n, w, _, _ in fields(head, pos, value)]
                if not inner or any(n not in (1, 2, 3) or w != LEN for n, w in inner):
                    return False
                if not any(n == 3 for n, _ in inner):
                    return False  # JAX labels every sample (kind, device)
                seen_sample = True
                return True
            else:
                return False
    except WireError:
        return False
    return False


def _packed(data: bytes, start: int, end: int) -> list[int]:
    out = []
    while start < end:
        value, start = read_varint(data, start, end)
        out.append(value)
    return out


def _message(data: bytes, start: int, end: int) -> dict[int, list[Any]]:
    """The fields of a message: number -> values (ints for varints, (start, end) for LEN)."""
    out: dict[int, list[Any]] = {}
    for number, wire, value, pos in fields(data, start, end):
        out.setdefault(number, []).append((pos, value) if wire == LEN else value)
    return out


def _device_name(text: str) -> str:
    match = _DEVICE.match(text)
    if match is None:
        return text.strip() or "DEVICE:0"
    platform = match[1].lower()
    return f"{_PLATFORMS.get(platform, platform.upper())}:{int(match[2])}"


class _Profile:
    """The decoded profile: strings, stacks by location, and the samples."""

    def __init__(self, data: bytes, name: str) -> None:
        self.name = name
        self.strings: list[str] = []
        self.time_ns = 0
        sample_spans: list[tuple[int, int]] = []
        location_spans: list[tuple[int, int]] = []
        function_spans: list[tuple[int, int]] = []
        self.types: list[tuple[int, int]] = []
        for number, wire, value, pos in fields(data):
            if number == 6 and wire == LEN:
                self.strings.append(data[pos:value].decode("utf-8", errors="replace"))
            elif number == 2 and wire == LEN:
                sample_spans.append((pos, value))
            elif number == 4 and wire == LEN:
                location_spans.append((pos, value))
            elif number == 5 and wire == LEN:
                function_spans.append((pos, value))
            elif number == 1 and wire == LEN:
                message = _message(data, pos, value)
                self.types.append((message.get(1, [0])[0], message.get(2, [0])[0]))
            elif number == 9 and wire == VARINT:
                self.time_ns = max(as_int64(value), 0)
        self.functions: dict[int, tuple[str, str, int]] = {}
        for start, end in function_spans:
            message = _message(data, start, end)
            ident = message.get(1, [0])[0]
            name = self.string(message.get(2, [0])[0])
            filename = self.string(message.get(4, [0])[0])
            self.functions[ident] = (name, filename, as_int64(message.get(5, [0])[0]))
        self.locations: dict[int, tuple[Frame, ...]] = {}
        for start, end in location_spans:
            message = _message(data, start, end)
            frames = []
            for line_start, line_end in message.get(4, []):
                line = _message(data, line_start, line_end)
                function = self.functions.get(line.get(1, [0])[0])
                if function is None:
                    raise LogFormatError(
                        f"{name}: a location names function {line.get(1, [0])[0]}, which is not defined"
                    )
                frames.append(Frame(function[1], as_int64(line.get(2, [0])[0]), function[0]))
            self.locations[message.get(1, [0])[0]] = tuple(frames)
        self.samples: list[tuple[list[int], list[int], dict[str, str]]] = []
        for start, end in sample_spans:
            message = _message(data, start, end)
            ids = [i for s, e in message.get(1, []) for i in _packed(data, s, e)]
            values = [as_int64(v) for s, e in message.get(2, []) for v in _packed(data, s, e)]
            labels = {}
            for label_start, label_end in message.get(3, []):
                label = _message(data, label_start, label_end)
                labels[self.string(label.get(1, [0])[0])] = self.string(label.get(2, [0])[0])
            self.samples.append((ids, values, labels))

    def string(self, index: int) -> str:
        if not 0 <= index < len(self.strings):
            raise LogFormatError(f"{self.name}: string index {index} is outside the string table")
        return self.strings[index]

    def stack(self, ids: list[int]) -> tuple[Frame, ...]:
        frames: list[Frame] = []
        for ident in ids:
            found = self.locations.get(ident)
            if found is None:
                raise LogFormatError(f"{self.name}: a sample names location {ident}, which is not defined")
            frames.extend(found)
        return tuple(frames)


def _decompressed(raw: bytes, name: str) -> bytes:
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(raw, MAX_BYTES + 1)
    except zlib.error as exc:
        raise LogFormatError(f"{name}: the gzip stream is corrupt ({exc})") from None
    if len(data) > MAX_BYTES:
        raise LogFormatError(f"{name}: the profile decompresses to more than {MAX_BYTES} bytes")
    if not inflater.eof:
        raise LogFormatError(f"{name}: the gzip stream is cut short")
    return data


def load_jax_memory_profile(path_or_bytes: str | Any) -> EventLog:
    """An EventLog of a JAX device memory profile: a path, or the bytes
    ``jax.profiler.device_memory_profile()`` returns (gzip-compressed or not)."""
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        return _build(_decompressed(bytes(path_or_bytes), "the profile"), file="")
    from gpuviz.importers import load

    return load(path_or_bytes)


def read(source: Source, *, progress: Progress) -> EventLog:
    with source.open() as stream:
        try:
            data = stream.read(MAX_BYTES + 1)
        except (EOFError, OSError, zlib.error) as exc:
            raise LogFormatError(f"{source.path}: the gzip stream is cut short or corrupt ({exc})") from None
    if len(data) > MAX_BYTES:
        raise LogFormatError(f"{source.path}: the profile decompresses to more than {MAX_BYTES} bytes")
    return _build(data, file=str(source.path))


def _build(data: bytes, *, file: str) -> EventLog:
    name = file or "the profile"
    try:
        profile = _Profile(data, name)
    except WireError as exc:
        raise LogFormatError(f"{name} is not a complete pprof protobuf (truncated or corrupt: {exc})") from None
    types = [(profile.string(t), profile.string(u)) for t, u in profile.types]
    if types != [("allocations", "count"), ("space", "bytes")]:
        raise LogFormatError(f"{name} is a pprof profile of {types}, not a JAX device memory profile "
                             "(allocations/count, space/bytes)")  # fmt: skip
    total = 0
    for _, values, labels in profile.samples:
        if len(values) != 2 or values[0] < 0 or values[1] < 0 or (values[0] and values[1] % values[0]):
            raise LogFormatError(f"{name}: a sample's values {values[:4]} are not (count, count x size bytes)")
        if labels.get("kind") not in ("buffer", "executable"):
            raise LogFormatError(f"{name}: a sample's kind is {labels.get('kind')!r}, not buffer or executable")
        total += values[0]
    if total > MAX_BUFFERS:
        raise LogFormatError(f"{name}: the profile declares {total} buffers, more than {MAX_BUFFERS}")
    log = EventLog(arena=False)
    names = sorted({_device_name(labels["device"]) for _, _, labels in profile.samples if "device" in labels},
                   key=_device_order)  # fmt: skip
    heaps = {n: Unaddressed(HeapBuilder(log, log.add_device(n, allocator="jax"))) for n in names}
    executable = log.intern_string("executable")
    counts = {"buffers": 0, "buffer_bytes": 0, "executables": 0, "executable_bytes": 0}
    left_out = [0, 0]
    empty = 0
    for ids, (count, nbytes), labels in profile.samples:
        kind = labels["kind"]
        device = _device_name(labels["device"]) if "device" in labels else (names[0] if len(names) == 1 else None)
        if device is None:
            left_out[0] += count
            left_out[1] += nbytes
            continue
        if count == 0 or nbytes == 0:
            empty += count
            continue
        size = nbytes // count
        frames = profile.stack(ids)
        stack = log.intern_stack(frames) if frames else NO_INDEX
        heap = heaps[device]
        tag = executable if kind == "executable" else NO_INDEX
        for _ in range(count):
            heap.alloc(profile.time_ns, size, size, tag=tag, stack=stack)
        plural = "buffers" if kind == "buffer" else "executables"
        counts[plural] += count
        counts[f"{plural[:-1]}_bytes"] += nbytes
    notes = [
        "a memory profile is one moment: every live buffer is an allocation at the profile's time "
        f"({'time_nanos' if profile.time_ns else 'absent: 0'}), with no frees and no history",
        "addresses and segments are not recorded: each buffer has a synthetic address in a segment of its own "
        "(reserved = in use, no fragmentation shown)",
        "sizes are the on-device sizes JAX reports (requested = size); stacks are the Python frames that "
        "created each buffer, innermost first",
    ]
    if left_out[0]:
        notes.append(f"{left_out[0]} compiled executables ({left_out[1]} bytes) name no device: left out")
    if empty:
        notes.append(
            f"{empty} buffers or executables of 0 bytes (no device memory: compiled code on the CPU) were left out"
        )
    set_source_meta(
        log, format=NAME, file=file, tool="jax.profiler.save_device_memory_profile",
        columns={
            "time_ns": "inferred", "device": "exact", "address": "inferred", "segment": "inferred",
            "size": "exact", "requested": "exact", "stack": "exact", "tag": "exact", "thread": "absent",
            "largest_free": "inferred",
        },
        notes=notes, extra=counts,
    )  # fmt: skip
    return finish(log)


def _device_order(name: str) -> tuple[int, str, int]:
    kind, _, index = name.partition(":")
    order = {"GPU": 0, "TPU": 1, "CPU": 3}.get(kind, 2)
    return order, kind, int(index) if index.isdigit() else 0
