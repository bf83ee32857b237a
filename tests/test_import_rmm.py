"""RMM logging_resource_adaptor CSV. No real log was found in public repositories: the fixture is
written from RMM's source (logging_resource_adaptor_impl.cpp's spdlog pattern ``%t,%H:%M:%S.%f,%v``)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

import gpuviz
from gpuviz import LogFormatError, replay
from gpuviz.importers import detect

FIXTURES = Path(__file__).parent / "fixtures"
LOG = FIXTURES / "rmm_log.dev1.csv"
T0 = 86_399_990_000_000  # 23:59:59.990000 in ns since midnight
DAY = 86_400 * 10**9
A, B, C = 0x7F2C4A000000, 0x7F2C4A100000, 0x7F2C00000000
T1, T2 = 140210341947200, 140210341947201


def test_rows_become_allocs_frees_and_an_oom_with_times_across_midnight() -> None:
    assert detect(LOG) == "rmm-csv"
    log = gpuviz.load(LOG)
    assert log.device_names == ["GPU:1"] and log.devices[0].options == {"allocator": "rmm"}
    rows = [(e.kind, e.time_ns, e.address, e.size, e.requested, e.tag, e.thread)
            for e in log.filter(kind=["alloc", "free", "oom"])]  # fmt: skip
    assert rows == [
        ("alloc", T0, C, 4096, 4096, "PREEXISTING", 0),  # freed in the log, never allocated in it
        ("alloc", T0, A, 1 << 20, 1 << 20, None, T1),
        ("alloc", T0 + 100_000, B, 512, 512, None, T1),
        ("free", T0 + 5_000_000, C, 4096, 4096, "PREEXISTING", T2),
        ("free", DAY + 250_000, A, 1 << 20, 1 << 20, None, T1),  # past midnight
        ("alloc", DAY + 250_000, A, 256, 256, None, T2),  # logged at .000200, after .000250: keeps the order
        ("oom", DAY + 300_000, 0, 68_719_476_736, 68_719_476_736, None, T1),
        ("free", DAY + 1_500_000_000, B, 512, 512, None, T1),
        ("free", DAY + 2_000_000_000, A, 256, 256, None, T2),
    ]
    segments = [(e.address, e.size) for e in log.filter(kind="segment_alloc")]
    assert segments == [(C, 4096), (A, (1 << 20) + 512)]  # the ranges ever used; A and B touch
    final = replay(log).state_at(-1)
    assert [(s.base, s.size, [c.in_use for c in s.chunks]) for s in final.segments] == [
        (C, 4096, [False]),
        (A, (1 << 20) + 512, [False]),
    ]
    notes = " ".join(log.meta["notes"])
    assert "passes midnight 1 time" in notes and "1 rows are earlier" in notes


def test_without_a_device_in_the_name_it_is_gpu0_and_gzip_works(tmp_path: Path) -> None:
    path = tmp_path / "rmm.csv.gz"
    path.write_bytes(gzip.compress(LOG.read_bytes()))
    log = gpuviz.load(path)
    assert log.device_names == ["GPU:0"] and len(log) == len(gpuviz.load(LOG))
    old_style = tmp_path / "log.csv.dev3"
    old_style.write_bytes(LOG.read_bytes())
    assert gpuviz.load(old_style).device_names == ["GPU:3"]


def test_legacy_csv_is_rejected_clearly() -> None:
    with pytest.raises(LogFormatError, match=r"legacy RMM \(<= 0.13\) CSV"):
        gpuviz.load(FIXTURES / "rmm_legacy_0.13.csv")


def test_bad_rows_name_the_row_and_a_cut_last_row_is_a_truncated_prefix(tmp_path: Path) -> None:
    data = LOG.read_text()
    cases = {
        "action.csv": (data.replace("allocate failure", "reallocate"), "row 7: action 'reallocate'"),
        "time.csv": (data.replace("23:59:59.990100", "yesterday"), "row 3: time 'yesterday'"),
        "pointer.csv": (data.replace("0x7f2c4a100000,512", "nowhere,512", 1), "row 3: pointer 'nowhere'"),
        "fields.csv": (data.replace(",1048576,0\n", ",1048576\n", 1), "row 2 has 5 fields"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_text(content)
        with pytest.raises(LogFormatError, match=message):
            gpuviz.load(path)
    cut = tmp_path / "cut.csv"
    cut.write_text(data[: data.rindex(",256,0x1")])  # inside the last row
    log = gpuviz.load(cut)
    assert log.truncated and len(log.filter(kind=["alloc", "free", "oom"])) == 8
    packed = gzip.compress(data.encode())
    cut_gz = tmp_path / "cut.csv.gz"
    cut_gz.write_bytes(packed[:-30])
    assert gpuviz.load(cut_gz).truncated
