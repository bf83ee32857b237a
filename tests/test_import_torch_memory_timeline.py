"""PyTorch's raw memory timeline (export_memory_timeline_raw): the real HTA file (GPUVIZ_TEST_TRACES)
and edge cases."""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from counting import ProgressCounter
from traces import optional_trace, trace_path

import gpuviz
from gpuviz import LogFormatError, replay
from gpuviz.importers import detect, torch_memory_timeline
from gpuviz.importers.source import NullProgress, Source
from gpuviz.importers.torch_memory_timeline import CATEGORIES
from gpuviz.log.schema import Kind

RAW = "pt_memory_timeline_raw_hta.json.gz"


def _signed(log: gpuviz.EventLog) -> list[int]:
    sub = log.filter(kind=["alloc", "free"])
    return np.where(sub["kind"] == int(Kind.FREE), -sub["requested"], sub["requested"]).tolist()


def test_real_timeline_bytes_in_use_follow_the_file_row_by_row() -> None:
    raw = trace_path(RAW)
    rows = json.loads(gzip.decompress(raw.read_bytes()))
    assert detect(raw) == "pytorch-memory-timeline"
    log = gpuviz.load(raw)
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


# ------------------------------------------------------------ streamed reading against reading whole
def _read(path: Path, *, streamed: bool) -> gpuviz.EventLog | str:
    """The log (or the error, in words) of ``path``, read as a stream or whole."""
    try:
        return torch_memory_timeline.read(Source(path), progress=NullProgress(), streamed=streamed)
    except (LogFormatError, OverflowError) as exc:
        return f"{type(exc).__name__}: {exc}"


def _assert_same(path: Path, *, never_whole: pytest.MonkeyPatch | None = None) -> gpuviz.EventLog | str:
    """Streamed and whole: the same log (every column, string, device, meta, truncated flag) or error;
    ``never_whole``: the streamed reading must not fall back to reading the content whole."""
    if never_whole is None:
        got = _read(path, streamed=True)
    else:
        with never_whole.context() as patch:
            patch.setattr(Source, "read_all", lambda self: pytest.fail(f"{self.path} was read whole"))
            got = _read(path, streamed=True)
    want = _read(path, streamed=False)
    if isinstance(got, str) or isinstance(want, str):
        assert got == want
        return got
    assert len(got) == len(want)
    for name, column in want.columns.items():
        assert np.array_equal(got.columns[name], column), name
    assert (list(got.strings), got.stacks, got.devices, got.meta) == (list(want.strings), want.stacks, want.devices,
                                                                       want.meta)  # fmt: skip
    assert got.truncated == want.truncated
    return got


def _random_rows(n: int, seed: int) -> list[list[int]]:
    """Creates, destroys (LIFO per size and category or not), version increments and PREEXISTING rows."""
    rng = random.Random(seed)
    live: list[tuple[int, int]] = []
    rows: list[list[int]] = []
    for t in range(n):
        if live and rng.random() < 0.45:
            size, category = live.pop(rng.randrange(len(live)))
            rows.append([t, 4, -size, category])
        elif live and rng.random() < 0.1:
            k = rng.randrange(len(live))
            size, old = live[k]
            live[k] = (size, rng.randrange(8))
            rows += [[t, 3, -size, old], [t, 3, size, live[k][1]]]
        else:
            live.append((512 * rng.randint(1, 20), rng.randrange(8)))
            rows.append([-1 if rng.random() < 0.01 else t, 1 if rng.random() < 0.05 else 2, *live[-1]])
    return rows


def test_streamed_reading_gives_the_log_of_reading_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real file (gzip and plain, where the real traces are available) and generated ones of
    many 16 KiB pieces, compact and indented, with leading white space and a DESTROY before any
    CREATE: the same log as reading whole, and no file of valid rows is read whole."""
    real = optional_trace(RAW)
    reals = []
    if real is not None:
        plain = tmp_path / "raw.json"
        plain.write_bytes(gzip.decompress(real.read_bytes()))
        reals = [real, plain]
    rows = [[5, 4, -100, 2], *_random_rows(40_000, seed=1), [10**6, 4, -100, 3]]
    compact, indented = tmp_path / "compact.json", tmp_path / "indented.json.gz"
    compact.write_text("\n  " + json.dumps(rows, separators=(",", ":")) + "\n")
    indented.write_bytes(gzip.compress(json.dumps(rows, indent=1).encode()))
    for path in (*reals, compact, indented):
        log = _assert_same(path, never_whole=monkeypatch)
        assert isinstance(log, gpuviz.EventLog) and not log.truncated
    log = _assert_same(compact)
    # two events a row (a segment of its own per tensor), plus the two 100-byte tensors alive before the file
    assert isinstance(log, gpuviz.EventLog) and len(log) == 2 * sum(1 for r in rows if r[1] != 3) + 2 * 2
    assert "2 DESTROY rows have no earlier live tensor of their size: seeded as PREEXISTING" in log.meta["notes"]
    assert compact.stat().st_size > 40 * torch_memory_timeline._CHUNK


@pytest.mark.parametrize(
    ("text", "outcome"),
    [
        ("[[1,2,256,4],[2,2,512,4],[3,4,-256,4]", "truncated 2"),  # cut before the list's end
        ("[[1,2,256,4],[2,2,512,4],[3,4,-25", "truncated 2"),  # cut in a row
        ("[[1,2,256,4],[2,2,512,4],]", "truncated 2"),  # a trailing comma
        ("[[1,2,256,4],[2,2,512,4]] x", "truncated 2"),  # data after the list
        ("[[1,2,256,4],[2,2,512,4]]]", "truncated 2"),
        ("[[1,2,256,4] ,[2,2,512,4]]\n", "complete 2"),  # white space before a comma: read whole, same log
        ("[[1,2,256,4],[2,2,256,4],[3,4,-256.0,4]]", "row 2 is [3, 4, -256.0, 4], not"),
        ("[[1,2,256,4],[2,2,256,4],[3,4,true,4]]", "row 2 is [3, 4, True, 4], not"),
        ("[[1,2,256,4],[2,2,256,4],[3,4,-256,4,5]]", "row 2 is [3, 4, -256, 4, 5], not"),
        ('[[1,2,256,4],[2,2,256,4],"a],[1,2,3,4]"]', "row 2 is 'a],[1,2,3,4]', not"),
        ("[[1,2,256,4],[2,2,256,4],[3,9,-512,4]]", "row 2 has action 9 / category 4 out of range"),
        ("[[1,2,256,4],[2,4,-512,4]]", "complete 2"),  # a DESTROY first: a seed, then the CREATE
    ],
)  # fmt: skip
def test_irregular_files_get_what_reading_whole_gives(tmp_path: Path, text: str, outcome: str) -> None:
    for path in (tmp_path / "t.json", tmp_path / "t.json.gz"):
        path.write_bytes(gzip.compress(text.encode()) if path.suffix == ".gz" else text.encode())
        got = _assert_same(path)
        if isinstance(got, str):
            assert outcome in got
        else:
            state, allocs = outcome.split()
            assert got.truncated == (state == "truncated") and len(got.filter(kind="alloc")) == int(allocs)


def test_a_cut_gzip_stream_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "cut.json.gz"
    data = gzip.compress(json.dumps(_random_rows(5_000, seed=2)).encode())
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(LogFormatError, match="the gzip stream is truncated or corrupt"):
        gpuviz.load(path)
    assert _assert_same(path).startswith("LogFormatError")


def test_progress_moves_in_both_passes_and_fills_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The streamed reading reads the file twice: each pass moves the bar half the file's bytes."""
    seen: list[int] = []

    at_open: list[int] = []  # bytes reported when each pass opens the file
    opened = Source.open

    def open_counted(self: Source, **options: bool) -> object:
        at_open.append(sum(seen))
        return opened(self, **options)

    monkeypatch.setattr(Source, "open", open_counted)
    raw = trace_path(RAW)
    size = raw.stat().st_size
    log = torch_memory_timeline.read(Source(raw, progress=ProgressCounter(seen)), progress=NullProgress())
    assert len(log) == 14670
    assert at_open == [0, size // 2] and sum(seen) == size


def test_passes_reports_each_byte_once_over_all_passes() -> None:
    from gpuviz.importers.source import Passes

    seen: list[int] = []

    passes = Passes(ProgressCounter(seen), 3)
    for n in (1, 1, 1, 7, 0, 5, 30):  # 45 bytes read: 15 reported
        passes.update(n)
    assert sum(seen) == 15 and all(n > 0 for n in seen)
    with pytest.raises(ValueError, match="passes must be >= 1"):
        Passes(ProgressCounter(seen), 0)
