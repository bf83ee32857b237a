"""Event-log files: save and load, Parquet, versions, files cut short or damaged."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from eventlogs import recorded_stream, small_run

from gpuviz import EventLog, LogFormatError, SimUpstream, load, mark
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.log.arrowfile import ARROW_SCHEMA


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    log = EventLog(meta={"run": "test"})
    alloc = small_run(log)
    mark("done", log=log)
    path = tmp_path / "run.arrow"
    log.save(path)
    loaded = load(path)
    assert list(loaded) == list(log)
    assert loaded.truncated is False
    assert loaded.meta["run"] == "test"
    assert loaded.devices[0].name == "GPU:0"
    assert loaded.devices[0].options["memory_limit"] == alloc.memory_limit
    assert loaded.devices[0].options["growth"] is False
    header = loaded.header
    assert header["units"]["time"] == "ns" and header["units"]["size"] == "bytes"
    assert (header["format_version"], header["checksums"]) == (2, True)
    assert (loaded.corrupt, loaded.problems) == (False, [])
    # the random-access form: an Arrow IPC file, all events in one batch, then the end marker
    with pa.memory_map(str(path)) as source:
        reader = ipc.open_file(source)
        assert reader.schema.metadata[b"gpuviz.magic"] == b"gpuviz-eventlog"
        assert reader.schema.metadata[b"gpuviz.format_version"] == b"2"
        assert len(reader.schema.metadata[b"gpuviz.header_checksum"]) == 16
        assert [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)] == [10, 0]
        assert json.loads(reader.get_batch_with_custom_metadata(1)[1][b"gpuviz.end"]) == {"events": 10, "batches": 1}


def test_empty_log_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "empty.arrow"
    EventLog().save(path)
    assert len(load(path)) == 0


def test_to_parquet(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "run.parquet"
    small_run().log.to_parquet(path)
    table = pq.read_table(path)
    assert table.num_rows == 9
    assert table.column("kind").to_pylist()[0] == "segment_alloc"
    assert table.schema.metadata[b"gpuviz.format_version"] == b"2"


def test_other_format_version_is_rejected_clearly(tmp_path: Path) -> None:
    path = tmp_path / "v99.arrow"
    schema = ARROW_SCHEMA.with_metadata(
        {"gpuviz.magic": "gpuviz-eventlog", "gpuviz.format_version": "99", "gpuviz.header": "{}"}
    )
    with open(path, "wb") as f, ipc.new_stream(f, schema):
        pass
    with pytest.raises(LogFormatError, match="format version 99; this gpuviz reads versions 1, 2"):
        load(path)


def test_files_that_are_not_gpuviz_logs(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.arrow"
    garbage.write_bytes(b"this is not arrow at all" * 10)
    with pytest.raises(LogFormatError, match="not a gpuviz event log"):
        load(garbage)
    empty = tmp_path / "empty.arrow"
    empty.write_bytes(b"")
    with pytest.raises(LogFormatError, match="it is empty"):
        load(empty)
    other = tmp_path / "other.arrow"
    table = pa.table({"x": [1, 2]})
    with open(other, "wb") as f, ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    with pytest.raises(LogFormatError, match="no gpuviz magic"):
        load(other)


def test_truncated_file_loads_its_complete_batches(tmp_path: Path) -> None:
    log, stream = recorded_stream(tmp_path)
    cut = tmp_path / "cut.arrow"
    cut.write_bytes(stream[: len(stream) - 200])
    loaded = load(cut)
    assert loaded.truncated is True and loaded.corrupt is False
    assert len(loaded) == 8
    assert list(loaded) == list(log)[:8]
    assert loaded.problems[0].startswith("batch 3 is cut short or unreadable")


def test_a_file_cut_at_a_batch_boundary_is_flagged_truncated(tmp_path: Path) -> None:
    """Every batch is complete, but the end-of-log marker written by close is missing."""
    log, stream = recorded_stream(tmp_path)
    whole = tmp_path / "whole.arrow"
    whole.write_bytes(stream)
    loaded = load(whole)
    assert list(loaded) == list(log)
    assert (loaded.truncated, loaded.corrupt) == (True, False)
    assert loaded.problems == [
        "the file ends after batch 3 without its end-of-log marker (cut short)",
        "loaded the first 10 events",
    ]


def flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0x10]) + data[offset + 1 :]


def test_a_damaged_batch_ends_the_readable_prefix(tmp_path: Path) -> None:
    log, stream = recorded_stream(tmp_path)
    # the second batch holds the alloc of 2048 bytes at BASE + 1024 (event 4): damage its size
    value = np.int64(2000).tobytes()  # requested bytes of event 4, only there and in event 6
    offset = stream.index(value)
    damaged = tmp_path / "damaged.arrow"
    damaged.write_bytes(flip(stream, offset))
    loaded = load(damaged)
    assert (loaded.truncated, loaded.corrupt) == (True, True)
    assert list(loaded) == list(log)[:4]
    assert loaded.problems == [
        "batch 2 (events from 4) is damaged: rows 0-3 of it do not match their checksum",
        "loaded the first 4 events",
    ]


def test_a_damaged_chunk_of_a_saved_log_keeps_the_chunks_before_it(tmp_path: Path) -> None:
    log = EventLog()
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), log=log)
    for size in range(1, 40_000):
        alloc.free(alloc.allocate(size * 256))
    path = tmp_path / "run.arrow"
    log.save(path)
    data = path.read_bytes()
    # the requested bytes of the alloc and free of 30001 * 256 bytes: in the second chunk of 65536 events
    event = int(np.flatnonzero(log["requested"] == 30_001 * 256)[0])
    assert 65536 <= event < 2 * 65536 and len(log) == 88194
    offset = data.index(np.array([30_001 * 256, 30_001 * 256], dtype=np.int64).tobytes())
    path.write_bytes(flip(data, offset))
    loaded = load(path)
    assert (len(loaded), loaded.truncated, loaded.corrupt) == (65536, True, True)
    assert loaded["size"].tolist() == log["size"][:65536].tolist()
    assert (
        loaded.problems[0] == "batch 0 (events from 0) is damaged: rows 65536-88193 of it do not match their checksum"
    )


def test_a_damaged_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.arrow"
    small_run().log.save(path)
    data = path.read_bytes()
    offset = data.index(b'"units"')
    path.write_bytes(data[:offset] + b"'" + data[offset + 1 :])
    with pytest.raises(LogFormatError, match="the header is damaged"):
        load(path)


def write_v1(path: Path, log: EventLog, *, delta: bytes | None = None, header: bytes | None = None) -> None:
    """Write ``log`` as format version 1 wrote it (no checksums, no end marker)."""
    header = header or json.dumps({"clock": "c", "units": {}, "devices": [{"name": d.name, "options": d.options}
                                   for d in log.devices], "meta": log.meta}).encode()  # fmt: skip
    schema = ARROW_SCHEMA.with_metadata(
        {"gpuviz.magic": "gpuviz-eventlog", "gpuviz.format_version": "1", "gpuviz.header": header}
    )
    delta = delta or json.dumps({"strings": list(log.strings), "stacks": []}).encode()
    columns = log.columns
    with open(path, "wb") as f, ipc.new_stream(f, schema) as writer:
        batch = pa.RecordBatch.from_arrays([pa.array(columns[n]) for n in ARROW_SCHEMA.names], schema=ARROW_SCHEMA)
        writer.write_batch(batch, custom_metadata={"gpuviz.delta": delta})


def test_version_1_files_still_load_flagged_without_checksums(tmp_path: Path) -> None:
    log = small_run().log
    path = tmp_path / "v1.arrow"
    write_v1(path, log)
    loaded = load(path)
    assert list(loaded) == list(log)
    assert (loaded.header["format_version"], loaded.header["checksums"]) == (1, False)
    assert (loaded.truncated, loaded.corrupt) == (False, False)


def test_indices_outside_the_side_tables_are_refused(tmp_path: Path) -> None:
    log = small_run().log  # two strings: weights, grads
    columns = {name: column.copy() for name, column in log.columns.items()}
    columns["tag"][5] = 2
    bad = EventLog()
    bad.devices, bad.strings = log.devices, log.strings
    bad._set_columns(columns)
    bad.save(tmp_path / "v2.arrow")
    with pytest.raises(LogFormatError, match="event 5 has tag 2, outside the 2 strings of the log"):
        load(tmp_path / "v2.arrow")
    for name, value, message in [
        ("device", 1, "event 3 has device 1, outside the 1 devices"),
        ("kind", 12, "event 3 has kind 12, outside the 12 kinds"),
        ("stack", 0, "event 3 has stack 0, outside the 0 stacks"),
        ("seq", 7, "event 3 has sequence number 7 (expected 3)"),
    ]:
        columns = {n: column.copy() for n, column in log.columns.items()}
        columns[name][3] = value
        bad._set_columns(columns)
        write_v1(tmp_path / "v1.arrow", bad)
        with pytest.raises(LogFormatError, match=re.escape(message)):
            load(tmp_path / "v1.arrow")
    columns = {n: column.copy() for n, column in log.columns.items()}
    columns["kind"][3], columns["flags"][3] = 9, 5  # a mark with phase 5
    bad._set_columns(columns)
    write_v1(tmp_path / "v1.arrow", bad)
    message = "event 3 (mark) has flags 5; a mark's flags are one of [0, 1, 2]"
    with pytest.raises(LogFormatError, match=re.escape(message)):
        load(tmp_path / "v1.arrow")


def test_raw_decoding_errors_become_log_format_errors(tmp_path: Path) -> None:
    log = small_run().log
    path = tmp_path / "v1.arrow"
    write_v1(path, log, header=b'{"devices": [{"nom": "GPU:0"}]}')
    with pytest.raises(LogFormatError, match="KeyError"):
        load(path)
    write_v1(path, log, header=b"\xff{")
    with pytest.raises(LogFormatError, match="the header cannot be read"):
        load(path)
    write_v1(path, log, header=b"[1, 2]")
    with pytest.raises(LogFormatError, match=r"the header cannot be read \(TypeError: the header is a list"):
        load(path)
    write_v1(path, log, delta=b'{"strings": [1, 2]}')  # a damaged delta ends the prefix: nothing left
    loaded = load(path)
    assert (len(loaded), loaded.truncated, loaded.corrupt) == (0, True, True)
    assert "strings are not a list of strings" in loaded.problems[0]


def test_a_loaded_log_survives_its_file_being_replaced(tmp_path: Path) -> None:
    """Loaded columns are views of the file's memory mapping: writers never rewrite in place."""
    path = tmp_path / "run.arrow"
    log = small_run().log
    log.save(path)
    loaded = load(path)
    assert not loaded["address"].flags.writeable and not loaded["address"].flags.owndata
    EventLog().save(path)  # replaced by an empty log
    recording = EventLog(path)  # and again by a recording
    recording.close()
    assert loaded["address"].tolist() == log["address"].tolist()
    assert len(load(path)) == 0
    link = tmp_path / "link.arrow"
    link.symlink_to(path)
    log.save(link)  # writing through a symlink replaces its target; the link stays
    assert link.is_symlink() and len(load(path)) == len(log)


def test_the_former_file_module_still_answers_with_a_deprecation_warning(tmp_path: Path) -> None:
    import gpuviz.log.fileio as fileio

    log = EventLog()
    small_run(log)
    log.save(tmp_path / "run.arrow")
    with pytest.warns(DeprecationWarning, match=r"gpuviz\.log\.fileio\.load moved to gpuviz\.log\.files\.load"):
        loaded = fileio.load(tmp_path / "run.arrow")
    assert list(loaded) == list(log)
    with pytest.raises(AttributeError, match="has no attribute 'read_everything'"):
        fileio.read_everything  # noqa: B018
