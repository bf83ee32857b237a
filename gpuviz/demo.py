"""The demo workload: a small training-like loop on a device's allocator.

It preallocates the pool (TensorFlow's default), interleaves long- and short-lived buffers so that free memory
fragments, and ends with a request that fails although enough bytes are free in total.
"""

from __future__ import annotations

from gpuviz.base.errors import OutOfMemoryError
from gpuviz.base.units import MiB
from gpuviz.capture.bfc import BFCAllocator
from gpuviz.capture.marks import span
from gpuviz.capture.upstream import SimUpstream
from gpuviz.log.eventlog import EventLog

__all__ = ["run_demo"]


def run_demo(log: EventLog, *, capacity: str = "1GiB", steps: int = 8) -> BFCAllocator:
    """Run the workload on a simulated GPU of ``capacity``, recording into ``log``."""
    allocator = BFCAllocator(SimUpstream(capacity), growth=False, device="GPU:0", log=log)
    weights = [allocator.allocate(24 * MiB, tag=f"weights/layer{i}") for i in range(4)]
    kept = []
    for step in range(steps):
        with span(f"step {step}", log=log):
            activations = [allocator.allocate((8 + 4 * i) * MiB + 1000, tag=f"activation/{i}") for i in range(6)]
            grads = [allocator.allocate(24 * MiB, tag=f"grad/layer{i}") for i in range(4)]
            kept.append(allocator.allocate(3 * MiB, tag="metrics"))  # small and long-lived
            for address in activations + grads:
                allocator.free(address)
    # Ask for more than any free chunk holds, but less than what is free in total:
    # an OOM caused by fragmentation.
    stats = allocator.stats()
    request = stats.largest_free_block_bytes + 1 * MiB
    try:
        allocator.allocate(request, tag="big-batch")
    except OutOfMemoryError as error:
        log.meta["demo_oom"] = str(error)
    for address in weights:
        allocator.free(address)
    return allocator
