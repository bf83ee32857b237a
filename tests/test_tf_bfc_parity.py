"""gpuviz's allocator against TensorFlow's own BFC allocator, decision by decision.

The fixtures in tests/fixtures/tf_bfc are XSpaces written by TF's profiler while TF's CPU BFC
allocator (``TF_CPU_ALLOCATOR_USE_BFC=true``, growth on) served small workloads
(tests/fixtures/tf_bfc/generate.py, manifest.json: TF version, limits). Each trace's request
stream drives a gpuviz allocator whose upstream hands out TF's region addresses: when the
allocator grows, the new region starts at the address TF gave the request that made it grow.
Every address, chunk size and bytes-in-use value must equal TensorFlow's, and so must the
peak bytes in use and the fragmentation TF reports after each decision (which ties the pool
size and the largest free chunk to TF's as well).

``ALLOCATORS`` lists the allocator classes under test (factories taking an upstream, the memory
limit and the device's event log); add another implementation to prove it the same way.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ALLOCATOR_FACTORIES

import gpuviz
from gpuviz import EventLog, OutOfMemoryError, replay
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.importers.xplane import MemoryRecord, decode_memory_records

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tf_bfc"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
WORKLOADS = sorted(MANIFEST["workloads"])

Factory = Callable[[Any, int, EventLog], Any]


def _factory(cls: Callable[..., ReferenceBFCAllocator]) -> Factory:
    return lambda upstream, limit, log: cls(upstream, memory_limit=limit, growth=True, log=log)


ALLOCATORS: dict[str, Factory] = {name: _factory(cls) for name, cls in ALLOCATOR_FACTORIES.items()}
"""The Python reference and, where a C compiler built it, the native core."""


class TFRegions:
    """An upstream that hands out TensorFlow's region addresses.

    ``expect(address)`` names the address TF gave the request about to be made; if the
    allocator asks for a region during that request, the region starts there. A region
    that overlaps one already handed out means the allocator grew where TF did not.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.regions: list[tuple[int, int]] = []
        self._next: int | None = None

    def expect(self, address: int) -> None:
        self._next = address

    def allocate(self, nbytes: int) -> int:
        base = self._next
        assert base is not None, "the allocator asked for a region outside a request"
        for start, size in self.regions:
            assert not (base < start + size and start < base + nbytes), (
                f"the allocator grew by {nbytes} bytes at {base:#x}, inside TF's region at {start:#x}: "
                "TensorFlow served this request from memory it already had"
            )
        self.regions.append((base, nbytes))
        self._next = None
        return base

    def free(self, address: int) -> None:
        raise AssertionError(f"the allocator returned the region at {address:#x}; TF's growth allocator never does")


def _records(name: str) -> list[MemoryRecord]:
    _, records = decode_memory_records(gzip.decompress((FIXTURES / f"{name}.xplane.pb.gz").read_bytes()))
    assert {r.allocator for r in records} == {"bfc_cpu_allocator_for_gpu"}
    # the trace is complete: nothing was in use before its first event
    assert records[0].is_alloc and records[0].bytes_in_use == records[0].size
    return records


def _drive(factory: Factory, name: str) -> tuple[Any, TFRegions, EventLog, int]:
    """Replay TF's request stream through a fresh allocator; assert every decision; returns
    the allocator, its upstream, its log and the number of decisions compared."""
    limit = MANIFEST["workloads"][name]["memory_limit_bytes"]
    upstream = TFRegions(limit)
    log = EventLog()
    allocator = factory(upstream, limit, log)
    compared = 0
    for i, record in enumerate(_records(name)):
        where = f"{name} event {i} ({'alloc' if record.is_alloc else 'free'} {record.requested} B, op {record.op!r})"
        if record.is_alloc:
            upstream.expect(record.address)
            address = allocator.allocate(record.requested)
            assert address == record.address, f"{where}: address {address:#x}, TF {record.address:#x}"
            assert allocator.allocated_size(address) == record.size, f"{where}: chunk size"
        else:
            assert allocator.allocated_size(record.address) == record.size, f"{where}: chunk size"
            allocator.free(record.address)
        stats = allocator.stats()
        assert stats.bytes_in_use == record.bytes_in_use, f"{where}: bytes in use"
        assert stats.peak_bytes_in_use == record.peak_bytes_in_use, f"{where}: peak bytes in use"
        # (free - largest free chunk) / free, free = pool - in use: TF's trace prints it with 6 digits
        assert float(f"{stats.fragmentation:.6g}") == record.fragmentation, f"{where}: fragmentation"
        compared += 1
    return allocator, upstream, log, compared


MiB = 1 << 20
# decisions compared, sizes of the regions grown (at TF's addresses), peak bytes in use
EXPECTED = {
    "churn": (852, [2 * MiB, 8 * MiB, 8 * MiB, 16 * MiB, 30 * MiB], 49772288),  # the last region: the limit's rest
    "keras_fit": (3811, [2 * MiB], 115968),
    "large_split_rule": (28, [2 * MiB, 512 * MiB, 512 * MiB], 881852928),
    "oom": (20, [2 * MiB, 8 * MiB, 8 * MiB, 16 * MiB, 14 * MiB], 48234752),
}


@pytest.mark.parametrize("factory", list(ALLOCATORS.values()), ids=list(ALLOCATORS))
@pytest.mark.parametrize("name", WORKLOADS)
def test_every_decision_equals_tensorflows(factory: Factory, name: str) -> None:
    records = _records(name)
    allocator, upstream, log, compared = _drive(factory, name)
    events, regions, peak = EXPECTED[name]
    assert (compared, [size for _, size in upstream.regions], allocator.stats().peak_bytes_in_use) == (
        events,
        regions,
        peak,
    )
    assert peak == max(r.bytes_in_use for r in records)
    # the allocator's own log replays to its final state
    assert replay(log).state_at(-1) == allocator.state()


@pytest.mark.parametrize("factory", list(ALLOCATORS.values()), ids=list(ALLOCATORS))
def test_the_request_tensorflow_refused_is_refused_too(factory: Factory) -> None:
    """TF records no event for a failed request; its log names the rounded size it refused.
    At the point of failure (after the last allocation, before the frees that followed) the
    same request fails here too."""
    (refused,) = MANIFEST["workloads"]["oom"]["refused_rounded_bytes"]
    records = _records("oom")
    last_alloc = max(i for i, r in enumerate(records) if r.is_alloc)
    limit = MANIFEST["workloads"]["oom"]["memory_limit_bytes"]
    upstream = TFRegions(limit)
    allocator = factory(upstream, limit, EventLog())
    for record in records[: last_alloc + 1]:
        if record.is_alloc:
            upstream.expect(record.address)
            allocator.allocate(record.requested)
        else:
            allocator.free(record.address)
    upstream.expect(1 << 60)  # an address no TF region has: growth here would be a difference
    with pytest.raises(OutOfMemoryError) as info:
        allocator.allocate(refused)
    assert info.value.rounded == refused


def test_the_fixtures_import_as_logs_that_end_like_the_allocator() -> None:
    """The imported trace (segments inferred) ends with the same chunks in use, at the same
    addresses and sizes, as the allocator that was driven with it."""
    for name in WORKLOADS:
        log = gpuviz.load(FIXTURES / f"{name}.xplane.pb.gz")
        assert [d.name for d in log.devices] == ["CPU:0"]
        assert log.devices[0].options["allocator"] == "bfc_cpu_allocator_for_gpu"
        assert log.devices[0].options["untracked_bytes_in_use"] == 0
        imported = replay(log).state_at(-1)
        imported.check()
        allocator = _drive(ALLOCATORS["python"], name)[0]
        in_use = {(c.address, c.size, c.requested) for c in imported.chunks() if c.in_use}
        assert in_use == {(c.address, c.size, c.requested) for c in allocator.state().chunks() if c.in_use}
