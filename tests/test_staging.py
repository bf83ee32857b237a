"""The staging object of an EventLog (gpuviz.log._staging.Arena): rows are written in place into
huge-page chunks and a flush (take) hands them out where they are, without a copy; a chunk no
block holds any more is reused."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuviz import EventLog, SimUpstream
from gpuviz.analysis.replay import replay
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.capture.native import NativeBFCAllocator, native_core_available

staging = pytest.importorskip("gpuviz.log._staging", reason="built only where a C compiler exists")


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if len(view) else 0


def test_take_hands_out_the_staged_bytes_where_they_were_written() -> None:
    arena = staging.Arena()
    assert len(arena) == 0 and bytes(arena.take()) == b"" and arena.chunk_bytes() == (0, 0)
    arena.extend(b"")  # nothing to stage: no chunk yet
    assert len(arena) == 0 and arena.chunk_bytes() == (0, 0) and arena.check() is None
    arena.extend(b"0123")
    assert len(arena) == 4
    first = arena.take()
    assert bytes(first) == b"0123" and first.readonly and len(arena) == 0
    arena.extend(b"45")
    arena.extend(bytearray(b"6789"))
    second = arena.take()
    assert bytes(second) == b"456789"
    assert _address(second) == _address(first) + 4  # side by side in one chunk: no copy
    assert bytes(arena.take()) == b"" and len(arena) == 0
    assert bytes(first) == b"0123" and bytes(second) == b"456789"  # views held keep their rows
    assert arena.chunk_bytes() == (512 << 10, 10)  # the first chunk, 10 bytes written


def test_chunks_grow_from_512_kib_to_8_mib_and_a_chunk_no_view_holds_is_reused() -> None:
    arena = staging.Arena()
    views = []
    sizes = []  # KiB, of each new chunk
    for _ in range(200):  # 50 MiB held
        arena.extend(bytes(256 << 10))
        views.append(arena.take())
        size, used = arena.chunk_bytes()
        if used == 256 << 10:
            sizes.append(size >> 10)
    assert sizes == [512, 2048, 4096] + [8192] * 6
    size, used = arena.chunk_bytes()
    start = _address(views[-1]) - (used - (256 << 10))  # the current chunk's start
    views.clear()  # no view of the current chunk is alive: the next take starts it again
    arena.extend(b"x" * 10)
    kept = arena.take()
    assert bytes(kept) == b"x" * 10 and arena.chunk_bytes() == (size, 10) and _address(kept) == start
    arena.extend(b"abc")
    held = arena.take()
    assert arena.chunk_bytes() == (size, 13) and bytes(held) == b"abc" and bytes(kept) == b"x" * 10  # no rewind


def test_staged_rows_move_to_the_next_chunk_when_the_current_one_is_full() -> None:
    arena = staging.Arena()
    arena.extend(b"a" * (500 << 10))
    held = arena.take()  # keeps the first chunk from being reused
    arena.extend(b"b" * (10 << 10))  # staged, 2 KiB left
    arena.extend(b"c" * (4 << 10))  # does not fit: the staged rows move along
    assert len(arena) == 14 << 10 and arena.chunk_bytes() == (2048 << 10, 14 << 10)
    moved = arena.take()
    assert bytes(moved) == b"b" * (10 << 10) + b"c" * (4 << 10) and bytes(held) == b"a" * (500 << 10)


def test_staged_rows_move_to_the_start_of_a_chunk_no_view_holds() -> None:
    arena = staging.Arena()
    arena.extend(b"a" * (500 << 10))
    arena.take()  # dropped at once: nothing holds the chunk
    arena.extend(b"b" * (10 << 10))
    arena.extend(b"c" * (4 << 10))  # no room at the end: the staged rows go to the start, same chunk
    assert arena.chunk_bytes() == (512 << 10, 14 << 10)
    assert bytes(arena.take()) == b"b" * (10 << 10) + b"c" * (4 << 10)


def test_the_next_chunk_is_mapped_when_the_rows_reach_the_end_of_the_current_one() -> None:
    arena = staging.Arena()
    views = []
    for kib, expected in ((255, (512, 255)), (1, (512, 256)), (300, (2048, 300)), (800, (2048, 1100)),
                          (1000, (4096, 1000))):  # fmt: skip
        arena.extend(b"r" * (kib << 10))
        views.append(arena.take())
        assert tuple(value >> 10 for value in arena.chunk_bytes()) == expected
    assert [len(view) >> 10 for view in views] == [255, 1, 300, 800, 1000]
    assert all(bytes(view) == b"r" * len(view) for view in views)


def _threads() -> set[str]:
    return set(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads listed in /proc (Linux)")
def test_staging_starts_no_thread() -> None:
    """Rows are staged on the recording thread alone: nothing waits for a core that may be busy."""
    before = _threads()
    arenas = [staging.Arena() for _ in range(3)]
    held = []  # views keep their chunks from being reused: the arena goes on to new ones
    for arena in arenas:
        for _ in range(24):  # 12 MiB: chunks of 512 KiB, 2, 4 and 8 MiB
            arena.extend(b"r" * (512 << 10))
            held.append(arena.take())
        assert arena.chunk_bytes()[0] == 8 << 20 and arena.check() is None
    assert _threads() == before


def test_a_take_larger_than_a_chunk_gets_a_chunk_of_its_own() -> None:
    arena = staging.Arena()
    arena.extend(b"r" * (5 << 20))
    view = arena.take()
    assert len(view) == 5 << 20 and arena.chunk_bytes() == (6 << 20, 5 << 20)  # whole huge pages


def test_bad_input_is_refused_and_changes_nothing() -> None:
    arena = staging.Arena()
    arena.extend(b"abc")
    with pytest.raises(TypeError, match="bytes-like"):
        arena.extend("abc")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        arena.take(3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="no arguments"):
        staging.Arena(1)
    assert len(arena) == 3 and arena.chunk_bytes() == (512 << 10, 3)
    block = arena.take()
    with pytest.raises(TypeError):
        block[0] = 1  # type: ignore[index]  # blocks are read-only
    assert bytes(block) == b"abc"


def test_c_recorders_refuse_a_staging_object_that_is_neither_a_bytearray_nor_an_arena() -> None:
    if not native_core_available():
        pytest.skip("the native allocator, the recorder in C, is not built")
    core = NativeBFCAllocator(SimUpstream("1GiB"), record=False)._core
    for wrong in ([], b"rows", 0):
        with pytest.raises(TypeError, match=r"bytearray or .*Arena"):
            core.set_sink(wrong, 100, lambda: None, 0, None, None)  # type: ignore[arg-type]
    core.set_sink(staging.Arena(), 78, lambda: None, 0, None, None)  # an arena: rows written in place


@pytest.mark.parametrize("native", [True, False])
def test_rows_survive_many_flushes_in_place(native: bool, tmp_path: os.PathLike[str]) -> None:
    """Thousands of flushes of a buffer that is never re-allocated: every row arrives, in order
    (a log recording to a file flushes every flush_rows // 3 rows)."""
    if native and not native_core_available():
        pytest.skip("the native core is not built")
    log = EventLog(os.path.join(tmp_path, "run.arrow"), flush_rows=64, flush_interval_s=3600)
    alloc = (NativeBFCAllocator if native else ReferenceBFCAllocator)(SimUpstream("1GiB"), growth=True, log=log)
    live = [alloc.allocate(256 * (i % 7 + 1)) for i in range(50)]
    for i in range(5000):
        alloc.free(live[i % 50])
        live[i % 50] = alloc.allocate(512 * (i % 5 + 1))
    assert len(log._blocks) > 300  # flushed every 32 rows (the blocks are kept until read)
    cols = log.columns
    np.testing.assert_array_equal(cols["seq"], np.arange(len(log)))
    assert np.all(np.diff(cols["time_ns"]) >= 0)
    alloc.check()
    replayed = replay(log).state_at(-1)
    assert {c.address: c.size for c in replayed.chunks()} == {c.address: c.size for c in alloc.state().chunks()}
    log.close()


def test_without_the_arena_the_log_keeps_bytes_blocks_with_the_same_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pure-Python path (no compiler at install time) and a log built at once (``arena=False``)
    flush into bytes objects: same rows."""
    from gpuviz.log import recorder

    logs = []
    for arena, built in ((True, False), (False, True), (False, False)):
        if not arena and not built:
            monkeypatch.setattr(recorder, "_Arena", None)
        log = EventLog(flush_rows=16, arena=not built)  # built: a log made at once (an import) keeps bytes
        alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), growth=True, log=log)
        live = [alloc.allocate(256 * (i % 7 + 1)) for i in range(20)]
        for i in range(300):
            alloc.free(live[i % 20])
            live[i % 20] = alloc.allocate(512 * (i % 5 + 1))
        log.flush()
        assert {type(block) for block in log._blocks} == ({memoryview} if arena else {bytes})
        logs.append(log)
    with_arena = logs[0].columns
    for other in logs[1:]:
        for name in with_arena:
            if name not in ("time_ns", "thread"):
                np.testing.assert_array_equal(with_arena[name], other.columns[name], err_msg=name)
        np.testing.assert_array_equal(logs[0].rows_since(100)["address"], other.rows_since(100)["address"])


def _columns_for(n: int) -> list[np.ndarray]:
    from gpuviz.log.schema import DTYPES

    return [np.full(n, 7, dtype=dt) for dt in DTYPES.values()]


@settings(max_examples=60, deadline=None)
@given(rows=st.binary(max_size=40 * 78).map(lambda b: b[: len(b) // 78 * 78]), first=st.integers(0, 1 << 40))
def test_split_puts_each_field_of_each_row_into_its_column(rows: bytes, first: int) -> None:
    """The C split (a flush's rows into the log's columns in one pass) reads exactly what NumPy's
    view of the packed rows (``ROW_DTYPE``) reads, byte for byte, with seq counted from ``first``."""
    from gpuviz.log.schema import DTYPES, ROW_DTYPE

    n = len(rows) // 78
    columns = _columns_for(n)
    assert staging.split(rows, columns, first) is None
    view = np.frombuffer(rows, dtype=ROW_DTYPE)
    np.testing.assert_array_equal(columns[0], np.arange(first, first + n, dtype=np.int64))
    for column, name in zip(columns[1:], list(DTYPES)[1:], strict=True):
        np.testing.assert_array_equal(column, view[name], err_msg=name)


def test_split_refuses_what_is_not_whole_rows_or_the_columns_and_writes_nothing() -> None:
    rows = bytes(range(78)) * 3
    good = _columns_for(3)
    with pytest.raises(ValueError, match="77 bytes are not whole rows of 78 bytes"):
        staging.split(rows[:77], _columns_for(1), 0)
    with pytest.raises(ValueError, match="15 columns expected, got 14"):
        staging.split(rows, good[:14], 0)
    short = [*good[:13], np.full(2, 7, dtype=np.int32), good[14]]  # tag: 2 values for 3 rows
    with pytest.raises(ValueError, match="column 13 holds 8 bytes of 4-byte values, not 3 values of 4 bytes"):
        staging.split(rows, short, 0)
    wide = [*good[:2], np.full(3, 7, dtype=np.int64), *good[3:]]  # kind: 8-byte values
    with pytest.raises(ValueError, match="column 2 holds 24 bytes of 8-byte values, not 3 values of 1 bytes"):
        staging.split(rows, wide, 0)
    readonly = _columns_for(3)
    readonly[5].flags.writeable = False
    with pytest.raises((TypeError, ValueError, BufferError)):
        staging.split(rows, readonly, 0)
    with pytest.raises(TypeError, match="split\\(rows, columns, first_seq\\)"):
        staging.split(rows, good)
    for column in (*good, *short, *wide, *readonly):
        assert np.all(column == 7)  # nothing written by a refused split


def test_a_log_splits_its_rows_into_the_same_columns_with_and_without_the_c_split(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    """The two ways of splitting flushed rows into columns (C, and NumPy where the module was not
    built) give equal columns for the same rows: in the log, and in the file it records to (whose
    batches are split at every flush)."""
    from gpuviz import load
    from gpuviz.log import rows

    logs = []
    for native in (True, False):
        if not native:
            monkeypatch.setattr(rows, "_split", None)
        log = EventLog(os.path.join(tmp_path, f"{native}.arrow"), flush_rows=64)
        alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), growth=True, log=log)
        live = [alloc.allocate(256 * (i % 7 + 1), tag=f"t{i % 3}") for i in range(20)]
        for i in range(500):
            alloc.free(live[i % 20])
            live[i % 20] = alloc.allocate(512 * (i % 5 + 1))
        log.mark("end")
        log.close()
        logs.append(log)
        loaded = load(os.path.join(tmp_path, f"{native}.arrow"))
        assert not loaded.truncated and not loaded.corrupt
        for name, column in log.columns.items():
            np.testing.assert_array_equal(loaded.columns[name], column, err_msg=name)
    split_in_c, split_by_numpy = logs[0].columns, logs[1].columns
    assert len(split_in_c["seq"]) == len(split_by_numpy["seq"]) > 1000
    for name, column in split_in_c.items():
        assert column.dtype == split_by_numpy[name].dtype
        if name not in ("time_ns", "thread"):
            np.testing.assert_array_equal(column, split_by_numpy[name], err_msg=name)
    np.testing.assert_array_equal(split_in_c["seq"], np.arange(len(split_in_c["seq"])))


def test_a_log_recording_to_a_file_writes_each_block_from_where_it_was_written(tmp_path: os.PathLike[str]) -> None:
    """Each flushed block goes to the file (split into the writer's own columns, reused from
    batch to batch) and stays in the arena as it is, like a log recorded in memory: the log's
    columns are made only when it is read, and the rows reach the file in the same order."""
    from gpuviz import load

    path = os.path.join(tmp_path, "run.arrow")
    log = EventLog(path)
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), growth=True, log=log)
    live = [alloc.allocate(256) for _ in range(100)]
    for i in range(20000):  # ~40,000 rows: 3 MB, six times the first chunk
        alloc.free(live[i % 100])
        live[i % 100] = alloc.allocate(512 * (i % 5 + 1))
    log.flush()
    writer = log._recorder.writer
    assert writer is not None and writer.events == len(log) > 40000
    assert log._n_columns == 0 and sum(len(block) for block in log._blocks) == len(log) * 78  # not split yet
    scratch = getattr(writer._batches, "_scratch", None)  # the pyarrow writer's columns (the C writer's are its own)
    assert scratch is None or len(scratch[0]) == 4096 // 2  # one flush's rows: the batch size, no more
    assert log._recorder.arena.chunk_bytes()[0] > 512 << 10  # the blocks are kept: the arena went on to larger chunks
    log.close()
    loaded = load(path)
    for name, column in log.columns.items():
        np.testing.assert_array_equal(loaded.columns[name], column, err_msg=name)


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("extend"), st.integers(0, 300_000)),
            st.tuples(st.just("take"), st.booleans()),  # keep the view, or drop it at once
            st.tuples(st.just("drop"), st.integers(0, 10)),
        ),
        max_size=40,
    )
)
@settings(max_examples=60, deadline=None)
def test_every_byte_staged_is_taken_once_in_order_and_kept_while_its_view_lives(ops: list[tuple[str, int]]) -> None:
    """Against a model (the bytes staged, in order): takes return exactly the bytes staged since
    the last one, a view held keeps its bytes whatever comes after (moves, rewinds, new chunks),
    and the window's invariants hold after every step."""
    arena = staging.Arena()
    staged = bytearray()
    held: list[tuple[memoryview, bytes]] = []
    counter = 0
    for op, value in ops:
        if op == "extend":
            data = bytes((counter + i) % 251 for i in range(value % 997)) * (value // 997 + 1)
            data = data[:value]
            counter += 1
            arena.extend(data)
            staged += data
        elif op == "take":
            view = arena.take()
            assert bytes(view) == bytes(staged)
            if value:
                held.append((view, bytes(staged)))
            staged.clear()
        elif held:
            del held[value % len(held)]
        assert len(arena) == len(staged)
        assert arena.check() is None
        assert all(bytes(view) == expected for view, expected in held)


_OUT_OF_MEMORY_FOR_ROWS = """
import json, resource
from gpuviz import EventLog, SimUpstream
from gpuviz.analysis.replay import replay
from gpuviz.capture.native import NativeBFCAllocator

def vm_size():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))

def agree():
    alloc.check()
    logged = {(c.address, c.size, c.in_use) for c in replay(log).state_at(-1).chunks()}
    assert logged == {(c.address, c.size, c.in_use) for c in alloc.state().chunks()}, "the log and the allocator differ"

log = EventLog()
alloc = NativeBFCAllocator(SimUpstream("64GiB"), growth=True, log=log)
live = [alloc.allocate(256) for _ in range(100)]
for i in range(200_000):  # the arena's chunks reach 8 MiB
    alloc.free(live[i % 100])
    live[i % 100] = alloc.allocate(256 * (i % 7 + 1))
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (vm_size() + (4 << 20), hard))  # no room for another chunk
errors, i = [], 0
while len(errors) < 10 and i < 2_000_000:
    try:
        alloc.free(live[i % 100])
        live[i % 100] = 0  # freed
        live[i % 100] = alloc.allocate(256 * (i % 7 + 1))
    except MemoryError as exc:
        errors.append(str(exc))
    i += 1
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
agree()
for j in range(1000):  # memory again: recording goes on
    alloc.free(live[j % 100])
    live[j % 100] = alloc.allocate(512)
agree()
print(len(errors))
print(json.dumps(sorted(set(errors))))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status")
def test_no_memory_for_the_logs_rows_leaves_the_operation_unmade() -> None:
    """When the arena cannot map a chunk for a decision's rows, the native core raises
    MemoryError before deciding anything: the allocator and its log stay in step (a replay of
    the log is the allocator's state), and recording goes on once memory is back."""
    if not native_core_available():
        pytest.skip("the native core is not built")
    import json
    import subprocess

    out = subprocess.run([sys.executable, "-c", _OUT_OF_MEMORY_FOR_ROWS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    count, messages = out.stdout.splitlines()
    assert count == "10"
    prefix = "gpuviz: no memory left for the event log's rows: this "
    suffix = " was not made (the allocator and its log are as before it)"
    assert set(json.loads(messages)) <= {prefix + "free" + suffix, prefix + "allocation" + suffix}


_NO_MEMORY_FOR_A_SEGMENTS_ROW = """
import json, resource
from gpuviz import EventLog, SimUpstream
from gpuviz.analysis.replay import replay
from gpuviz.base.units import GiB, MiB
from gpuviz.capture.native import NativeBFCAllocator

def vm_size():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))

def chunks():
    return {(c.address, c.size, c.in_use) for c in alloc.state().chunks()}

log = EventLog()
upstream = SimUpstream("64GiB")
alloc = NativeBFCAllocator(upstream, growth=True, log=log)
kept = alloc.allocate(MiB)
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (vm_size() + (4 << 20), hard))  # no room for another chunk
marks = 0
try:
    while True:  # fill the arena: the next row needs a chunk that cannot be mapped
        log.mark("fill")
        marks += 1
except MemoryError:
    pass
before = (chunks(), upstream.reserved, alloc.stats())
errors = []
for _ in range(3):
    try:
        alloc.allocate(GiB)  # needs a new segment: its row finds no room
    except MemoryError as exc:
        errors.append(str(exc))
after = (chunks(), upstream.reserved, alloc.stats())
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
big = alloc.allocate(GiB)  # memory again: the same request grows the pool as it would have
alloc.free(big)
released = alloc.release_free_segments()
alloc.check()
print(json.dumps({"marks": marks, "errors": errors, "unchanged": before == after, "released": released,
                  "reserved": upstream.reserved, "pool": alloc.stats().pool_bytes,
                  "replayed": {(c.address, c.size, c.in_use) for c in replay(log).state_at(-1).chunks()} == chunks()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status")
def test_no_memory_for_a_segments_row_leaves_the_pool_and_the_device_as_before() -> None:
    """A segment reservation whose row cannot be staged is undone before the core takes it:
    MemoryError, the device memory handed back, the pool, its stats and the log as before,
    and the same request succeeds once memory is back."""
    if not native_core_available():
        pytest.skip("the native core is not built")
    import json
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", _NO_MEMORY_FOR_A_SEGMENTS_ROW], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["marks"] > 1000
    assert (
        result["errors"]
        == [
            "gpuviz: no memory left for the event log's rows: this segment reservation was not made (the allocator "
            "and its log are as before it)"
        ]
        * 3
    )
    assert result["unchanged"] is True
    assert result["released"] == 1 << 30  # the GiB segment; the first one still holds the kept MiB
    assert result["reserved"] == result["pool"] == 2 << 20  # the device holds exactly the pool: nothing leaked
    assert result["replayed"] is True
