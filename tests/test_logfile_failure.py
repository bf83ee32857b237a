"""A log recording to a file whose writes start failing (a full disk; here a file-size limit):
the allocations that flush it go on unharmed, every event stays in the log, and close() says
what happened."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuviz import EventLog, load
from gpuviz.capture.native import native_core_available

_RUN = """
import json, resource, signal, sys
from gpuviz import EventLog, SimUpstream
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.capture.native import NativeBFCAllocator

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
cls = NativeBFCAllocator if sys.argv[1] == "native" else ReferenceBFCAllocator
path, saved = sys.argv[2], sys.argv[3]
if sys.argv[4] == "pyarrow":  # the file's batches written by pyarrow, as without the C batch writer
    import gpuviz.log.writer
    gpuviz.log.writer._BatchWriter = None
log = EventLog(path)
alloc = cls(SimUpstream("64GiB"), growth=True, log=log)
resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, resource.RLIM_INFINITY))
live, errors = [], []
for i in range(20_000):
    try:
        live.append(alloc.allocate(256 * (i % 5 + 1)))
        if i % 3 == 0:
            alloc.free(live.pop(0))
    except Exception as exc:
        errors.append(repr(exc))
closing = []
file_error = None
for _ in range(2):
    try:
        log.close()
        closing.append(None)
    except OSError as exc:
        closing.append(str(exc))
        file_error = log.file_error
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
log.save(saved)
events = len(log)
log.record_to(saved + ".again")  # recording to a new file: all events so far, then the new ones
log.mark("after")
cleared = log.file_error is None
log.close()
in_use = sorted(c.address for c in alloc.state().chunks() if c.in_use)
print(json.dumps({"errors": errors, "live": len(live), "held": sorted(live) == in_use, "events": events,
                  "closing": closing, "file_error": file_error, "cleared": cleared}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE and SIGXFSZ")
@pytest.mark.parametrize(("allocator", "writer"), [("native", "c"), ("python", "c"), ("python", "pyarrow")])
def test_a_file_that_cannot_be_written_leaves_the_allocations_and_the_log_whole(
    allocator: str, writer: str, tmp_path: Path
) -> None:
    if allocator == "native" and not native_core_available():
        pytest.skip("the native core is not built")
    path, saved = tmp_path / "run.arrow", tmp_path / "saved.arrow"
    out = subprocess.run(
        [sys.executable, "-c", _RUN, allocator, str(path), str(saved), writer],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["errors"] == []  # no allocation or free saw the file's error
    assert result["live"] == 20_000 - 6_667
    assert result["held"] is True  # every chunk in use is one whose address reached its caller
    # said once, when it happened (the logger), and once more by close(); the second close is quiet
    assert out.stderr.count("gpuviz: writing the event log to") == 1, out.stderr
    first, second = result["closing"]
    assert first == f"the event log's file was not finished: {result['file_error']}"
    assert second is None
    assert f"writing the event log to {path} failed after " in result["file_error"]
    assert "File too large" in result["file_error"] and "recording goes on in memory" in result["file_error"]
    written = int(result["file_error"].split(" failed after ")[1].split(" events")[0])
    # the file: the batches written whole before the failure, flagged truncated
    partial = load(path)
    assert partial.truncated and not partial.corrupt
    assert len(partial) == written > 0
    # the log: every event (6,667 frees, 20,000 allocs and their splits, merges and segments)
    whole = load(saved)
    assert len(whole) == result["events"] > 20_000 + 6_667
    assert not whole.truncated
    for name in ("kind", "address", "size", "time_ns"):
        assert np.array_equal(partial[name], whole[name][:written])
    again = load(str(saved) + ".again")  # a new file after the failure: the whole log and what came after
    assert result["cleared"] is True
    assert len(again) == result["events"] + 1 and not again.truncated and again[-1].tag == "after"
    kinds = whole["kind"]
    assert int(np.count_nonzero(kinds == kinds.dtype.type(2))) == 20_000  # Kind.ALLOC


def test_record_to_a_path_that_cannot_be_opened_raises_and_leaves_the_log_in_memory(tmp_path: Path) -> None:
    log = EventLog()
    log.mark("before")
    with pytest.raises(OSError):
        log.record_to(tmp_path / "missing-dir" / "run.arrow")
    log.mark("after")
    assert [e.tag for e in log] == ["before", "after"]
    assert log.file_error is None
    log.close()  # not recording to a file: nothing to finish


_FINISH = """
import os, resource, signal, sys
from gpuviz import EventLog
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
path = sys.argv[1]
log = EventLog(path)
for i in range(100):
    log.mark(f"m{i}")
log.flush()
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path), resource.RLIM_INFINITY))
try:
    log.close()
except OSError as exc:
    print(exc)
log.close()
print(len(log))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE and SIGXFSZ")
def test_a_file_that_cannot_be_finished_is_reported_by_close(tmp_path: Path) -> None:
    """The end-of-log marker does not fit: close() raises once, naming the file; the events
    written before are still in the file (flagged truncated) and all of them in the log."""
    path = tmp_path / "run.arrow"
    out = subprocess.run([sys.executable, "-c", _FINISH, str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    message, events = out.stdout.splitlines()
    assert message.startswith(f"the event log's file was not finished: finishing the event log's file {path} failed (")
    assert "File too large" in message and message.endswith("(log.save(path) writes it whole)")
    assert events == "100"
    partial = load(path)
    assert partial.truncated and [e.tag for e in partial] == [f"m{i}" for i in range(100)]
