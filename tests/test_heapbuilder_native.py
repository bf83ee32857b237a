"""The native heap builder (C) against the Python one: the same rows, states and errors for any
sequence of decisions, sensible or contradictory."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuviz import EventLog
from gpuviz.log.heapbuilder import HeapConflict, NativeHeapBuilder, PythonHeapBuilder, native_heap_available

pytestmark = pytest.mark.skipif(not native_heap_available(), reason="the C heap core is not built")

BASE = 1 << 40
UNIT = 256

# an operation: (name, a, b, c) with small numbers scaled to addresses inside four 64 KiB regions
_ops = st.lists(
    st.tuples(
        st.sampled_from(
            [
                *("segment_alloc", "segment_free", "alloc", "alloc", "alloc", "free", "free", "oom", "query"),
                *("segment_map", "segment_map", "segment_unmap", "segment_unmap"),
            ]
        ),
        st.integers(0, 1023),
        st.integers(0, 300),
        st.integers(0, 5),
    ),
    max_size=120,
)


def _run(builder: type[Any], ops: list[tuple[str, int, int, int]]) -> tuple[list[Any], EventLog, Any]:
    log = EventLog(flush_rows=16, arena=False)  # batches of 5 rows (a bytearray's): the rows cross many flushes
    heap = builder(log, log.add_device("GPU:0"))
    for tag in range(6):
        log.intern_string(f"op{tag}")
    outcomes: list[Any] = []
    for time, (name, a, b, c) in enumerate(ops):
        address = BASE + a * UNIT
        try:
            if name == "segment_alloc":
                outcomes.append(heap.segment_alloc(time, BASE + (a // 256) * 256 * UNIT, b * UNIT - UNIT, stack=c))
            elif name == "segment_free":
                outcomes.append(heap.segment_free(time, BASE + (a // 256) * 256 * UNIT, thread=c))
            elif name == "alloc":
                outcomes.append(heap.alloc(time, address, b * UNIT - (c == 0) * UNIT, b * UNIT - c, tag=c, stack=c))
            elif name == "free":
                live = [s.chunks for s in heap.state().segments]
                starts = [ch.address for chunks in live for ch in chunks if ch.in_use]
                target = starts[a % len(starts)] if starts and c else address
                outcomes.append(heap.free(time, target, duration_ns=b, stack=None if c % 2 else c))
            elif name == "segment_map":  # c > 0: a range touching a segment (below or above), else anywhere
                segments = sorted(heap.segments.items())
                size = b * UNIT
                if segments and c:
                    base, length = segments[a % len(segments)]
                    target = base + length if c % 2 else base - size
                else:
                    target = BASE + (a // 16) * 16 * UNIT
                outcomes.append(heap.segment_map(time, target, size, stack=c))
            elif name == "segment_unmap":  # c > 0: a piece of a free chunk, as a growing segment returns one
                free = [ch for seg in heap.state().segments for ch in seg.chunks if not ch.in_use]
                if free and c:
                    chunk = free[a % len(free)]
                    offset = (b * UNIT) % chunk.size
                    target, size = chunk.address + offset // 2, max(chunk.size - offset, UNIT) - c % 2 * UNIT
                else:
                    target, size = address, b * UNIT
                outcomes.append(heap.segment_unmap(time, target, size, thread=c))
            elif name == "oom":
                outcomes.append(heap.oom(time, b, b + c, tag=c))
            else:
                outcomes.append(
                    (heap.chunk_at(address), heap.segment_of(address), heap.is_live(address), heap.largest_free)
                )
                outcomes.append(heap.live_size(address))
        except HeapConflict as exc:
            outcomes.append(("conflict", str(exc)))
    log.flush()
    return outcomes, log, heap


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_native_builder_writes_the_same_rows_states_and_errors(ops: list[tuple[str, int, int, int]]) -> None:
    native = _run(NativeHeapBuilder, ops)
    python = _run(PythonHeapBuilder, ops)
    assert native[0] == python[0]
    assert len(native[1]) == len(python[1])
    for name, column in python[1].columns.items():
        assert np.array_equal(native[1].columns[name], column), name
    assert native[2].state() == python[2].state() and native[2].segments == python[2].segments


def test_the_messages_name_addresses_in_hex() -> None:
    log = EventLog()
    heap = NativeHeapBuilder(log, log.add_device("GPU:0"))
    heap.segment_alloc(0, BASE, 4096)
    overlap = r"^segment \[0x10000000800, \+4096\) overlaps the segment at 0x10000000000$"
    with pytest.raises(HeapConflict, match=overlap):
        heap.segment_alloc(1, BASE + 2048, 4096)
    with pytest.raises(HeapConflict, match=r"^free of 0x10000000000, which is not a live allocation$"):
        heap.free(2, BASE)
    assert len(log) == 1


def test_free_sizes_that_come_and_go_keep_the_largest_free_exact() -> None:
    """Thousands of distinct free sizes appear and vanish (the native heap's max-heap of sizes is
    rebuilt from the sizes present as it fills with stale ones): every row's largest_free agrees."""
    logs = []
    for builder in (NativeHeapBuilder, PythonHeapBuilder):
        log = EventLog()
        heap = builder(log, log.add_device("GPU:0"))
        heap.segment_alloc(0, BASE, 1 << 34)
        rng = np.random.default_rng(5)
        live: list[int] = []
        address = BASE
        for time in range(6000):
            if live and rng.random() < 0.5:
                heap.free(time, live.pop(int(rng.integers(len(live)))))
            else:
                size = UNIT * int(rng.integers(1, 4000))
                heap.alloc(time, address, size, size)
                live.append(address)
                address += size
        log.flush()
        logs.append(log)
    native, python = logs
    assert len(native) == len(python) > 12_000
    assert len(set(python["largest_free"].tolist())) > 1000
    for name, column in python.columns.items():
        assert np.array_equal(native.columns[name], column), name
