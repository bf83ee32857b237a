"""The live follower's compiled pass (``gpuviz.analysis._livekernel``) against its NumPy twin:
the same points, heaps and totals on random logs, read in random steps."""

from __future__ import annotations

import os
from typing import Any
from unittest import mock

import numpy as np
import pytest
from built import built
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuviz.analysis.live import LiveFollower, LivePoints, thin_points
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Kind
from gpuviz.log.segments import map_range, unmap_range

needs_kernel = pytest.mark.skipif(
    not built("gpuviz.analysis._livekernel"), reason="the live kernel is not built (no C compiler)"
)

PAGE = 4096
BASE = 1 << 40
DEVICES = ("GPU:0", "GPU:1", "CPU:0")


def _lists(p: LivePoints) -> list[list[int]]:
    return [p.index.tolist(), p.time_ns.tolist(), p.bytes_in_use.tolist(), p.bytes_requested.tolist(),
            p.pool_bytes.tolist()]  # fmt: skip


def _update(
    follower: LiveFollower, *, native: bool, most: int | None = None
) -> dict[str, tuple[list[list[int]], bool]]:
    with mock.patch.dict(os.environ, {"GPUVIZ_NATIVE": "1" if native else "0"}):
        result = follower.update(most=most)
    return {device: (_lists(p), changed) for device, (p, changed) in result.items()}


def _look(compiled: LiveFollower, twin: LiveFollower, thinned: LiveFollower) -> None:
    """One update of each: the same points and heaps; ``thinned``'s points, at most 3 a device,
    those that ``thin_points`` keeps of the twin's."""
    with mock.patch.dict(os.environ, {"GPUVIZ_NATIVE": "0"}):
        every = twin.update()
    assert _update(compiled, native=True) == {device: (_lists(p), changed) for device, (p, changed) in every.items()}
    assert _update(thinned, native=True, most=3) == {
        device: (_lists(thin_points(p, 3)), changed) for device, (p, changed) in every.items()
    }
    assert _state(compiled) == _state(twin) == _state(thinned)


def _state(follower: LiveFollower) -> dict[str, Any]:
    return {
        "position": follower.position,
        "times": (follower.first_time_ns, follower.last_time_ns),
        "heaps": {name: (dict(h.chunks), dict(h.segments), h.bytes_in_use, h.bytes_requested, h.pool_bytes, h.events)
                  for name, h in follower.heaps.items()},
    }  # fmt: skip


def _row(t: int, kind: int, device: int, address: int, size: int, requested: int = 0, tag: int = -1) -> tuple[int, ...]:
    return (t, kind, 0, device, -1, 0, address, size, requested, 0, 0, 0, tag, -1)


def _segment_row(data: st.DataObject, t: int, device: int, segments: dict[int, int]) -> tuple[int, ...] | None:
    """A segment event that keeps ``segments`` (the device's, base -> size) free of overlaps."""
    taken = {page for base, size in segments.items()
             for page in range((base - BASE) // PAGE, (base - BASE + size) // PAGE)}  # fmt: skip
    what = data.draw(st.sampled_from(["segment_alloc", "segment_free", "segment_map", "segment_unmap"]))
    if what in ("segment_free", "segment_unmap"):
        if not segments:
            return None
        base = data.draw(st.sampled_from(sorted(segments)))
        if what == "segment_free":
            del segments[base]
            return _row(t, Kind.SEGMENT_FREE, device, base, 0)
        pages = segments[base] // PAGE
        first = data.draw(st.integers(0, pages - 1))
        count = data.draw(st.integers(1, pages - first))
        unmap_range(segments, base + first * PAGE, count * PAGE)
        return _row(t, Kind.SEGMENT_UNMAP, device, base + first * PAGE, count * PAGE)
    first, count = data.draw(st.integers(0, 31)), data.draw(st.integers(1, 4))
    if any(page in taken for page in range(first, first + count)):
        return None
    address, size = BASE + first * PAGE, count * PAGE
    if what == "segment_alloc":
        segments[address] = size
        return _row(t, Kind.SEGMENT_ALLOC, device, address, size)
    map_range(segments, address, size)
    return _row(t, Kind.SEGMENT_MAP, device, address, size)


@pytest.mark.slow
@needs_kernel
@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_compiled_pass_gives_the_numpy_twins_points_and_heaps(data: st.DataObject) -> None:
    log = EventLog(flush_rows=data.draw(st.sampled_from([3, 12, 4096])))  # pieces of 1, 4 or 1365 rows
    n_devices = data.draw(st.integers(1, len(DEVICES)))
    for name in DEVICES[:n_devices]:
        log.add_device(name)
    tags = [log.intern_string(f"t{i}") for i in range(3)]
    compiled, twin, thinned = LiveFollower(log), LiveFollower(log), LiveFollower(log)
    segments: list[dict[int, int]] = [{} for _ in range(n_devices)]
    chunk_kinds = [Kind.ALLOC, Kind.ALLOC, Kind.FREE, Kind.FREE, Kind.SPLIT, Kind.MERGE, Kind.OOM]
    for t in range(data.draw(st.integers(0, 120))):
        device = data.draw(st.integers(0, n_devices - 1))
        what = data.draw(st.sampled_from(["chunk", "chunk", "chunk", "segment", "mark", "other", "look", "columns"]))
        if what == "chunk":
            kind = data.draw(st.sampled_from(chunk_kinds))
            address = BASE + data.draw(st.integers(0, 15)) * 256
            size = data.draw(st.integers(1, 1 << 20))
            log.append(_row(t, kind, device, address, size, data.draw(st.integers(0, size)),
                            data.draw(st.sampled_from([-1, *tags]))))  # fmt: skip
        elif what == "segment":
            row = _segment_row(data, t, device, segments[device])
            if row is not None:
                log.append(row)
        elif what == "mark":
            log.mark(f"m{t}", time_ns=t)
        elif what == "other":
            log.append(_row(t, data.draw(st.sampled_from([Kind.TRANSFER, Kind.PLACEMENT])), device, BASE, 64))
        elif what == "columns":
            # splits the flushed blocks: what follows is read from the columns, packed again
            assert len(log.columns["kind"]) == len(log)
        else:
            _look(compiled, twin, thinned)
    _look(compiled, twin, thinned)
    assert _update(compiled, native=True) == {} == _update(twin, native=False)  # nothing new


@needs_kernel
def test_an_allocator_event_of_an_unknown_device_is_an_error_that_changes_nothing() -> None:
    log = EventLog()
    device = log.add_device("GPU:0")
    log.append(_row(1, Kind.SEGMENT_ALLOC, device, BASE, 1 << 20))
    log.append(_row(2, Kind.ALLOC, device, BASE, 4096, 4000, -1))
    follower = LiveFollower(log)
    follower.update()
    before = _state(follower)
    log.append(_row(3, Kind.ALLOC, device, BASE + 4096, 4096, 4000, -1))
    log.append(_row(4, Kind.FREE, 1, BASE, 4096, 4000, -1))  # device 1 was never added
    with pytest.raises(ValueError, match="row 3: allocator event of device 1, but the log has 1 devices"):
        follower.update()
    assert _state(follower) == before
    assert follower.heaps["GPU:0"].bytes_in_use == 4096


@needs_kernel
def test_the_compiled_pass_reads_a_busy_log_as_the_twin_does() -> None:
    """Many flushed blocks between looks, thousands of chunks: the points and heaps agree."""
    log = EventLog()
    device = log.add_device("GPU:0")
    rng = np.random.default_rng(3)
    log.append(_row(0, Kind.SEGMENT_ALLOC, device, BASE, 1 << 30))
    compiled, twin = LiveFollower(log), LiveFollower(log)
    live: list[int] = []
    t = 1
    for _look in range(6):
        for _ in range(20_000):
            if live and rng.random() < 0.45:
                address = live.pop(int(rng.integers(len(live))))
                log.append(_row(t, Kind.FREE, device, address, 4096, 4000, -1))
            else:
                address = BASE + int(rng.integers(1 << 18)) * 4096
                live.append(address)
                log.append(_row(t, Kind.ALLOC, device, address, 4096, 4000, 0))
            t += 1
        assert _update(compiled, native=True) == _update(twin, native=False)
        assert _state(compiled) == _state(twin)
    assert len(compiled.heaps["GPU:0"].chunks) > 5000


def test_thinned_points_keep_the_highest_and_the_last_and_most_below_two_is_an_error() -> None:
    log = EventLog()
    device = log.add_device("GPU:0")
    log.append(_row(0, Kind.SEGMENT_ALLOC, device, BASE, 1 << 20))
    log.append(_row(1, Kind.ALLOC, device, BASE, 100, 100))
    log.append(_row(2, Kind.ALLOC, device, BASE + 1024, 900, 900))
    log.append(_row(3, Kind.FREE, device, BASE + 1024, 900, 900))
    for i, size in enumerate([50, 70, 10, 20]):
        log.append(_row(i + 4, Kind.ALLOC, device, BASE + (i + 2) * 1024, size, size))
    follower = LiveFollower(log)
    with pytest.raises(ValueError, match="most must be None or >= 2, got 1"):
        follower.update(most=1)
    assert follower.position == 0
    points, changed = follower.update(most=4)["GPU:0"]
    # evenly spaced: positions 0, 3.5 and 7 of 8 points, and the highest (after the 900-byte alloc)
    assert points.index.tolist() == [0, 2, 3, 7] and changed
    assert points.bytes_in_use.tolist() == [0, 1000, 100, 250]
