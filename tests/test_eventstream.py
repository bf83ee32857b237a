"""The report's event stream (``gpuviz.views.eventstream``): what it packs, its bounded window,
and the names its JavaScript reads, tied to the Python definition of the wire format.
(``tests/test_browser.py`` runs the JavaScript and compares its maps with Python's.)"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import gpuviz
from gpuviz.analysis.profile import profile
from gpuviz.analysis.replay import HEAP_KINDS, replay
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind
from gpuviz.views import eventstream
from gpuviz.views.eventstream import (
    CHUNK_COLUMNS,
    EVENT_COLUMNS,
    SEGMENT_COLUMNS,
    STEPPER_JS,
    decode_columns,
    event_stream,
)
from gpuviz.views.report import FRAME_RECTANGLES, report_html


def churn_log(pairs: int, *, oom_at: int | None = None) -> EventLog:
    """Allocations of tagged sizes, some kept, on a 64 MiB GPU that grows; with ``oom_at``, a
    request of 1 GiB fails after that many pairs."""
    log = EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), growth=True, memory_limit="64MiB", log=log)
    keep = []
    for i in range(pairs):
        if i == oom_at:
            with pytest.raises(gpuviz.OutOfMemoryError):
                alloc.allocate(1 << 30, tag="too big")
        p = alloc.allocate((i % 9 + 1) * 4096 + i, tag=f"t{i % 4}")
        if i % 3:
            alloc.free(p)
        else:
            keep.append(p)
    return log


def test_stream_packs_the_device_heap_events_and_the_heap_before_them() -> None:
    log = churn_log(300, oom_at=200)
    p = profile(log)
    stream = event_stream(p, "GPU:0", max_rectangles=FRAME_RECTANGLES, window=100)
    cols = decode_columns(stream["columns"])
    assert list(cols) == list(EVENT_COLUMNS)
    heap = np.flatnonzero(np.isin(log["kind"], HEAP_KINDS))
    oom = int(np.flatnonzero(log["kind"] == Kind.OOM)[0])
    at = int(np.searchsorted(heap, oom))
    assert cols["position"].tolist() == heap[at - 50 : at + 50].tolist()  # centred on the OOM, 100 events
    assert stream["complete"] is False
    positions = cols["position"]
    for name in ("kind", "address", "size", "requested"):
        assert cols[name].tolist() == log[name][positions].tolist(), name
    assert cols["ns"].tolist() == (log["time_ns"][positions] - p.t0_ns).tolist()
    series = p.devices["GPU:0"].series
    assert cols["settled"].tolist() == series.settled[np.isin(series.index, positions)].tolist()
    assert cols["settled"][cols["kind"] == Kind.SPLIT].tolist() == [0] * int((cols["kind"] == Kind.SPLIT).sum())
    allocs = cols["kind"] == Kind.ALLOC
    tags = [stream["tags"][t][0] for t in cols["tag"][allocs]]
    assert tags == [log.strings[int(t)] for t in log["tag"][positions[allocs]]]
    assert (cols["tag"][~allocs] == -1).all() and (cols["site"] == -1).all()  # no stacks recorded
    # the heap just before the first event, exactly as replay has it
    state = replay(log).state_at(int(positions[0]) - 1, device="GPU:0")
    chunks = decode_columns(stream["chunks"])
    assert list(chunks) == list(CHUNK_COLUMNS)
    assert chunks["address"].tolist() == [c.address for c in state.chunks()]
    assert chunks["size"].tolist() == [c.size for c in state.chunks()]
    assert chunks["requested"].tolist() == [c.requested for c in state.chunks()]
    allocated = p.devices["GPU:0"].allocated(int(positions[0]) - 1, p.t0_ns)
    live = [c for c in state.chunks() if c.in_use]
    assert live and [int(e) for e in chunks["event"][chunks["requested"] > 0]] == [
        allocated[c.address][0] for c in live
    ]
    segments = decode_columns(stream["segments"])
    assert list(segments) == list(SEGMENT_COLUMNS)
    assert segments["base"].tolist() == [s.base for s in state.segments]
    assert segments["size"].tolist() == [s.size for s in state.segments]
    assert stream["kinds"] == {k.name.lower(): int(k) for k in HEAP_KINDS}


def test_stream_window_is_bounded_and_clipped_at_the_ends() -> None:
    log = churn_log(400)  # no OOM: the window is centred on the peak, at the end of this log
    p = profile(log)
    heap = np.flatnonzero(np.isin(log["kind"], HEAP_KINDS))
    stream = event_stream(p, "GPU:0", max_rectangles=FRAME_RECTANGLES, window=64)
    assert decode_columns(stream["columns"])["position"].tolist() == heap[-64:].tolist()
    whole = event_stream(p, "GPU:0", max_rectangles=FRAME_RECTANGLES, window=len(heap) + 10)
    assert decode_columns(whole["columns"])["position"].tolist() == heap.tolist() and whole["complete"] is True
    assert event_stream(p, "GPU:0", max_rectangles=FRAME_RECTANGLES)["complete"] is True  # default: 4000 events
    with pytest.raises(ValueError, match="window must be at least 1 event, got 0"):
        event_stream(p, "GPU:0", max_rectangles=FRAME_RECTANGLES, window=0)


def test_report_embeds_the_stream_once_per_device_within_its_window(monkeypatch: pytest.MonkeyPatch) -> None:
    log = churn_log(500, oom_at=450)
    monkeypatch.setattr(eventstream, "EVENT_WINDOW", 120)
    document = report_html(profile(log), plotlyjs="cdn")
    found = re.findall(r'<script type="application/json" id="map0-events">(.*?)</script>', document)
    assert len(found) == 1
    stream = json.loads(found[0])
    assert stream["format"] == "gpuviz.events" and stream["version"] == 1 and stream["device"] == "GPU:0"
    assert len(decode_columns(stream["columns"])["position"]) == 120


def test_the_javascript_reads_exactly_the_columns_and_kinds_python_writes() -> None:
    """One source of truth: the script reads the typed arrays by the names the stream gives them."""
    used = {
        "ev": set(re.findall(r"\bev\.(\w+)", STEPPER_JS)),
        "snap": set(re.findall(r"\bsnap\.(\w+)", STEPPER_JS)),
        "segs": set(re.findall(r"\bsegs\.(\w+)", STEPPER_JS)),
        "kinds": set(re.findall(r"\bkinds\.(\w+)", STEPPER_JS)),
    }
    assert used["ev"] == set(EVENT_COLUMNS)
    assert used["snap"] == set(CHUNK_COLUMNS)
    assert used["segs"] == set(SEGMENT_COLUMNS)
    assert used["kinds"] == {k.name.lower() for k in HEAP_KINDS}
    stream_keys = set(re.findall(r"\bstream\.(\w+)", STEPPER_JS))
    p = profile(churn_log(20))
    assert stream_keys <= set(event_stream(p, "GPU:0", max_rectangles=FRAME_RECTANGLES))
