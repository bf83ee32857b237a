"""The C batch writer (gpuviz.log._batchwriter): a log recording to a file hands each flushed
block to the writer's thread, which splits, checksums and writes it as an Arrow IPC batch. Its
file is the one pyarrow writes (same batches, same custom metadata), and it loads verified."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuviz import EventLog, load
from gpuviz.log.arrowfile import ARROW_SCHEMA
from gpuviz.log.checksums import batch_checksum, digest
from gpuviz.log.rows import ROW_BYTES, split_rows
from gpuviz.log.schema import DTYPES, ROW_STRUCT
from gpuviz.log.writer import LogWriter

batchwriter = pytest.importorskip("gpuviz.log._batchwriter", reason="built only where a C compiler exists")
_NAMES = tuple(DTYPES)

_row = st.tuples(
    st.integers(0, 2**62),  # time_ns
    st.integers(0, 6),  # kind: segment_alloc ... oom
    st.just(0),  # flags (those kinds have none)
    st.integers(-1, 0),  # device
    st.integers(-1, 0),  # peer
    st.integers(0, 2**63 - 1),  # thread
    *[st.integers(-(2**63), 2**63 - 1)] * 6,  # address, size, requested, segment, largest_free, duration_ns
    st.integers(-1, -1),  # tag
    st.integers(-1, -1),  # stack
)


def _block(rows: list[tuple[int, ...]]) -> bytes:
    return b"".join(ROW_STRUCT.pack(*row) for row in rows)


def _batches(path: Path) -> list[tuple[dict[str, np.ndarray], dict[bytes, bytes]]]:
    """Every batch of a stream-form file: its columns and its custom metadata."""
    reader = ipc.open_stream(path.read_bytes())
    out = []
    while True:
        try:
            record, metadata = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            return out
        record.validate(full=True)
        columns = {name: record.column(i).to_numpy() for i, name in enumerate(_NAMES)}
        out.append((columns, dict(metadata or {})))


def _record(path: Path, blocks: list[list[tuple[int, ...]]], *, native: bool) -> EventLog:
    """Write ``blocks`` as batches with a LogWriter (new strings, a device and meta changing between
    them, as a recording's side tables do) and close it in the stream form."""
    log = EventLog()
    log.add_device("GPU:0")  # the rows' device 0
    writer = LogWriter(path, log, native=native)
    seq = 0
    for index, rows in enumerate(blocks):
        if index % 2:
            log.intern_string(f"op-{index}")
        if index % 3 == 1:
            log.add_device(f"GPU:{index}", chunk_bytes=index)
            log.meta["step"] = index
        writer.write_rows(log, _block(rows), seq)
        seq += len(rows)
    writer.close()
    return log


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blocks=st.lists(st.lists(_row, max_size=40), max_size=6))
def test_the_c_writer_writes_the_batches_pyarrow_writes(tmp_path: Path, blocks: list[list[tuple[int, ...]]]) -> None:
    native, arrow = tmp_path / "native.arrow", tmp_path / "arrow.arrow"
    _record(native, blocks, native=True)
    _record(arrow, blocks, native=False)
    ours, theirs = _batches(native), _batches(arrow)
    assert len(ours) == len(theirs) == len(blocks) + 2  # the header's empty batch, one per block, the end
    for (columns, metadata), (expected, expected_metadata) in zip(ours, theirs, strict=True):
        assert metadata == expected_metadata  # delta, checksum record (byte for byte), end marker
        for name in _NAMES:
            assert columns[name].dtype == DTYPES[name]
            assert np.array_equal(columns[name], expected[name])
    loaded = load(native)
    assert not loaded.truncated and not loaded.corrupt and loaded.problems == []
    assert len(loaded) == sum(map(len, blocks))
    assert loaded["seq"].tolist() == list(range(len(loaded)))


def test_a_block_of_many_chunks_gets_one_digest_per_chunk(tmp_path: Path) -> None:
    """``chunk_rows`` rows per digest, over all columns' bytes of those rows (checksums.py)."""
    rng = np.random.default_rng(7)
    rows = [tuple(int(v) for v in rng.integers(0, 100, size=14)) for _ in range(10)]
    path = tmp_path / "chunks.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        writer = batchwriter.BatchWriter(fd, 3)
        delta = b'{"strings": [], "stacks": []}'
        writer.submit(_block(rows), 100, delta, digest(delta).encode())
        writer.wait()
        assert (writer.events, writer.batches) == (10, 1)
    finally:
        os.close(fd)
    stream = ARROW_SCHEMA.serialize().to_pybytes() + path.read_bytes()  # the schema message LogWriter puts first
    record, metadata = ipc.open_stream(stream).read_next_batch_with_custom_metadata()
    columns = [np.empty(10, dtype=dt) for dt in DTYPES.values()]
    split_rows(_block(rows), columns, 100)
    for i, column in enumerate(columns):
        assert np.array_equal(record.column(i).to_numpy(), column)
    assert metadata[b"gpuviz.delta"] == delta
    checksum = json.loads(metadata[b"gpuviz.checksum"])
    assert checksum == json.loads(batch_checksum(columns, delta, chunk_rows=3))
    assert len(checksum["chunks"]) == 4  # rows 0-2, 3-5, 6-8, 9


def test_bad_input_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "bad.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        writer = batchwriter.BatchWriter(fd, 1 << 16)
        digest16 = digest(b"{}").encode()
        with pytest.raises(ValueError, match=f"not whole rows of {ROW_BYTES} bytes"):
            writer.submit(b"x" * (ROW_BYTES + 1), 0, b"{}", digest16)
        with pytest.raises(TypeError, match="delta_digest: 16 bytes"):
            writer.submit(b"", 0, b"{}", b"short")
        columns = [np.zeros(2, dtype=dt) for dt in DTYPES.values()]
        with pytest.raises(ValueError, match="column 3 holds 4 bytes of 2-byte values, not 2 values of 1 bytes"):
            writer.write([*columns[:3], np.zeros(2, dtype=np.int16), *columns[4:]], [])
        with pytest.raises(ValueError, match="15 columns"):
            writer.write(columns[:14], [])
        with pytest.raises(TypeError, match="metadata pair 0 is not a"):
            writer.write(columns, [("key", b"value")])
        writer.wait()
        assert (writer.events, writer.batches) == (0, 0)
    finally:
        os.close(fd)
    assert path.read_bytes() == b""
    with pytest.raises(ValueError, match="file descriptor >= 0 and chunk_rows > 0"):
        batchwriter.BatchWriter(0, 0)


def test_a_failed_write_is_raised_by_the_next_call_and_nothing_more_is_written(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # writes fail: EPIPE (SIGPIPE is ignored by Python)
    try:
        writer = batchwriter.BatchWriter(write, 1 << 16)
        delta = b"{}"
        writer.submit(_block([(1,) * 14]), 0, delta, digest(delta).encode())
        with pytest.raises(BrokenPipeError):
            writer.wait()
        with pytest.raises(BrokenPipeError):  # and again: the writer stays failed
            writer.submit(_block([(1,) * 14]), 1, delta, digest(delta).encode())
        assert (writer.events, writer.batches) == (0, 0)
    finally:
        os.close(write)


_KILLED = """
import os, sys
from gpuviz import EventLog
log = EventLog(sys.argv[1], flush_rows=64)
for i in range(1000):
    log.mark(f"m{i % 7}")
log.flush()  # every event recorded so far is in the file when it returns
os._exit(0)  # no close: no end-of-log marker
"""


def test_a_flushed_recording_killed_before_close_loads_every_event(tmp_path: Path) -> None:
    path = tmp_path / "killed.arrow"
    out = subprocess.run([sys.executable, "-c", _KILLED, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    log = load(path)
    assert log.truncated and not log.corrupt
    assert len(log) == 1000 and [e.tag for e in log][:8] == ["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m0"]


_FORKED = """
import os, sys
from gpuviz import EventLog, load
log = EventLog(sys.argv[1], flush_rows=64)
for i in range(100):
    log.mark("parent")
log.flush()
pid = os.fork()
if pid == 0:  # the child: the file's writer thread stayed in the parent
    for i in range(500):
        log.mark("child")
    ok = log.file_error is not None and "forked" in log.file_error and len(log) == 600
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
for i in range(100):
    log.mark("parent")
log.close()
print(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_records_in_memory_and_leaves_the_parents_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "forked.arrow"
    out = subprocess.run([sys.executable, "-c", _FORKED, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0"], out.stderr  # the child's log went on in memory, with the reason
    log = load(path)
    assert not log.truncated and [e.tag for e in log] == ["parent"] * 200


def test_a_flush_that_finds_two_blocks_still_to_be_written_waits_for_the_oldest() -> None:
    """Two blocks in flight at most (the crash bound: eventlog.py flushes every flush_rows // 3):
    the file here is a pipe nobody reads until a third submit has had to wait (``waits`` counts it
    before it blocks)."""
    import threading
    import time

    read, write = os.pipe()
    received = bytearray()
    made, over = threading.Event(), threading.Event()  # over: the test ended early (a failure)
    writers: list[batchwriter.BatchWriter] = []

    def drain() -> None:
        made.wait()
        while writers and writers[0].waits == 0 and not over.is_set():  # until the third submit waits
            time.sleep(0.001)
        while chunk := os.read(read, 1 << 20):  # until the write end is closed
            received.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        writer = batchwriter.BatchWriter(write, 1 << 16)
        writers.append(writer)
        made.set()
        rows = _block([(i, 2, 0, 0, 0, *(i,) * 7, -1, -1) for i in range(2000)])  # ~156 KB: more than a pipe holds
        delta = b"{}"
        writer.submit(rows, 0, delta, digest(delta).encode())
        writer.submit(rows, 2000, delta, digest(delta).encode())
        assert writer.waits == 0 and writer.events == 0  # both taken at once, the first stuck in the pipe
        writer.submit(rows, 4000, delta, digest(delta).encode())
        assert writer.waits == 1 and writer.waited_ns > 0  # until the reader began
        assert writer.events in (2000, 4000)  # the first block written whole before the third was taken
        writer.wait()
        assert (writer.events, writer.batches) == (6000, 3)
        assert writer.waits in (1, 2)  # 2 when wait() found a block still in flight
    finally:
        over.set()
        made.set()
        os.close(write)
        reader.join()
        os.close(read)
    stream = ARROW_SCHEMA.serialize().to_pybytes() + bytes(received)
    batches = ipc.open_stream(stream)
    seqs = [batches.read_next_batch().column(0).to_numpy() for _ in range(3)]
    assert np.array_equal(np.concatenate(seqs), np.arange(6000))


def _voluntary_switches(tid: str) -> int:
    for line in Path(f"/proc/self/task/{tid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads listed in /proc (Linux)")
def test_the_writers_thread_sleeps_until_a_block_is_handed_over(tmp_path: Path) -> None:
    """No polling: an idle writer costs no wake-ups (laptops, shared nodes); a submit wakes it."""
    import time

    fd = os.open(tmp_path / "idle.arrow", os.O_WRONLY | os.O_CREAT)
    before = set(os.listdir("/proc/self/task"))
    writer = batchwriter.BatchWriter(fd, 1 << 16)
    try:
        (tid,) = set(os.listdir("/proc/self/task")) - before  # the writer's thread
        rows, delta = _block([(i, 2, 0, 0, 0, *(i,) * 7, -1, -1) for i in range(100)]), b"{}"
        writer.submit(rows, 0, delta, digest(delta).encode())
        writer.wait()
        idle = _voluntary_switches(tid)
        time.sleep(0.1)  # an idle spell, observed
        assert _voluntary_switches(tid) - idle <= 1  # at most its going back to sleep after the block
        writer.submit(rows, 100, delta, digest(delta).encode())
        writer.wait()
        assert (writer.events, writer.batches) == (200, 2)
    finally:
        del writer
        os.close(fd)
