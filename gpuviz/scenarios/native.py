"""What-if replays in C: every policy and the replay loop together.

``replay_native`` serves a request stream exactly as ``whatif.replay_policy`` does with the
Python models (``TorchCachingAllocator`` without expandable segments, ``RmmPoolAllocator``,
``NoPoolAllocator``, and ``NativeBFCAllocator``, whose core, ``_bfc_core.c``, is compiled in,
its growth, limit and garbage collection included: ``bfc_grow``, on the rules of
``_bfc_rules.h``) over a fresh ``SimUpstream``, and
returns the same log (the same rows, string and stack tables, devices) and the same count of
served requests. The policy, the simulated device, the events and the loop run in
``gpuviz.scenarios._whatifcore`` (built at install time where a C compiler exists); the Python
models stay the executable reference and run wherever the C replay does not apply
(``GPUVIZ_NATIVE=0``, no compiler, expandable segments, a seeded allocator, another upstream).

The allocator is still built in Python (``Policy.build``), so options are checked, the
device's options recorded and RMM's initial pool reserved exactly as in the Python replay.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from gpuviz.analysis.requests import RequestStream
from gpuviz.base import native as registry
from gpuviz.base.torch_rules import NO_MAX_SPLIT
from gpuviz.capture.bfc import ReferenceBFCAllocator
from gpuviz.capture.bfc_rules import first_segment_bytes
from gpuviz.capture.native import NativeBFCAllocator
from gpuviz.capture.upstream import SimUpstream, Upstream
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import DTYPES, ROW_COLUMNS
from gpuviz.scenarios.pools import NoPoolAllocator, RmmPoolAllocator
from gpuviz.scenarios.torch_caching import TorchCachingAllocator

__all__ = ["native_replay_available", "replay_native", "replay_description"]

_MODULE = "gpuviz.scenarios._whatifcore"
_core: Any = registry.load(_MODULE)  # None where it was not built: the Python models replay

_TORCH, _RMM, _NOPOOL, _BFC = 1, 2, 3, 4
_REQUEST_MAX = 1 << 62  # larger requests (and negative ones) take the Python path, which says what is wrong
logger = logging.getLogger("gpuviz")


def native_replay_available() -> bool:
    """Whether the C replay is built, loaded and not switched off (``gpuviz.base.native``)."""
    return _core is not None and registry.available(_MODULE)


def replay_description() -> str:
    """How what-if replays run, in words (for ``gpuviz info``)."""
    if native_replay_available():
        return "C for every policy (tf-bfc on the native core)"
    return f"Python ({registry.why_not(_MODULE) or 'the C replay is not loaded'})"


_Settings = tuple[int, int, float, tuple[int, ...], int]


def _settings(alloc: object) -> tuple[int, _Settings] | None:
    """The C kind and (max_split, allowed, gc_threshold, divisions, maximum) of ``alloc``
    (-1: none; tf-bfc: maximum is the memory limit), or None when the C replay does not model it."""
    none: tuple[int, ...] = (0,) * 16
    if type(alloc) in (ReferenceBFCAllocator, NativeBFCAllocator):  # as Policy.build makes them: recording, no stacks
        assert isinstance(alloc, ReferenceBFCAllocator)
        return _BFC, (-1, -1, 0.0, none, alloc.memory_limit)
    if isinstance(alloc, TorchCachingAllocator):
        rules = alloc.rules
        if getattr(rules, "expandable", False) or len(rules.divisions) != 16:
            return None
        split = -1 if alloc.max_split_size == NO_MAX_SPLIT else alloc.max_split_size
        allowed = -1 if alloc.allowed is None else alloc.allowed
        return _TORCH, (split, allowed, float(alloc.gc_threshold), tuple(rules.divisions), -1)
    if isinstance(alloc, RmmPoolAllocator):
        return _RMM, (-1, -1, 0.0, none, -1 if alloc.maximum is None else alloc.maximum)
    if isinstance(alloc, NoPoolAllocator):
        return _NOPOOL, (-1, -1, 0.0, none, -1)
    return None


def replay_native(
    stream: RequestStream,
    source: EventLog,
    alloc: object,
    upstream: Upstream,
    *,
    stop_at_oom: bool = True,
) -> tuple[EventLog, int] | None:
    """``replay_policy``'s result for the freshly built ``alloc`` over ``upstream``, computed in C;
    None (nothing done) where the C replay does not apply."""
    if not native_replay_available() or type(upstream) is not SimUpstream or upstream.backed:
        return None
    settings = _settings(alloc)
    if settings is None:
        return None
    kind, options = settings
    regions = upstream.regions()
    if isinstance(alloc, ReferenceBFCAllocator):
        segments: list[tuple[int, int]] = []
        if regions or len(alloc.log) or alloc.stats().pool_bytes:
            return None  # only a fresh allocator
        requested = stream.requested[stream.is_alloc]
        if len(requested) and not 0 <= int(requested.min()) <= int(requested.max()) < _REQUEST_MAX:
            return None
        first = first_segment_bytes(alloc.growth, alloc.memory_limit)
        device_name = alloc.device

        def warn(count: int, total: int, rounded: int) -> None:  # SegmentPool._collect's words
            logger.warning(
                "%s: garbage collection returns %d free segments (%d bytes) upstream to fit %d bytes",
                device_name, count, total, rounded,
            )  # fmt: skip

        bfc: tuple[int, bool, object] = (first, alloc.garbage_collection, warn)
    else:
        assert isinstance(alloc, (TorchCachingAllocator, RmmPoolAllocator, NoPoolAllocator))
        segments = sorted(alloc.heap.segments.items())
        if regions != segments or len(alloc.log) != len(segments) or alloc.in_use:
            return None  # only a fresh allocator: nothing but RMM's initial pool, wholly free
        bfc = (0, False, None)
    tail = upstream.base + sum(size for _, size in regions)
    if any(address != upstream.base + sum(s for _, s in regions[:i]) for i, (address, _) in enumerate(regions)):
        return None
    frees = stream.alloc_of[~stream.is_alloc]
    if len(frees) and int(frees.min()) < 0:
        return None  # frees of allocations from before the stream: only a seeded allocator has them
    log = alloc.log
    before = len(log)
    columns = (
        np.ascontiguousarray(stream.is_alloc, dtype=np.uint8),
        np.ascontiguousarray(stream.deferred, dtype=np.uint8),
        np.ascontiguousarray(stream.alloc_of, dtype=np.int64),
        np.ascontiguousarray(stream.requested, dtype=np.int64),
        np.ascontiguousarray(stream.time_ns, dtype=np.int64),
        np.ascontiguousarray(stream.tag, dtype=np.int64),
        np.ascontiguousarray(stream.stack, dtype=np.int64),
    )
    device = log.device_index(stream.device)
    served, _, out, tag_order, stack_order = _core.replay(
        kind, device, columns, (upstream.capacity, upstream.base, tail, upstream.reserved), segments,
        stop_at_oom, options, (len(source.strings), len(source.stacks)), bfc,
    )  # fmt: skip
    rows = {name: np.frombuffer(data, dtype=DTYPES[name]) for name, data in zip(ROW_COLUMNS, out, strict=True)}
    # the C replay numbered tags and stacks in order of first use, as interning them now does
    # in a fresh log whose source tables hold no duplicates; otherwise renumber
    for column, order, intern, items in (
        ("tag", tag_order, log.intern_string, source.strings),
        ("stack", stack_order, log.intern_stack, source.stacks),
    ):
        ids = np.array([intern(items[index]) for index in order] + [-1], dtype=np.int32)
        if not np.array_equal(ids[:-1], np.arange(len(order))):
            rows[column] = ids[rows[column]]
    if before and len(stream):  # RMM's initial pool, reserved before the first request: its time
        log.flush()
        return log.extended(rows).with_columns(time_ns=np.concatenate([np.full(before, stream.time_ns[0]),
                                                                        rows["time_ns"]])), int(served)  # fmt: skip
    return log.extended(rows), int(served)
