"""The staging buffer of an EventLog: emptied in place (gpuviz.log._staging.Arena.take), so the
C recorders append rows into one allocation instead of re-growing it after every flush, and
the flushed rows go into huge-page chunks of the arena that are reused once no block holds them."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

from gpuviz import BFCAllocator, EventLog, SimUpstream
from gpuviz.analysis.replay import replay
from gpuviz.capture.native import NativeBFCAllocator, native_core_available

staging = pytest.importorskip("gpuviz.log._staging", reason="built only where a C compiler exists")


def test_take_removes_and_returns_the_first_bytes_keeping_the_rest() -> None:
    arena = staging.Arena()
    buffer = bytearray(b"0123456789")
    first = arena.take(buffer, 4)
    assert bytes(first) == b"0123" and first.readonly
    assert buffer == bytearray(b"456789")
    second = arena.take(buffer, 6)
    assert bytes(second) == b"456789" and buffer == bytearray()
    buffer.extend(b"ab")
    assert bytes(arena.take(buffer, 0)) == b"" and buffer == bytearray(b"ab")
    assert bytes(first) == b"0123" and bytes(second) == b"456789"  # views held keep their rows
    assert arena.chunk_bytes() == (512 << 10, 10, 0)  # the first chunk, 10 bytes handed out, no next yet


def test_take_keeps_the_allocation() -> None:
    buffer = bytearray(1 << 20)
    allocated = sys.getsizeof(buffer)
    staging.Arena().take(buffer, 1 << 20)
    assert len(buffer) == 0 and sys.getsizeof(buffer) == allocated


def test_chunks_grow_from_512_kib_to_8_mib_and_a_chunk_no_view_holds_is_reused() -> None:
    arena = staging.Arena()
    staged = bytearray()
    views = []
    sizes = []  # KiB, of each new chunk
    for _ in range(200):  # 50 MiB held
        staged.extend(bytes(256 << 10))
        views.append(arena.take(staged, 256 << 10))
        size, used, _ = arena.chunk_bytes()
        if used == 256 << 10:
            sizes.append(size >> 10)
    assert sizes == [512, 2048, 4096] + [8192] * 6
    size = arena.chunk_bytes()[0]
    views.clear()  # no view of the current chunk is alive: the next take starts it again
    staged.extend(b"x" * 10)
    kept = arena.take(staged, 10)
    assert bytes(kept) == b"x" * 10 and arena.chunk_bytes()[:2] == (size, 10)
    held = arena.take(bytearray(b"abc"), 3)
    assert arena.chunk_bytes()[:2] == (size, 13) and bytes(held) == b"abc" and bytes(kept) == b"x" * 10  # no rewind


def _resident_pages(view: memoryview) -> tuple[int, int]:
    """(resident, all) 4 KiB pages of the whole pages under ``view`` (mincore(2))."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    start = np.frombuffer(view, dtype=np.uint8).ctypes.data
    pages = len(view) // 4096
    vector = ctypes.create_string_buffer(pages)
    assert libc.mincore(start - start % 4096, pages * 4096, vector) == 0, ctypes.get_errno()
    return sum(byte & 1 for byte in vector.raw), pages


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or tuple(map(int, os.uname().release.split(".")[:2])) < (5, 14),
    reason="MADV_POPULATE_WRITE needs Linux 5.14",
)
def test_the_next_chunk_is_prepared_at_half_and_populated_off_the_recording_thread() -> None:
    arena = staging.Arena()
    views = []
    for kib, expected in ((255, (512, 255, 0)), (1, (512, 256, 2048)), (300, (2048, 300, 0)), (800, (2048, 1100, 4096)),
                          (1000, (4096, 1000, 0))):  # fmt: skip
        views.append(arena.take(bytearray(b"r" * (kib << 10)), kib << 10))
        assert tuple(value >> 10 for value in arena.chunk_bytes()) == expected
    assert [len(view) >> 10 for view in views] == [255, 1, 300, 800, 1000]
    assert all(bytes(view) == b"r" * len(view) for view in views)
    whole = memoryview(views[-1].obj)  # the 4 MiB chunk, of which the rows touched 1000 KiB
    deadline = time.monotonic() + 10
    while _resident_pages(whole)[0] < 1024 and time.monotonic() < deadline:
        time.sleep(0.01)  # populated by the arena's thread
    assert _resident_pages(whole) == (1024, 1024)


def test_a_take_larger_than_a_chunk_gets_a_chunk_of_its_own() -> None:
    arena = staging.Arena()
    big = bytearray(b"r" * (5 << 20))
    view = arena.take(big, 5 << 20)
    assert len(view) == 5 << 20 and arena.chunk_bytes() == (6 << 20, 5 << 20, 2 << 20)  # whole huge pages


def test_bad_takes_are_refused_and_change_nothing() -> None:
    arena = staging.Arena()
    buffer = bytearray(b"abc")
    with pytest.raises(ValueError, match="cannot take 4 bytes of 3"):
        arena.take(buffer, 4)
    with pytest.raises(ValueError, match="cannot take -1 bytes of 3"):
        arena.take(buffer, -1)
    view = memoryview(buffer)
    with pytest.raises(BufferError, match="exported"):
        arena.take(buffer, 1)
    view.release()
    with pytest.raises(TypeError, match="take"):
        arena.take(b"abc", 1)
    with pytest.raises(TypeError, match="no arguments"):
        staging.Arena(1)
    assert buffer == bytearray(b"abc") and arena.chunk_bytes() == (0, 0, 0)
    block = arena.take(buffer, 3)
    with pytest.raises(TypeError):
        block[0] = 1  # type: ignore[index]  # blocks are read-only


@pytest.mark.parametrize("native", [True, False])
def test_rows_survive_many_flushes_in_place(native: bool) -> None:
    """Thousands of flushes of a buffer that is never re-allocated: every row arrives, in order."""
    if native and not native_core_available():
        pytest.skip("the native core is not built")
    log = EventLog(flush_rows=64)
    alloc = (NativeBFCAllocator if native else BFCAllocator)(SimUpstream("1GiB"), growth=True, log=log)
    live = [alloc.allocate(256 * (i % 7 + 1)) for i in range(50)]
    for i in range(5000):
        alloc.free(live[i % 50])
        live[i % 50] = alloc.allocate(512 * (i % 5 + 1))
    cols = log.columns
    np.testing.assert_array_equal(cols["seq"], np.arange(len(log)))
    assert np.all(np.diff(cols["time_ns"]) >= 0)
    alloc.check()
    replayed = replay(log).state_at(-1)
    assert {c.address: c.size for c in replayed.chunks()} == {c.address: c.size for c in alloc.state().chunks()}


def test_without_the_arena_the_log_keeps_bytes_blocks_with_the_same_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pure-Python path (no compiler at install time) and a log built at once (``arena=False``)
    flush into bytes objects: same rows."""
    from gpuviz.log import eventlog

    logs = []
    for arena, built in ((True, False), (False, True), (False, False)):
        if not arena and not built:
            monkeypatch.setattr(eventlog, "_Arena", None)
        log = EventLog(flush_rows=16, arena=not built)  # built: a log made at once (an import) keeps bytes
        alloc = BFCAllocator(SimUpstream("1GiB"), growth=True, log=log)
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
