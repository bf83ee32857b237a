"""Text formats say when a file ends inside a record: every cut of a TF placement log or an RMM
CSV either loads flagged ``truncated`` (with a note) or is refused with a gpuviz error."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

import gpuviz

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PLACEMENT = "".join(
    f"Executing op {op} in device /job:localhost/replica:0/task:0/device:{device}\n"
    for op, device in [("MatMul", "GPU:0"), ("AddV2", "GPU:12"), ("Relu", "CPU:0"), ("Softmax", "GPU:1")]
)


def _outcomes(tmp_path: Path, name: str, data: bytes, start: int = 1) -> list[tuple[int, bool, int]]:
    """(cut, truncated, events) for every cut of ``data`` from ``start`` on that loads."""
    loaded = []
    for cut in range(start, len(data)):
        path = tmp_path / name
        path.write_bytes(data[:cut])
        try:
            log = gpuviz.load(path, progress=False)
        except gpuviz.GpuvizError:
            continue
        loaded.append((cut, log.truncated, len(log)))
    return loaded


def test_a_placement_log_cut_inside_a_line_is_flagged(tmp_path: Path) -> None:
    whole = tmp_path / "placement.txt"
    whole.write_text(PLACEMENT)
    log = gpuviz.load(whole, progress=False)
    assert not log.truncated and log.device_names == ["GPU:0", "GPU:1", "GPU:12", "CPU:0"] and len(log) == 4
    data = PLACEMENT.encode()
    outcomes = _outcomes(tmp_path, "placement.txt", data)
    assert outcomes, "some cuts still hold placement lines"
    for cut, truncated, _ in outcomes:
        assert truncated == (not data[:cut].endswith(b"\n")), cut
    cut = data.index(b"GPU:12") + len("GPU:1")  # a device cut to another device's name
    (tmp_path / "placement.txt").write_bytes(data[:cut])
    log = gpuviz.load(tmp_path / "placement.txt", progress=False)
    assert log.truncated and any("ends inside a line" in note for note in log.meta["notes"])


def test_a_compressed_placement_log_cut_short_is_flagged(tmp_path: Path) -> None:
    data = gzip.compress(PLACEMENT.encode() * 50)
    path = tmp_path / "placement.txt.gz"
    path.write_bytes(data[: len(data) - 12])
    log = gpuviz.load(path, progress=False)
    assert log.truncated and any("compressed file is cut short" in note for note in log.meta["notes"])


def test_an_rmm_csv_cut_inside_a_row_is_flagged_even_when_the_part_parses(tmp_path: Path) -> None:
    data = (FIXTURES / "rmm_log.dev1.csv").read_bytes()
    whole = gpuviz.load(FIXTURES / "rmm_log.dev1.csv", progress=False)
    assert not whole.truncated
    outcomes = _outcomes(tmp_path, "rmm_log.dev1.csv", data, start=data.index(b"\n") + 1)  # past the header
    assert len(outcomes) > len(data) // 2
    for cut, truncated, _ in outcomes:
        assert truncated == (not data[:cut].endswith(b"\n")), cut
    last_row = data.rstrip(b"\n").rsplit(b"\n", 1)[0] + b"\n"
    cut_in_size = data.rstrip(b"\n")[:-1]  # the last row's last field lost a character: it still parses
    (tmp_path / "rmm_log.dev1.csv").write_bytes(cut_in_size)
    log = gpuviz.load(tmp_path / "rmm_log.dev1.csv", progress=False)
    (tmp_path / "rmm_log.dev1.csv").write_bytes(last_row)
    before = gpuviz.load(tmp_path / "rmm_log.dev1.csv", progress=False)
    assert log.truncated and len(log) == len(before)


def test_an_rmm_field_past_the_csv_limit_is_a_gpuviz_error(tmp_path: Path) -> None:
    header = (FIXTURES / "rmm_log.dev1.csv").read_bytes().split(b"\n")[0]
    path = tmp_path / "rmm_log.dev1.csv"
    path.write_bytes(header + b"\n1," + b"9" * 200_000 + b"\n")
    with pytest.raises(gpuviz.LogFormatError, match=r"line 2 is not CSV gpuviz reads \(field larger than field limit"):
        gpuviz.load(path, progress=False)


def test_special_files_and_hostile_inputs_are_gpuviz_errors(tmp_path: Path) -> None:
    fifo = tmp_path / "x.arrow"
    os.mkfifo(fifo)  # reading it would block until a writer comes
    with pytest.raises(gpuviz.LogFormatError, match=r"x\.arrow is a FIFO, not a file gpuviz opens"):
        gpuviz.load(fifo)
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(gpuviz.LogFormatError, match=r"nested\.json"):
        gpuviz.load(nested, progress=False)
    with pytest.raises(FileNotFoundError):
        gpuviz.load(tmp_path / "missing.arrow")


def test_every_view_of_a_cut_log_says_so(tmp_path: Path) -> None:
    from gpuviz.views.report import report_html  # noqa: F401  (registers the notebook renderer)
    from gpuviz.views.result import MIME_TYPE

    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), log=log)
    for _ in range(2000):
        alloc.free(alloc.allocate(4096))
    log.save(tmp_path / "run.arrow")
    data = (tmp_path / "run.arrow").read_bytes()
    (tmp_path / "cut.arrow").write_bytes(data[: len(data) * 2 // 3])
    cut = gpuviz.load(tmp_path / "cut.arrow")
    assert cut.truncated
    bundle = cut._repr_mimebundle_()
    warning = "the file is truncated (cut short before its end): the events after its last complete part are lost"
    assert str(bundle[MIME_TYPE]["summary"][0]).startswith(f"warning: {warning}")
    assert f"<b>warning:</b> {warning}" in bundle["text/html"]
    whole = gpuviz.load(tmp_path / "run.arrow")._repr_mimebundle_()
    assert "warning" not in str(whole[MIME_TYPE]["summary"]) and "warning" not in whole["text/html"]
    from gpuviz.widgets.dashboard import Dashboard

    dashboard = Dashboard(cut)
    assert f"<b>warning:</b> {warning}" in dashboard.summary_html and "incomplete log" in dashboard.header
    assert "warning" not in Dashboard(gpuviz.load(tmp_path / "run.arrow")).summary_html
