"""PyTorch's raw memory timeline (export_memory_timeline_raw): the real HTA file and edge cases."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import gpuviz
from gpuviz import LogFormatError, replay
from gpuviz.importers import detect
from gpuviz.importers.torch_memory_timeline import CATEGORIES
from gpuviz.log.schema import Kind

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "traces"
RAW = TRACES / "pt_memory_timeline_raw_hta.json.gz"


def _signed(log: gpuviz.EventLog) -> list[int]:
    sub = log.filter(kind=["alloc", "free"])
    return np.where(sub["kind"] == int(Kind.FREE), -sub["requested"], sub["requested"]).tolist()


def test_real_timeline_bytes_in_use_follow_the_file_row_by_row() -> None:
    rows = json.loads(gzip.decompress(RAW.read_bytes()))
    assert detect(RAW) == "pytorch-memory-timeline"
    log = gpuviz.load(RAW)
    changes = [n for _, action, n, _ in rows if action != 3]  # version increments move bytes between categories
    assert _signed(log) == changes
    in_use = np.cumsum(changes)
    assert int(in_use[-1]) == 332_060_904 and int(in_use.max()) == 3_082_832_104
    created = Counter(CATEGORIES[c] for _, action, _, c in rows if action in (1, 2))
    assert Counter(e.tag for e in log.filter(kind="alloc")) == created
    counts = Counter(e.kind for e in log)
    assert counts == {"segment_alloc": 3990, "alloc": 3990, "free": 3345, "segment_free": 3345}
    first_time = min(t for t, *_ in rows if t >= 0)
    last_time = [t for t, action, *_ in rows if action != 3][-1]
    assert log[0].time_ns == first_time and int(log["time_ns"][-1]) == last_time
    final = replay(log).state_at(-1)
    assert sum(c.size for s in final.segments for c in s.chunks if c.in_use) == 332_060_904
    assert log.meta["columns"]["address"] == "absent" and log.device_names == ["GPU:0"]


def test_destroy_pairs_by_size_and_category_after_a_version_increment(tmp_path: Path) -> None:
    rows = [[-1, 1, 512, 0], [10, 2, 256, 4], [11, 2, 256, 3], [12, 3, -256, 4], [12, 3, 256, 5], [13, 4, -256, 5],
            [14, 4, -256, 3], [15, 4, -1024, 7]]  # fmt: skip
    path = tmp_path / "raw.json"
    path.write_text(json.dumps(rows))
    log = gpuviz.load(path)
    allocs = {e.address: (e.time_ns, e.size, e.tag) for e in log.filter(kind="alloc")}
    # the destroy without a live tensor of its size was alive before: seeded first; time -1 -> the first time
    assert list(allocs.values()) == [
        (10, 1024, "PREEXISTING"), (10, 512, "parameter"), (10, 256, "activation"), (11, 256, "temporary"),
    ]  # fmt: skip
    frees = [(e.time_ns, allocs[e.address]) for e in log.filter(kind="free")]
    # the activation became a gradient (no event) and is destroyed as one, then the temporary
    assert frees == [(13, (10, 256, "activation")), (14, (11, 256, "temporary")), (15, (10, 1024, "PREEXISTING"))]


def test_bad_and_cut_files(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([[1, 2, 256, 4], [2, 2, 256, 4], [3, 9, -512, 4]]))
    with pytest.raises(LogFormatError, match="row 2 has action 9 / category 4 out of range"):
        gpuviz.load(path)
    text = json.dumps([[1, 2, 256, 4], [2, 2, 512, 4], [3, 4, -256, 4]])
    path.write_text(text[:-8])
    log = gpuviz.load(path)
    assert log.truncated and [e.requested for e in log.filter(kind="alloc")] == [256, 512]
