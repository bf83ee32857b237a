"""The importer foundation: the heap builder that keeps foreign traces replayable, and ``load``'s dispatch."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from counting import ProgressCounter
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuviz
from gpuviz import EventLog, LogFormatError, replay
from gpuviz.importers import detect, formats, load
from gpuviz.importers.builder import HeapBuilder, HeapConflict, infer_segments, set_source_meta
from gpuviz.importers.source import HEAD_BYTES, Source

BASE = 1 << 40
KiB = 1 << 10


def _builder() -> tuple[EventLog, HeapBuilder]:
    log = EventLog()
    return log, HeapBuilder(log, log.add_device("GPU:0"))


def test_alloc_inside_a_free_chunk_splits_exactly_and_free_coalesces() -> None:
    log, heap = _builder()
    heap.segment_alloc(0, BASE, 16 * KiB)
    heap.alloc(1, BASE + 4 * KiB, 2 * KiB, 2000)  # in the middle: two splits
    assert [(e.kind, e.address - BASE, e.size) for e in log] == [
        ("segment_alloc", 0, 16 * KiB),
        ("split", 0, 4 * KiB),
        ("split", 4 * KiB, 2 * KiB),
        ("alloc", 4 * KiB, 2 * KiB),
    ]
    assert [e.largest_free for e in log] == [16 * KiB, 12 * KiB, 10 * KiB, 10 * KiB]
    heap.alloc(2, BASE, 4 * KiB, 4 * KiB)  # the whole lower free chunk: no split
    assert log[-1].kind == "alloc"
    assert heap.free(3, BASE + 4 * KiB) == 2 * KiB  # merges with the next free chunk only
    assert [(e.kind, e.address - BASE, e.size) for e in log[-2:]] == [
        ("free", 4 * KiB, 2 * KiB),
        ("merge", 4 * KiB, 12 * KiB),
    ]
    heap.free(4, BASE)  # merges with the next, which now spans the rest
    assert [(e.kind, e.address - BASE, e.size) for e in log[-2:]] == [("free", 0, 4 * KiB), ("merge", 0, 16 * KiB)]
    heap.segment_free(5, BASE)
    state = replay(log).state_at(-1)
    assert state.segments == () and heap.state() == state


def test_conflicting_trace_raises_and_changes_nothing() -> None:
    log, heap = _builder()
    heap.segment_alloc(0, BASE, 8 * KiB)
    heap.alloc(1, BASE, 4 * KiB, 100)
    before = (heap.state(), len(log))
    with pytest.raises(HeapConflict, match="overlaps the live allocation"):
        heap.alloc(2, BASE + KiB, KiB, 1)
    with pytest.raises(HeapConflict, match="outside every segment"):
        heap.alloc(2, BASE + 64 * KiB, KiB, 1)
    with pytest.raises(HeapConflict, match="runs past the free chunk"):
        heap.alloc(2, BASE + 6 * KiB, 4 * KiB, 1)
    with pytest.raises(HeapConflict, match="not a live allocation"):
        heap.free(2, BASE + 4 * KiB)
    with pytest.raises(HeapConflict, match="not wholly free"):
        heap.segment_free(2, BASE)
    with pytest.raises(HeapConflict, match="overlaps the segment"):
        heap.segment_alloc(2, BASE + 4 * KiB, 8 * KiB)
    assert (heap.state(), len(log)) == before


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 63), st.integers(1, 8), st.booleans()), min_size=1, max_size=80))
def test_random_traces_replay_to_the_builders_heap_with_exact_largest_free(ops: list[tuple[int, int, bool]]) -> None:
    """Any sequence of allocations at free addresses and frees replays to the same heap, and the
    ``largest_free`` column is what replay finds after every event."""
    log, heap = _builder()
    unit = 256
    heap.segment_alloc(0, BASE, 64 * unit)
    heap.segment_alloc(0, BASE + 100 * unit, 32 * unit)
    live: list[int] = []
    for t, (slot, length, do_free) in enumerate(ops, start=1):
        if do_free and live:
            heap.free(t, live.pop(slot % len(live)))
            continue
        address = BASE + slot * unit if slot < 64 else BASE + 100 * unit + (slot - 64) * unit
        try:
            heap.alloc(t, address, length * unit, length * unit - 1)
        except HeapConflict:
            continue
        live.append(address)
        heap.check()
    heap.check()
    r = replay(log)
    assert r.state_at(-1) == heap.state()
    for index, value in enumerate(log["largest_free"].tolist()):
        assert value == r.state_at(index).largest_free_chunk, index


def test_infer_segments_joins_touching_and_overlapping_ranges() -> None:
    assert infer_segments([(100, 10), (110, 5), (200, 8), (104, 2), (300, 0)]) == [(100, 15), (200, 8)]


def test_source_meta_rejects_unknown_fidelity() -> None:
    log = EventLog()
    with pytest.raises(ValueError, match="column fidelity"):
        set_source_meta(log, format="x", file="f", columns={"address": "guessed"})
    set_source_meta(log, format="x", file="f", version="1", tool="t", columns={"address": "exact"}, notes=["n"])
    assert log.meta["source"] == {"format": "x", "version": "1", "tool": "t", "file": "f"}
    assert log.meta["columns"] == {"address": "exact"} and log.meta["notes"] == ["n"]


def test_load_opens_gpuviz_logs_by_content_whatever_the_name(tmp_path: Path) -> None:
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"))
    alloc.allocate(1000)
    odd_name = tmp_path / "run.data"
    alloc.log.save(odd_name)
    assert detect(odd_name) == "gpuviz"
    loaded = gpuviz.load(odd_name)
    assert len(loaded) == len(alloc.log) and loaded.columns["address"].tolist() == alloc.log["address"].tolist()


def test_unknown_files_name_what_they_are_not_and_the_formats_tried(tmp_path: Path) -> None:
    names = [name for name, _ in formats()]
    assert names[0] == "gpuviz"
    cases = {
        "empty.json": (b"", "it is empty"),
        "other.json": (
            b'{"hello": 1, "world": [1]}',
            "a JSON object with top-level keys hello, world: not a format gpuviz opens",
        ),
        "binary.bin": (b"\x00\x01\x02garbage", "starts with bytes"),
    }
    for name, (content, what) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(LogFormatError) as info:
            load(path)
        message = str(info.value)
        assert str(path) in message and what in message and "Formats tried: a gpuviz event log" in message
    compressed = tmp_path / "other.json.gz"
    compressed.write_bytes(gzip.compress(b'{"hello": 1}'))
    expected = (
        r"\(gzip-compressed\) is not a gpuviz event log nor a trace gpuviz can open:"
        " it is a JSON object with top-level keys hello: not a format"
    )
    with pytest.raises(LogFormatError, match=expected):
        load(compressed)
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing.arrow")
    with pytest.raises(IsADirectoryError):
        load(tmp_path)


def test_source_sniffs_decompressed_content_and_counts_progress_in_disk_bytes(tmp_path: Path) -> None:
    payload = b"x" * (3 * HEAD_BYTES)
    path = tmp_path / "data.gz"
    path.write_bytes(gzip.compress(payload))
    seen: list[int] = []

    source = Source(path, progress=ProgressCounter(seen))
    assert source.compressed and source.head == payload[:HEAD_BYTES]
    assert source.read_all() == payload
    assert sum(seen) == path.stat().st_size
    cut = tmp_path / "cut.gz"
    cut.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(LogFormatError, match="gzip stream is truncated or corrupt"):
        Source(cut).read_all()


def test_a_gzip_file_is_mapped_from_a_spool_file_never_whole_in_memory(tmp_path: Path) -> None:
    import mmap

    payload = bytes(range(256)) * 20_000  # 5 MB: several spool chunks
    path = tmp_path / "data.pb.gz"
    path.write_bytes(gzip.compress(payload))
    seen: list[int] = []

    mapped = Source(path, progress=ProgressCounter(seen)).mapped()
    assert isinstance(mapped, mmap.mmap)
    assert len(mapped) == len(payload) and mapped[:] == payload
    mapped.close()
    assert sum(seen) == path.stat().st_size
    empty = tmp_path / "empty.gz"
    empty.write_bytes(gzip.compress(b""))
    assert Source(empty).mapped() == b""
    cut = tmp_path / "cut.gz"
    cut.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(LogFormatError, match=r"cut\.gz: the gzip stream is truncated or corrupt"):
        Source(cut).mapped()
