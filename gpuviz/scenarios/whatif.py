"""What if: replay a run's request stream under other allocator policies and compare them.

``whatif(log, ["torch", "tf-bfc"], capacity="16GiB")`` takes one device's requests (every
allocation with its requested bytes, in order, and every free; ``analysis.requests``), serves
them with a fresh allocator of each policy over a simulated device of ``capacity`` bytes
(unbounded when None), and measures each replay (``analysis.comparison``). Each replay is an
ordinary EventLog whose times are the source's, so every view works on every alternative.

A replay stops at the policy's first out-of-memory error (the run would have failed there),
unless ``stop_at_oom=False``, which skips that request and its free and goes on. The requests
the run itself failed (its ``oom`` events) are replayed too, each an allocation freed at once
(the program never held it): every policy says whether it would have served them
(``PolicyOutcome.source_ooms``), and a policy fits only if it serves them as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gpuviz.analysis.comparison import RECORDED, Comparison, PolicyOutcome, outcome
from gpuviz.analysis.requests import RequestStream, request_stream
from gpuviz.analysis.timeline import timeline_series
from gpuviz.base.errors import OutOfMemoryError
from gpuviz.base.units import parse_bytes
from gpuviz.capture.bfc import ReferenceBFCAllocator
from gpuviz.capture.upstream import SimUpstream, Upstream
from gpuviz.log.eventlog import NO_INDEX, EventLog
from gpuviz.log.schema import Kind
from gpuviz.scenarios.native import replay_native
from gpuviz.scenarios.policies import Policy, PolicyAllocator, parse_policy
from gpuviz.scenarios.torch_caching import TorchCachingAllocator

__all__ = ["whatif", "replay_policy", "busiest_device", "smallest_capacity", "served_failed", "UNBOUNDED"]

UNBOUNDED = 1 << 50  # the simulated device when no capacity is given: 1 PiB


def busiest_device(log: EventLog) -> str:
    """The device with the most allocations (GPUs first on ties); ``ValueError`` when there are none."""
    cols = log.columns
    allocs = cols["device"][cols["kind"] == Kind.ALLOC]
    if not len(allocs):
        raise ValueError("the log has no allocations to replay")
    counts = np.bincount(allocs.astype(np.int64), minlength=len(log.devices))
    order = sorted(range(len(counts)), key=lambda i: (-counts[i], not log.devices[i].name.startswith("GPU"), i))
    return log.devices[order[0]].name


def replay_policy(
    stream: RequestStream,
    source: EventLog,
    policy: Policy,
    upstream: Upstream,
    *,
    stop_at_oom: bool = True,
    allocator: PolicyAllocator | None = None,
) -> tuple[EventLog, int]:
    """Serve ``stream`` with ``policy`` over ``upstream``; returns the replay's log (with the source's
    times) and how many requests were served. ``allocator``: an already built (e.g. seeded) one."""
    alloc = allocator if allocator is not None else policy.build(upstream, device=stream.device, log=EventLog())
    if allocator is None:  # torch, rmm-pool and no-pool in C where built (the same log; see native.py)
        replayed = replay_native(stream, source, alloc, upstream, stop_at_oom=stop_at_oom)
        if replayed is not None:
            return replayed
    log = alloc.log
    strings = source.strings
    tag_ids: dict[int, int] = {}
    stack_ids: dict[int, int] = {}

    def local_tag(tag: int) -> int:
        return NO_INDEX if tag < 0 else tag_ids.setdefault(tag, log.intern_string(strings[tag]))

    def local_stack(stack: int) -> int:
        return NO_INDEX if stack < 0 else stack_ids.setdefault(stack, log.intern_stack(source.stacks[stack]))

    addresses = np.full(len(stream), -1, dtype=np.int64)
    starts = [len(log)]  # log length before each request
    times = stream.time_ns.tolist()
    requests = zip(
        stream.is_alloc.tolist(), stream.requested.tolist(), stream.tag.tolist(), stream.stack.tolist(), times,
        strict=True,
    )  # fmt: skip
    # free requests that waited on other streams: PyTorch's model defers the block's return to its
    # completion (or a synchronization); other policies return memory at the completion itself
    defers = isinstance(alloc, TorchCachingAllocator)
    deferred = stream.deferred.tolist()
    waiting: set[tuple[int, int]] = set()  # (allocation's position in the stream, address): deferred frees
    served = 0
    for i, (is_alloc, requested, tag, stack, time_ns) in enumerate(requests):
        if not isinstance(alloc, ReferenceBFCAllocator):
            alloc.time_ns = time_ns
        if is_alloc:
            try:
                if isinstance(alloc, ReferenceBFCAllocator):
                    address = alloc.allocate(requested, tag=strings[tag] if tag >= 0 else None)
                else:
                    address = alloc.allocate(requested, tag=local_tag(tag), stack=local_stack(stack))
            except OutOfMemoryError:
                starts.append(len(log))
                if stop_at_oom:
                    break
                continue
            addresses[i] = address
        else:
            made = int(stream.alloc_of[i])
            # -1: an allocation from before the stream, alive in a seeded allocator at the source's address
            address = int(addresses[made]) if made >= 0 else int(stream.address[i])
            if address < 0:  # its allocation failed and was skipped
                starts.append(len(log))
                continue
            if deferred[i]:
                if defers:
                    assert isinstance(alloc, TorchCachingAllocator)
                    alloc.free(address, deferred=True, key=(made, address))
                    waiting.add((made, address))
            elif (made, address) in waiting:
                assert isinstance(alloc, TorchCachingAllocator)
                waiting.discard((made, address))
                alloc.complete_free(address, key=(made, address))
            else:
                alloc.free(address)
        served += 1
        starts.append(len(log))
    log.flush()
    # every event a request caused gets the request's source time
    n = len(log)
    bounds = np.asarray(starts, dtype=np.int64)
    counts = np.diff(bounds)
    before = np.full(bounds[0], times[0] if times else 0, dtype=np.int64)
    during = np.repeat(np.asarray(times[: len(counts)], dtype=np.int64), counts)
    after = np.full(n - bounds[-1], times[len(counts) - 1] if len(counts) else 0, dtype=np.int64)
    return log.with_columns(time_ns=np.concatenate([before, during, after])), served


def whatif(
    log: EventLog | str | Path,
    policies: Sequence[str | Policy] = ("tf-bfc", "torch", "rmm-pool", "no-pool"),
    capacity: int | str | None = None,
    *,
    device: str | None = None,
    stop_at_oom: bool = True,
    include_source: bool = True,
) -> Comparison:
    """Replay ``log``'s requests on ``device`` (default: the one with most allocations) under each policy.

    ``log`` may be a path in any format ``gpuviz.load`` reads. ``capacity``: the device's memory
    (bytes or ``"16GiB"``); None: unbounded. ``include_source``: also list the run as it happened
    (as "recorded"). Returns a ``Comparison`` (displays as a side-by-side view in notebooks).
    """
    if not isinstance(log, EventLog):
        from gpuviz.importers import load

        log = load(log)
    chosen = [parse_policy(p) for p in policies]
    if not chosen:
        raise ValueError("name at least one policy")
    labels = [p.label for p in chosen]
    if len(set(labels)) != len(labels):
        raise ValueError(f"policies must differ; got {labels}")
    size = None if capacity is None else parse_bytes(capacity, name="capacity")
    if size is None:
        preallocating = [p.label for p in chosen if p.kind == "tf-bfc" and p.options.get("growth") is False]
        if preallocating:
            raise ValueError(f"{', '.join(preallocating)} preallocates the whole device: give a capacity")
    name = device if device is not None else busiest_device(log)
    stream = request_stream(log, name, failed=True)
    failed = stream.failed_allocations
    outcomes: list[PolicyOutcome] = []
    if include_source:
        served = len(stream) - 2 * len(failed)
        source_ooms = (False,) * len(failed)
        outcomes.append(outcome(RECORDED, log, name, requests=len(stream), served=served, source_ooms=source_ooms))
    for policy in chosen:
        upstream = SimUpstream(size if size is not None else UNBOUNDED)
        replayed, served = replay_policy(stream, log, policy, upstream, stop_at_oom=stop_at_oom)
        source_ooms = served_failed(stream, replayed, served, stop_at_oom=stop_at_oom)
        outcomes.append(
            outcome(policy.label, replayed, name, requests=len(stream), served=served, source_ooms=source_ooms)
        )
    notes = []
    if stream.unmatched_frees:
        notes.append(f"{stream.unmatched_frees} frees of allocations made before the log began were left out")
    if len(failed):
        notes.append(
            f"the run failed {_requests(len(failed))} (out of memory): each policy replays them too, as an allocation"
            " freed at once (the program never held it)"
        )
    source = str(log.meta.get("source", {}).get("file", "")) if isinstance(log.meta.get("source"), dict) else ""
    return Comparison(
        source=source, device=name, capacity=size, outcomes=tuple(outcomes), notes=tuple(notes),
        resolve=policy_label,
    )  # fmt: skip


def policy_label(spec: str) -> str:
    """The label of the policy ``spec`` selects (what a Comparison names it)."""
    return parse_policy(spec).label


def _requests(count: int) -> str:
    return f"{count} request" if count == 1 else f"{count} requests"


def served_failed(stream: RequestStream, replayed: EventLog, served: int, *, stop_at_oom: bool) -> tuple[bool, ...]:
    """For each request the source failed (``stream.failed_allocations``), whether the replay served it."""
    failed = stream.failed_allocations.tolist()
    if stop_at_oom:  # the replay served its requests in order up to its first OOM
        return tuple(index < served for index in failed)
    cols = replayed.columns
    is_oom = cols["kind"] == Kind.OOM
    refused = set(zip(cols["time_ns"][is_oom].tolist(), cols["requested"][is_oom].tolist(), strict=True))
    return tuple((int(stream.time_ns[index]), int(stream.requested[index])) not in refused for index in failed)


def smallest_capacity(
    log: EventLog,
    policy: str | Policy,
    *,
    device: str | None = None,
    resolution: int | str = "64MiB",
    upper: int | str | None = None,
) -> int:
    """The smallest device memory (bytes, a multiple of ``resolution``) on which ``policy`` serves
    every request of ``log`` without running out of memory: "what would have fit?".

    Found by bisection between the most bytes the program ever held and ``upper`` (default: what
    the policy reserves on an unbounded device), assuming more memory never hurts a policy.
    """
    chosen = parse_policy(policy)
    step = parse_bytes(resolution, name="resolution")
    if step <= 0:
        raise ValueError("resolution must be positive")
    name = device if device is not None else busiest_device(log)
    stream = request_stream(log, name, failed=True)

    def fits(capacity: int) -> bool:
        _, served = replay_policy(stream, log, chosen, SimUpstream(capacity))
        return served == len(stream)

    if upper is None:
        if chosen.kind == "tf-bfc" and chosen.options.get("growth") is False:
            raise ValueError("a preallocating policy needs an upper bound: give upper=")
        unbounded, _ = replay_policy(stream, log, chosen, SimUpstream(UNBOUNDED))
        high = int(timeline_series(unbounded, name).pool_bytes.max(initial=0))
    else:
        high = parse_bytes(upper, name="upper")
    high = -(-high // step) * step
    if not fits(high):
        raise ValueError(f"{chosen.label} does not fit even in {high} bytes")
    low = max(int(stream.requested[stream.is_alloc].max(initial=0)), step) // step * step - step
    while high - low > step:  # invariant: fits(high), not fits(low) (or low below any need)
        middle = (low + high) // 2 // step * step
        if fits(middle):
            high = middle
        else:
            low = middle
    return high
