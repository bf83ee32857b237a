"""The recorder: the rows it writes for the Python reference allocator, from one thread or many, on
the perf_counter clock."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from gpuviz import EventLog, OutOfMemoryError, SimUpstream
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.capture.recorder import Recorder
from gpuviz.log.schema import Kind

BASE = 1 << 40
CLOCK_ERROR_NS = 5_000
"""How far the native allocator's time may be from time.perf_counter_ns(): it reads the time stamp
counter and converts (csrc/capture/_clock.h: ~0.1 us measured, ~2 us at worst)."""


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


def test_the_python_allocator_records_every_event_kind_in_order() -> None:
    cols = workload(seed=7).log.columns
    assert {int(k) for k in Kind if k <= Kind.OOM} <= set(cols["kind"].tolist())
    assert len(cols["seq"]) > 1000 and cols["seq"].tolist() == list(range(len(cols["seq"])))
    assert (np.diff(cols["time_ns"]) >= 0).all()
    assert set(cols["thread"].tolist()) == {threading.get_ident()}


def test_rows_are_perf_counter_stamped_rows_of_the_log_format() -> None:
    log = EventLog()
    emit = Recorder(log, log.add_device("GPU:0")).emit
    before = time.perf_counter_ns()
    emit(Kind.ALLOC, BASE + 256, 512, 300, BASE, 4096, 12, -1)
    after = time.perf_counter_ns()
    cols = log.columns
    row = tuple(int(cols[name][0]) for name in ("kind", "device", "thread", "address", "size", "requested",
                                                   "segment", "largest_free", "tag", "stack"))  # fmt: skip
    assert row == (Kind.ALLOC, 0, threading.get_ident(), BASE + 256, 512, 300, BASE, 4096, 12, -1)
    assert before <= int(cols["time_ns"][0]) <= after


def test_rows_from_many_threads_are_never_torn() -> None:
    log = EventLog(flush_rows=1000)
    writers = [Recorder(log, device) for device in range(8)]
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


def test_recorder_writes_what_it_is_given() -> None:
    log = EventLog()
    rec = Recorder(log, log.add_device("GPU:0"))
    rec.emit(Kind.OOM, 0, 512, 500, -1, 256, -1, -1)
    assert [(e.kind, e.size, e.requested, e.largest_free) for e in log] == [("oom", 512, 500, 256)]


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
