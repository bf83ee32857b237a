"""TF memory records held as columns read back exactly as the records put in, in time order."""

from __future__ import annotations

import pytest

from gpuviz.importers.memory_columns import MemoryColumnsBuilder
from gpuviz.importers.tf_memory import MemoryRecord


def _record(i: int, time_ns: int) -> MemoryRecord:
    return MemoryRecord(
        time_ns=time_ns, is_alloc=i % 2 == 0, allocator=("GPU_0_bfc", "gpu_host_bfc")[i % 3 == 0],
        address=(1 << 40) + 256 * i, requested=100 + i, size=256, bytes_in_use=-1 if i == 4 else 256 * i,
        peak_bytes_in_use=512 * i, fragmentation=-1.0 if i == 5 else i / 10, op=f"op{i % 2}",
        dtype=None if i == 1 else "float32", shape=None if i == 2 else "[64]", region_type="output" if i else "",
        step=None if i == 3 else i - 7, thread=7 - i,
    )  # fmt: skip


def test_records_come_back_exactly_and_sorted_stably_by_time() -> None:
    times = [50, 10, 50, 30, 10, 20, 50, 0]
    records = [_record(i, t) for i, t in enumerate(times)]
    builder = MemoryColumnsBuilder()
    for record in records:
        builder.add(record)
    columns = builder.build()
    assert list(columns) == records and len(columns) == 8
    ordered = columns.sorted_by_time()
    want = sorted(records, key=lambda r: r.time_ns)  # stable, like the list sort it replaces
    assert list(ordered) == want
    assert ordered[0] == want[0] and ordered[-1] == want[-1] and ordered[2:5] == want[2:5]
    assert ordered[::3] == want[::3]
    with pytest.raises(IndexError):
        ordered[8]
    # in order of first appearance: record 7 (time 0) is GPU_0_bfc's, record 3 (time 30) the host's
    assert list(ordered.counts(0).items()) == [("GPU_0_bfc", 5), ("gpu_host_bfc", 3)]
    # allocations (even records) in time order: 4, 0 (region ""), 2, 6
    assert list(ordered.counts(4, allocations_only=True).items()) == [("output", 3), ("", 1)]
