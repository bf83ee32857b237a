"""The staging buffer of an EventLog: emptied in place (gpuviz.log._staging.take), so the
C recorders append rows into one allocation instead of re-growing it after every flush."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from gpuviz import BFCAllocator, EventLog, SimUpstream
from gpuviz.analysis.replay import replay
from gpuviz.capture.native import NativeBFCAllocator, native_core_available

staging = pytest.importorskip("gpuviz.log._staging", reason="built only where a C compiler exists")


def test_take_removes_and_returns_the_first_bytes_keeping_the_rest() -> None:
    buffer = bytearray(b"0123456789")
    assert staging.take(buffer, 4) == b"0123"
    assert buffer == bytearray(b"456789")
    assert staging.take(buffer, 6) == b"456789"
    assert buffer == bytearray()
    buffer.extend(b"ab")
    assert staging.take(buffer, 0) == b"" and buffer == bytearray(b"ab")


def test_take_keeps_the_allocation() -> None:
    buffer = bytearray(1 << 20)
    allocated = sys.getsizeof(buffer)
    staging.take(buffer, 1 << 20)
    assert len(buffer) == 0 and sys.getsizeof(buffer) == allocated


def test_bad_takes_are_refused_and_change_nothing() -> None:
    buffer = bytearray(b"abc")
    with pytest.raises(ValueError, match="cannot take 4 bytes of 3"):
        staging.take(buffer, 4)
    with pytest.raises(ValueError, match="cannot take -1 bytes of 3"):
        staging.take(buffer, -1)
    view = memoryview(buffer)
    with pytest.raises(BufferError, match="exported"):
        staging.take(buffer, 1)
    view.release()
    with pytest.raises(TypeError, match="take"):
        staging.take(b"abc", 1)
    assert buffer == bytearray(b"abc")


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
