"""The command line: ``gpuviz demo``, ``report``, ``summary``, ``info``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpuviz
from gpuviz import load, replay
from gpuviz.capture import native
from gpuviz.capture.native import allocator_description
from gpuviz.capture.recorder import recorder_description
from gpuviz.frontends.cli import main
from gpuviz.scenarios.native import native_replay_available, replay_description


@pytest.fixture
def fresh_runtime():  # type: ignore[no-untyped-def]
    gpuviz.reset(configuration=True)
    yield
    gpuviz.reset(configuration=True)


def test_demo_writes_a_log_and_a_report(tmp_path: Path, capsys, fresh_runtime) -> None:  # type: ignore[no-untyped-def]
    log_path, report = tmp_path / "demo.arrow", tmp_path / "demo.html"
    assert main(["demo", "--log", str(log_path), "-o", str(report)]) == 0
    text = capsys.readouterr().out
    assert "GPU:0:" in text and "out-of-memory    1 event(s)" in text
    assert "Cause: fragmentation" in text
    log = load(log_path)
    kinds = {e.kind for e in log}
    assert {"alloc", "free", "split", "merge", "segment_alloc", "segment_free", "oom", "transfer", "placement",
            "mark"} <= kinds  # fmt: skip
    heap = replay(log)
    for device in heap.devices:
        state = heap.state_at(-1, device=device)
        state.check()
        assert state.segments == ()  # the session released everything
    document = report.read_text()
    assert document.startswith("<!DOCTYPE html>") and "Fragmentation map" in document and "Placement" in document


def test_report_of_a_saved_log_and_bad_input(tmp_path: Path, capsys, fresh_runtime) -> None:  # type: ignore[no-untyped-def]
    log_path = tmp_path / "run.arrow"
    main(["demo", "--log", str(log_path), "-o", str(tmp_path / "x.html")])
    capsys.readouterr()
    assert main(["report", str(log_path), "--cdn", "--group-by", "dtype"]) == 0
    assert "report written to" in capsys.readouterr().out
    html = (tmp_path / "run.html").read_text()
    assert "cdn.plot.ly" in html and "by dtype" in html
    assert main(["summary", str(log_path)]) == 0
    assert "peak in use" in capsys.readouterr().out
    bad = tmp_path / "bad.arrow"
    bad.write_text("nope")
    assert main(["report", str(bad)]) == 2
    assert "not a gpuviz event log" in capsys.readouterr().err
    assert main(["report", str(log_path), "--device", "GPU:7"]) == 2
    assert "GPU:7" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", str(log_path), "--color-by", "rainbow"])


def test_python_dash_m_and_info() -> None:
    proc = subprocess.run([sys.executable, "-m", "gpuviz", "info"], capture_output=True, text=True, check=True)
    assert proc.stdout.startswith("gpuviz 0.1.0")
    assert "/physical_device:GPU:0" in proc.stdout
    assert f"event recorder: {recorder_description()}\n" in proc.stdout
    assert f"allocator: {allocator_description()}\n" in proc.stdout
    assert allocator_description() == "native core (C)" or native._CoreClass is None
    assert f"what-if replays: {replay_description()}\n" in proc.stdout
    assert replay_description() == "C for every policy (tf-bfc on the native core)" or not native_replay_available()
    env = {**os.environ, "GPUVIZ_NATIVE": "0"}
    proc = subprocess.run([sys.executable, "-m", "gpuviz", "info"], capture_output=True, text=True, check=True, env=env)
    assert "event recorder: Python (GPUVIZ_NATIVE=0)\n" in proc.stdout
    assert "allocator: Python (GPUVIZ_NATIVE=0)\n" in proc.stdout or native._CoreClass is None
    assert "what-if replays: Python (GPUVIZ_NATIVE=0)\n" in proc.stdout or not native_replay_available()


# ------------------------------------------------------------- damaged input files
def _saved_log(path: Path) -> Path:
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"))
    p = alloc.allocate(1000, tag="weights")
    alloc.allocate(5000, tag="activations")
    alloc.free(p)
    alloc.log.save(path)
    return path


def _rewrite(source: Path, target: Path, *, header: bytes | None = None, column: tuple[str, int] | None = None) -> Path:
    """A copy of the log ``source`` with its JSON header replaced (``b""`` drops it) or one
    column of every row set to a value — with valid checksums, as a buggy writer would make it,
    so that the reader's own checks (not the checksums) must find the damage."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from gpuviz.log.checksums import batch_checksum, digest

    with open(source, "rb") as file:
        reader = ipc.open_file(file) if file.read(6) == b"ARROW1" else None
        file.seek(0)
        if reader is not None:
            metadata = dict(reader.schema.metadata)
            batches = [reader.get_record_batch(i) for i in range(reader.num_record_batches)]
            customs = [dict(reader.get_batch_with_custom_metadata(i)[1] or {}) for i in range(len(batches))]
            schema = reader.schema
        else:
            stream = ipc.open_stream(file)
            metadata, schema = dict(stream.schema.metadata), stream.schema
            pairs = []
            while True:
                try:
                    pairs.append(stream.read_next_batch_with_custom_metadata())
                except StopIteration:
                    break
            batches = [b for b, _ in pairs]
            customs = [dict(c or {}) for _, c in pairs]
    if header == b"":
        del metadata[b"gpuviz.header"]
    elif header is not None:
        metadata[b"gpuviz.header"] = header
        metadata[b"gpuviz.header_checksum"] = digest(header).encode()
    schema = schema.with_metadata(metadata)
    with open(target, "wb") as file, ipc.new_stream(file, schema) as writer:
        for batch, custom in zip(batches, customs, strict=True):
            if column is not None and batch.num_rows:
                index = schema.names.index(column[0])
                values = np.full(batch.num_rows, column[1], dtype=batch.column(index).type.to_pandas_dtype())
                arrays = [pa.array(values) if i == index else batch.column(i) for i in range(batch.num_columns)]
                batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
                columns = [batch.column(i).to_numpy() for i in range(batch.num_columns)]
                custom[b"gpuviz.checksum"] = batch_checksum(columns, custom.get(b"gpuviz.delta", b"{}"))
            writer.write_batch(batch, custom_metadata=custom or None)
    return target


@pytest.mark.parametrize("command", ["report", "summary"])
def test_damaged_logs_give_one_line_and_status_2(tmp_path: Path, capsys, command: str) -> None:  # type: ignore[no-untyped-def]
    good = _saved_log(tmp_path / "good.arrow")
    cases = {
        "no header": (_rewrite(good, tmp_path / "noheader.arrow", header=b""), "header"),
        "bad JSON": (_rewrite(good, tmp_path / "json.arrow", header=b"{not json"), "JSON"),
        "bad UTF-8": (_rewrite(good, tmp_path / "utf8.arrow", header=b'{"meta": "\xff\xfe"}'), "UTF-8"),
        "tag out of range": (_rewrite(good, tmp_path / "tag.arrow", column=("tag", 99)), ""),
        "device out of range": (_rewrite(good, tmp_path / "device.arrow", column=("device", 7)), ""),
        "not a log": (tmp_path / "text.arrow", "not a gpuviz event log"),
        "missing": (tmp_path / "missing.arrow", "No such file or directory"),
    }
    (tmp_path / "text.arrow").write_text("nope")
    for name, (path, words) in cases.items():
        assert main([command, str(path)]) == 2, name
        out, err = capsys.readouterr()
        assert err.startswith(f"gpuviz: error: {path}: ") and err.endswith("\n"), (name, err)
        assert err.count("\n") == 1 and "Traceback" not in err, (name, err)
        assert words.lower() in err.lower(), (name, err)
        assert out == "", name
    assert not (tmp_path / "noheader.html").exists()


def test_errors_name_the_file_they_are_about(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    good = _saved_log(tmp_path / "good.arrow")
    target = tmp_path / "no such folder" / "out.html"
    assert main(["report", str(good), "-o", str(target)]) == 2
    assert capsys.readouterr().err == f"gpuviz: error: {target}: the folder {target.parent} does not exist\n"
    (tmp_path / "text.arrow").write_text("nope")
    assert main(["summary", str(tmp_path / "text.arrow")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuviz: error: {tmp_path / 'text.arrow'}: not a gpuviz event log")
    assert err.count(str(tmp_path / "text.arrow")) == 1  # named once, not twice


def test_a_damaged_log_in_a_real_process_prints_no_traceback(tmp_path: Path) -> None:
    bad = _rewrite(_saved_log(tmp_path / "good.arrow"), tmp_path / "bad.arrow", column=("tag", 99))
    proc = subprocess.run([sys.executable, "-m", "gpuviz", "report", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stdout == "" and proc.stderr.startswith(f"gpuviz: error: {bad}: ") and proc.stderr.count("\n") == 1


def test_demo_errors_do_not_blame_its_output_log(tmp_path: Path, capsys, fresh_runtime) -> None:  # type: ignore[no-untyped-def]
    log_path = tmp_path / "demo.arrow"
    assert main(["demo", "--log", str(log_path), "-o", str(tmp_path / "d.html"), "--gpu-memory", "banana"]) == 2
    err = capsys.readouterr().err
    assert err == "gpuviz: error: memory: cannot read 'banana' as a byte size (expected e.g. '4GiB' or '512MiB')\n"
