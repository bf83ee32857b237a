"""The request stream of a run: what the program asked its allocator for, in order.

A what-if replay feeds this stream to another allocator policy. Per device it holds, in log
order, every allocation (requested bytes, time, tag, stack) and every free, each free pointing
at the allocation it ends (the latest allocation at that address). Chunk sizes, addresses and
segments are the original allocator's decisions and are not part of the stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuviz.base.torch_rules import FREE_REQUESTED_MARK
from gpuviz.log.eventlog import NO_INDEX, EventLog
from gpuviz.log.schema import Kind

__all__ = ["RequestStream", "request_stream"]


@dataclass(frozen=True)
class RequestStream:
    """One device's requests. Arrays are aligned, one entry per request, in log order.

    ``is_alloc``: True for an allocation, False for a free. ``deferred``: True for a *free
    request* whose completion waited on other streams (a ``free_requested`` mark of an imported
    PyTorch snapshot): the allocation's memory is returned by its later free, in the stream too,
    unless the allocator synchronizes first. ``alloc_of``: for a free (or free request), the
    position (in this stream) of the allocation it frees, or -1 for a free of an allocation
    made before ``start`` (kept only with ``keep_unmatched``; ``address`` then names it).
    ``requested`` (bytes), ``time_ns``, ``tag``/``stack`` (indices into the source log's tables)
    describe allocations; ``address`` is the source's address of each request; ``position`` is
    each request's index in the source log. ``unmatched_frees`` counts frees of allocations made
    before the stream begins. ``failed`` (None: no such requests): True for the requests the
    source failed to serve (an ``oom`` event: an allocation of the bytes asked for, followed by a
    free of it at the same position, since the program never held it).
    """

    device: str
    is_alloc: np.ndarray
    deferred: np.ndarray
    alloc_of: np.ndarray
    requested: np.ndarray
    time_ns: np.ndarray
    address: np.ndarray
    tag: np.ndarray
    stack: np.ndarray
    position: np.ndarray
    unmatched_frees: int
    failed: np.ndarray | None = None

    @property
    def failed_allocations(self) -> np.ndarray:
        """Stream indices of the allocations the source failed (its OOMs), in order."""
        if self.failed is None:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self.failed & self.is_alloc)

    def __len__(self) -> int:
        return len(self.is_alloc)

    @property
    def allocations(self) -> int:
        return int(self.is_alloc.sum())

    @property
    def frees(self) -> int:
        """Frees, not counting free requests (``deferred``)."""
        return int((~self.is_alloc & ~self.deferred).sum())


def request_stream(
    log: EventLog, device: str, *, start: int = 0, keep_unmatched: bool = False, failed: bool = False
) -> RequestStream:
    """The requests of ``device`` in ``log`` from log position ``start`` on (allocations and frees).

    Frees of allocations made before ``start`` are left out, unless ``keep_unmatched`` (for a
    replay seeded with the heap at ``start``, where those allocations exist). ``failed``: the
    requests the source failed (its ``oom`` events) are in the stream too, each an allocation
    and its free (``RequestStream.failed``), so that a replay says whether it would serve them.
    """
    device_id = log.device_index(device)
    cols = log.columns
    kinds = cols["kind"]
    requested_tag = log.string_id(FREE_REQUESTED_MARK)
    is_request = (kinds == Kind.MARK) & (cols["tag"] == requested_tag) & (requested_tag != NO_INDEX)
    mask = (cols["device"] == device_id) & ((kinds == Kind.ALLOC) | (kinds == Kind.FREE) | is_request)
    mask[: max(start, 0)] = False
    positions = np.flatnonzero(mask)
    is_alloc = kinds[positions] == Kind.ALLOC
    deferred = is_request[positions]
    addresses = cols["address"][positions].tolist()
    keep = np.ones(len(positions), dtype=bool)
    alloc_of = np.full(len(positions), -1, dtype=np.int64)
    live: dict[int, int] = {}
    for i, (alloc, request, address) in enumerate(zip(is_alloc.tolist(), deferred.tolist(), addresses, strict=True)):
        if alloc:
            live[address] = i
        elif request:  # the allocation stays live until its free
            j = live.get(address)
            if j is None:
                keep[i] = keep_unmatched
            else:
                alloc_of[i] = j
        else:
            j = live.pop(address, None)
            if j is None:
                keep[i] = keep_unmatched
            else:
                alloc_of[i] = j
    unmatched = int((~is_alloc & ~deferred & (alloc_of < 0)).sum())
    # renumber after dropping unmatched frees
    new_index = np.cumsum(keep) - 1
    alloc_of = np.where(alloc_of >= 0, new_index[np.maximum(alloc_of, 0)], -1)[keep]
    kept = positions[keep]
    stream = RequestStream(
        device=device,
        is_alloc=is_alloc[keep],
        deferred=deferred[keep],
        alloc_of=alloc_of,
        requested=cols["requested"][kept],
        time_ns=cols["time_ns"][kept],
        address=cols["address"][kept],
        tag=cols["tag"][kept],
        stack=cols["stack"][kept],
        position=kept,
        unmatched_frees=unmatched,
    )
    if not failed:
        return stream
    ooms = (cols["device"] == device_id) & (kinds == Kind.OOM)
    ooms[: max(start, 0)] = False
    return _with_failed(stream, np.flatnonzero(ooms), log)


def _with_failed(stream: RequestStream, ooms: np.ndarray, log: EventLog) -> RequestStream:
    """``stream`` with each source OOM (log positions ``ooms``) as an allocation and its free, in log order."""
    n, m = len(stream), len(ooms)
    cols = log.columns
    positions = np.concatenate([stream.position, ooms, ooms])
    order = np.lexsort((np.repeat(np.arange(3), [n, m, m]), positions))  # an OOM's allocation before its free
    new_index = np.empty(n + 2 * m, dtype=np.int64)
    new_index[order] = np.arange(n + 2 * m)
    old_of = np.where(stream.alloc_of >= 0, new_index[np.maximum(stream.alloc_of, 0)], -1)
    zeros = np.zeros(m, dtype=np.int64)

    def joined(values: np.ndarray, allocs: np.ndarray, frees: np.ndarray) -> np.ndarray:
        return np.concatenate([values, allocs.astype(values.dtype), frees.astype(values.dtype)])[order]

    return RequestStream(
        device=stream.device,
        is_alloc=joined(stream.is_alloc, np.ones(m, bool), np.zeros(m, bool)),
        deferred=joined(stream.deferred, np.zeros(m, bool), np.zeros(m, bool)),
        alloc_of=joined(old_of, np.full(m, -1), new_index[n : n + m]),
        requested=joined(stream.requested, cols["requested"][ooms], zeros),
        time_ns=joined(stream.time_ns, cols["time_ns"][ooms], cols["time_ns"][ooms]),
        address=joined(stream.address, zeros, zeros),
        tag=joined(stream.tag, cols["tag"][ooms], np.full(m, NO_INDEX)),
        stack=joined(stream.stack, cols["stack"][ooms], np.full(m, NO_INDEX)),
        position=joined(stream.position, ooms, ooms),
        unmatched_frees=stream.unmatched_frees,
        failed=joined(np.zeros(n, bool), np.ones(m, bool), np.ones(m, bool)),
    )
