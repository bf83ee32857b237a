"""Thread safety: concurrent allocate/free, and frees that arrive during an allocation."""

from __future__ import annotations

import random
import threading

from gpuviz import SimUpstream, replay
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.capture.upstream import SimUpstream as _Sim


def test_eight_threads_allocating_and_freeing(bfc: type[ReferenceBFCAllocator]) -> None:
    alloc = bfc(SimUpstream("4GiB"), growth=True)
    errors: list[BaseException] = []
    totals: list[int] = []
    together = threading.Barrier(8)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        live: list[int] = []
        count = 0
        together.wait()
        try:
            for _ in range(1500):
                if live and rng.random() < 0.45:
                    alloc.free(live.pop(rng.randrange(len(live))))
                else:
                    live.append(alloc.allocate(rng.choice([1, 300, 4096, 70_000, 1 << 20])))
                    count += 1
            for p in live:
                alloc.free(p)
            totals.append(count)
            together.wait()  # all 8 are alive at once, so their thread ids differ
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    alloc.check()
    stats = alloc.stats()
    assert stats.bytes_in_use == 0
    assert stats.num_allocs == sum(totals)
    log = alloc.log
    assert len(log.filter(kind="alloc")) == len(log.filter(kind="free")) == sum(totals)
    assert replay(log).state_at(-1) == alloc.state()
    assert len(set(log["thread"].tolist())) == 8


class _FreeingUpstream(_Sim):
    """An upstream whose allocate runs a free, as a garbage-collector finalizer would."""

    victim: ReferenceBFCAllocator | None = None
    address = 0

    def allocate(self, nbytes: int) -> int:
        if self.victim is not None and self.address:
            self.victim.free(self.address)
            self.address = 0
        return super().allocate(nbytes)


def test_free_arriving_inside_an_allocation_is_deferred_and_applied(bfc: type[ReferenceBFCAllocator]) -> None:
    upstream = _FreeingUpstream("1GiB")
    alloc = bfc(upstream, growth=True)
    p = alloc.allocate(1 << 20)  # fills the first 2 MiB segment partly
    alloc.allocate(1 << 20)
    upstream.victim, upstream.address = alloc, p
    alloc.allocate(8 << 20)  # needs a new segment: the upstream frees p mid-allocation
    assert upstream.address == 0
    alloc.check()
    assert alloc.stats().bytes_in_use == (1 << 20) + (8 << 20)
    assert replay(alloc.log).state_at(-1) == alloc.state()
