"""The recorders: the C row writer and the Python recorder write the same rows."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import threading
import time

import numpy as np
import pytest

from gpuviz import EventLog, OutOfMemoryError, SimUpstream
from gpuviz.capture import ReferenceBFCAllocator, recorder
from gpuviz.capture.recorder import Recorder, native_available
from gpuviz.log.schema import ROW_STRUCT, Kind

BASE = 1 << 40
CLOCK_ERROR_NS = 5_000
"""How far a C recorder's time may be from time.perf_counter_ns(): it reads the time stamp counter
and converts (csrc/capture/_clock.h: ~0.1 us measured, ~2 us at worst)."""
needs_native = pytest.mark.skipif(recorder._RowWriter is None, reason="the C row writer is not built (no C compiler)")


def workload(seed: int) -> ReferenceBFCAllocator:
    """Splits, merges both ways, growth, an OOM, segment release: every allocator event kind."""
    rng = random.Random(seed)
    alloc = ReferenceBFCAllocator(SimUpstream("64MiB"), memory_limit="48MiB", garbage_collection=True)
    live: list[int] = []
    for step in range(600):
        if live and rng.random() < 0.45:
            alloc.free(live.pop(rng.randrange(len(live))))
        else:
            with contextlib.suppress(OutOfMemoryError):
                live.append(alloc.allocate(int(2 ** rng.uniform(0, 24.5)), tag=f"t{step % 7}"))
        if step % 150 == 149:
            alloc.release_free_segments()
    alloc.log.flush()
    return alloc


def test_a_compiler_means_the_row_writer_is_built() -> None:
    """Where this Python can compile extensions, the install must have built the C row writer."""
    cc = (sysconfig.get_config_var("CC") or "").split()
    if not cc or shutil.which(cc[0]) is None:
        pytest.skip("no C compiler: gpuviz installs as pure Python")
    assert recorder._RowWriter is not None, "a C compiler exists but gpuviz.capture._rowwriter was not built"


@needs_native
def test_native_and_python_recorders_write_identical_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    logs = {}
    for native in ("1", "0"):
        monkeypatch.setenv("GPUVIZ_NATIVE", native)
        assert native_available() is (native == "1")
        alloc = workload(seed=7)
        assert alloc._observer.native is (native == "1")  # type: ignore[attr-defined]
        logs[native] = alloc.log.columns
    native_cols, python_cols = logs["1"], logs["0"]
    kinds = set(native_cols["kind"].tolist())
    assert {int(k) for k in Kind if k <= Kind.OOM} <= kinds  # the workload makes every allocator event kind
    assert len(native_cols["seq"]) > 1000
    for name, column in python_cols.items():
        if name != "time_ns":
            np.testing.assert_array_equal(native_cols[name], column, err_msg=name)
    for cols in (native_cols, python_cols):
        assert (np.diff(cols["time_ns"]) >= 0).all()


@needs_native
def test_native_rows_are_perf_counter_stamped_rows_of_the_log_format() -> None:
    assert recorder._RowWriter is not None
    staged = bytearray()
    flushes: list[int] = []
    writer = recorder._RowWriter(staged, 3 * ROW_STRUCT.size, lambda: flushes.append(len(staged)), 5)
    before = time.perf_counter_ns()
    writer.emit(Kind.ALLOC, BASE + 256, 512, 300, BASE, 4096, 12, -1)
    after = time.perf_counter_ns()
    row = ROW_STRUCT.unpack(bytes(staged))
    assert row[1:] == (Kind.ALLOC, 0, 5, -1, threading.get_ident(), BASE + 256, 512, 300, BASE, 4096, 0, 12, -1)
    assert before - CLOCK_ERROR_NS <= row[0] <= after + CLOCK_ERROR_NS
    writer.emit(Kind.FREE, BASE + 256, 512, 300, BASE, 8192, 12, -1)
    assert flushes == []
    writer.emit(Kind.MERGE, BASE, 768, 0, BASE, 8192, -1, -1)
    assert flushes == [3 * ROW_STRUCT.size]  # flush() is called once the threshold is reached


@needs_native
def test_native_writer_rejects_bad_rows_and_appends_nothing() -> None:
    assert recorder._RowWriter is not None
    staged = bytearray(b"x" * 78)
    writer = recorder._RowWriter(staged, 1 << 20, lambda: None, 0)
    with pytest.raises(OverflowError, match="32-bit"):
        writer.emit(Kind.ALLOC, BASE, 256, 1, BASE, 0, 1 << 40, -1)
    with pytest.raises(OverflowError):
        writer.emit(Kind.ALLOC, 1 << 64, 256, 1, BASE, 0, -1, -1)
    with pytest.raises(OverflowError, match="byte"):
        writer.emit(300, BASE, 256, 1, BASE, 0, -1, -1)
    with pytest.raises(TypeError, match="8 arguments"):
        writer.emit(Kind.ALLOC, BASE)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        writer.emit(Kind.ALLOC, "0x100", 256, 1, BASE, 0, -1, -1)  # type: ignore[arg-type]
    assert staged == bytearray(b"x" * 78)
    with pytest.raises(TypeError):
        recorder._RowWriter(b"immutable", 100, lambda: None, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        recorder._RowWriter(bytearray(), 100, None, 0)  # type: ignore[arg-type]


@needs_native
def test_native_rows_from_many_threads_are_never_torn() -> None:
    log = EventLog(flush_rows=1000)
    writers = [Recorder(log, device, native=True) for device in range(8)]
    per_thread = 5000

    def run(device: int) -> None:
        emit = writers[device].emit
        for i in range(per_thread):
            emit(Kind.ALLOC, BASE + i * 256, 256, device, BASE, i, -1, -1)

    threads = [threading.Thread(target=run, args=(d,)) for d in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cols = log.columns
    assert len(cols["seq"]) == 8 * per_thread
    for device in range(8):
        mine = cols["device"] == device
        assert (cols["requested"][mine] == device).all()
        assert cols["largest_free"][mine].tolist() == list(range(per_thread))  # in order, none lost


def test_python_recorder_can_be_chosen_explicitly() -> None:
    log = EventLog()
    rec = Recorder(log, log.add_device("GPU:0"), native=False)
    assert rec.native is False
    rec.emit(Kind.OOM, 0, 512, 500, -1, 256, -1, -1)
    assert [(e.kind, e.size, e.requested, e.largest_free) for e in log] == [("oom", 512, 500, 256)]


def test_asking_for_a_missing_native_writer_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorder, "_RowWriter", None)
    assert native_available() is False
    with pytest.raises(RuntimeError, match="not built"):
        Recorder(EventLog(), 0, native=True)
    assert Recorder(EventLog(), 0).native is False


CLOCK_CHECK = """
import json, sys, time
import numpy as np
from gpuviz import EventLog, SimUpstream
from gpuviz.capture.native import allocator_class
log = EventLog()
alloc = allocator_class()(SimUpstream("1GiB"), log=log)
brackets = []
end = time.perf_counter() + 0.4  # anchors every 10 ms, the rate measured over up to 100 ms
while time.perf_counter() < end:
    before = time.perf_counter_ns()
    address = alloc.allocate(1000)
    brackets.append((before, time.perf_counter_ns()))
    alloc.free(address)
    if len(brackets) % 500 == 0:
        time.sleep(0.002)  # idle stretches too
kind, times = log["kind"], log["time_ns"]
stamped = times[kind == 2]
b = np.array(brackets)
print(json.dumps({"allocs": len(b), "early": int((b[:, 0] - stamped).max()), "late": int((stamped - b[:, 1]).max()),
                  "never_back": bool((np.diff(times) >= 0).all())}))
"""


@pytest.mark.parametrize("tsc", ["1", "0"])
def test_recorded_times_are_on_the_perf_counter_clock(tsc: str) -> None:
    """Rows stamped by the native core (time stamp counter, converted; or the clock itself with
    GPUVIZ_TSC=0) over 0.4 s of allocations with pauses: each allocation's time lies between
    perf_counter_ns() read before and after it, within CLOCK_ERROR_NS, and times never go back."""
    env = {**os.environ, "GPUVIZ_TSC": tsc}
    out = subprocess.run([sys.executable, "-c", CLOCK_CHECK], env=env, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["allocs"] > 1000
    assert result["early"] <= CLOCK_ERROR_NS and result["late"] <= CLOCK_ERROR_NS, result
    if tsc == "0":  # the clock itself: inside the brackets
        assert result["early"] <= 0 and result["late"] <= 0, result
    assert result["never_back"] is True
