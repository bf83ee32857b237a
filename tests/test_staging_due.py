"""When an EventLog's staged rows are due for a flush (the arena's window, ``Arena.set_flush``),
and an arena that goes on in a forked child."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuviz import EventLog, SimUpstream
from gpuviz.analysis.replay import replay
from gpuviz.capture.native import NativeBFCAllocator, native_core_available
from gpuviz.log.eventlog import EventLog as EventLogClass
from gpuviz.log.schema import ROW_DTYPE

staging = pytest.importorskip("gpuviz.log._staging", reason="built only where a C compiler exists")

ROW = ROW_DTYPE.itemsize
MARGIN = 128 * ROW  # a take this close to a chunk's end: nothing left to move (_staging.c, DUE_MARGIN)


def test_rows_are_due_near_the_chunks_end_or_every_flush_bytes() -> None:
    arena = staging.Arena()
    assert arena.due() == 0 and arena.check() is None  # no chunk yet
    arena.extend(b"r" * 1000)  # the first chunk, 512 KiB
    assert arena.due() == (512 << 10) - MARGIN  # near its end: little left to move to the next chunk
    arena.set_flush(4096)  # a log recording to a file: its crash bound
    assert arena.due() == 4096
    held = [arena.take()]  # views held: the chunk is not rewound
    assert arena.due() == 4096 and arena.chunk_bytes() == (512 << 10, 1000)  # counted from the take
    arena.set_flush(0)  # in memory: near the end only
    assert arena.due() == (512 << 10) - MARGIN - 1000
    arena.extend(b"r" * ((256 << 10) - 1000))
    held.append(arena.take())
    assert arena.chunk_bytes() == (512 << 10, 256 << 10) and arena.due() == (256 << 10) - MARGIN
    arena.extend(b"r" * ((256 << 10) - MARGIN + 10))
    held.append(arena.take())  # past the last milestone: due only when the chunk is full
    assert arena.due() == MARGIN - 10 and arena.check() is None
    arena.extend(b"r" * MARGIN)  # does not fit: the next chunk (2 MiB), mapped now
    assert arena.chunk_bytes() == (2 << 20, MARGIN) and arena.due() == (2 << 20) - MARGIN  # from its start
    with pytest.raises(ValueError, match="a number of bytes >= 0, not -1"):
        arena.set_flush(-1)
    with pytest.raises(TypeError):
        arena.set_flush("4096")  # type: ignore[arg-type]
    assert arena.due() == (2 << 20) - MARGIN and arena.check() is None  # unchanged


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("extend"), st.integers(0, 300_000)),
            st.tuples(st.just("take"), st.booleans()),
            st.tuples(st.just("flush"), st.sampled_from([0, ROW, 4096, 2048 * ROW, 1 << 20])),
        ),
        max_size=40,
    )
)
@settings(max_examples=60, deadline=None)
def test_the_due_point_stays_within_the_window_and_within_flush_bytes(ops: list[tuple[str, int]]) -> None:
    arena = staging.Arena()
    flush, held = 0, []
    for op, value in ops:
        if op == "extend":
            arena.extend(b"x" * value)
        elif op == "take":
            view = arena.take()
            if value:
                held.append(view)
        else:
            flush = value
            arena.set_flush(value)
        assert arena.check() is None  # start <= due <= end among the window's invariants
        if flush and arena.chunk_bytes()[0]:
            assert 0 <= arena.due() <= flush


def _flushes(log: EventLog, pairs: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, NativeBFCAllocator]:
    calls = []
    original = EventLogClass.flush_staged

    def counted(self: EventLog) -> None:
        calls.append(len(self._recorder.staged))
        original(self)

    monkeypatch.setattr(EventLogClass, "flush_staged", counted)
    alloc = NativeBFCAllocator(SimUpstream("64GiB"), growth=True, log=log)
    live = [alloc.allocate(256) for _ in range(100)]
    for i in range(pairs):
        alloc.free(live[i % 100])
        live[i % 100] = alloc.allocate(256 * (i % 7 + 1))
    monkeypatch.setattr(EventLogClass, "flush_staged", original)
    return len(calls), alloc


def test_a_log_in_memory_is_flushed_once_a_chunk_and_one_recording_to_a_file_every_third_of_flush_rows(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    if not native_core_available():
        pytest.skip("the native core is not built")
    memory = EventLog()
    flushes, alloc = _flushes(memory, 50_000, monkeypatch)
    rows = len(memory)  # 142,601 rows (10.6 MiB) in chunks of 512 KiB, 2, 4 and 8 MiB
    assert rows == 142_601 and flushes == 3  # near each chunk's end; the 8 MiB one half full
    replayed = replay(memory).state_at(-1)
    assert {c.address: c.size for c in replayed.chunks()} == {c.address: c.size for c in alloc.state().chunks()}
    np.testing.assert_array_equal(memory["seq"], np.arange(rows))

    to_file = EventLog(os.path.join(tmp_path, "run.arrow"), flush_interval_s=3600)
    flushes, _ = _flushes(to_file, 50_000, monkeypatch)
    assert flushes >= len(to_file) // 1365  # the crash bound: every flush_rows // 3 rows
    to_file.close()
    memory.record_to(os.path.join(tmp_path, "later.arrow"), flush_interval_s=3600)  # from now on: to a file
    assert memory._recorder.arena.due() <= 4096 // 3 * ROW
    memory.close()


_FORKED = """
import os, sys
from gpuviz.log._staging import Arena
arena = Arena()
arena.extend(b"a" * (300 << 10))
held = [arena.take()]
pid = os.fork()
if pid == 0:  # the child: the parent's chunk, shared copy-on-write
    for i in range(40):  # 20 MiB: chunks of 2, 4 and 8 MiB, mapped by the child
        arena.extend(bytes([i]) * (512 << 10))
        held.append(arena.take())
    ok = all(bytes(v) == bytes([i]) * (512 << 10) for i, v in enumerate(held[1:])) and arena.check() is None
    os._exit(0 if ok and bytes(held[0]) == b"a" * (300 << 10) else 1)
_, status = os.waitpid(pid, 0)
arena.extend(b"p" * (4 << 20))
assert bytes(arena.take()) == b"p" * (4 << 20) and arena.check() is None
print(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_an_arena_goes_on_in_a_forked_child_and_in_its_parent() -> None:
    import subprocess

    done = subprocess.run([sys.executable, "-c", _FORKED], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
