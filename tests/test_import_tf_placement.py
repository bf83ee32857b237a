"""TensorFlow placement logs: real Colab outputs (text and notebook, GPUVIZ_TEST_TRACES) and every line
form TF writes."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from traces import trace_path

import gpuviz
from gpuviz import LogFormatError
from gpuviz.analysis.tables import placement_table
from gpuviz.importers import detect
from gpuviz.importers.tf_placement import device_name, sniff

RUNS = ["tf_placement_colab_gpu_guide", "tf_placement_colab_xla_gpu_seq2seq"]


def _expected(text: str) -> Counter[tuple[str, str]]:
    """(op, short device) of every eager line, by a simple regex of its own."""
    found = re.findall(r"Executing op (\w+) in device \S*device:(\w+:\d+)", text)
    return Counter((op, device) for op, device in found)


@pytest.mark.parametrize("run", RUNS)
def test_real_colab_runs_give_one_placement_per_executed_op(run: str) -> None:
    text = (trace_path(f"{run}.outputs.txt")).read_text()
    expected = _expected(text)
    for path in (trace_path(f"{run}.outputs.txt"), trace_path(f"{run}.ipynb")):
        assert detect(path) == "tf-placement"
        log = gpuviz.load(path)
        assert Counter((e.tag, e.device) for e in log) == expected
        assert {e.kind for e in log} == {"placement"} and {e.peer for e in log} == {None}
        assert log["time_ns"].tolist() == [1000 * i for i in range(len(log))]
        ops_in_order = re.findall(r"Executing op (\w+) in device", text)
        assert [e.tag for e in log] == ops_in_order
    counts = {"tf_placement_colab_gpu_guide": 72, "tf_placement_colab_xla_gpu_seq2seq": 108}
    assert sum(expected.values()) == counts[run]


def test_placement_table_of_a_real_run() -> None:
    log = gpuviz.load(trace_path("tf_placement_colab_gpu_guide.ipynb"))
    assert log.device_names == ["GPU:0", "CPU:0"]
    table = placement_table(log)
    columns = zip(table["op"], table["device"], table["count"], strict=True)
    counts = {(str(op), str(device)): int(n) for op, device, n in columns}
    text = (trace_path("tf_placement_colab_gpu_guide.outputs.txt")).read_text()
    assert counts == dict(_expected(text))


L = "/job:localhost/replica:0/task:0/device:"
GLOG = "2021-10-01 12:00:00.123456: I tensorflow/core/common_runtime/"
LINES = f"""\
{GLOG}eager/execute.cc:1161] Executing op MatMul in device {L}GPU:0
I0000 00:00:1700000000.123456   4242 execute.cc:1234] Executing op AddV2 in device {L}CPU:0
Executing op Relu in device /device:GPU:1
dense/MatMul: (MatMul): {L}GPU:0
{GLOG}placer.cc:114] dense/MatMul: (MatMul): {L}GPU:0
dense/BiasAdd: (BiasAdd){L}XLA_GPU:0
init/Const: (Const): /gpu:0
remote/Add: (Add): /job:worker/replica:0/task:1/device:GPU:0
Executing op Mul in device somewhere else
not a placement: (Op): nowhere
"""


def test_every_line_form_with_and_without_prefixes(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_text(LINES)
    log = gpuviz.load(path)
    assert [(e.tag, e.device) for e in log] == [
        ("MatMul", "GPU:0"),
        ("AddV2", "CPU:0"),
        ("Relu", "GPU:1"),
        ("MatMul", "GPU:0"),  # the placer's stdout line; its LOG(INFO) twin is counted once
        ("BiasAdd", "XLA_GPU:0"),
        ("Const", "GPU:0"),
        ("Add", "/job:worker/replica:0/task:1/device:GPU:0"),
    ]
    assert log.device_names == ["GPU:0", "GPU:1", "/job:worker/replica:0/task:1/device:GPU:0", "XLA_GPU:0", "CPU:0"]
    assert any("counted once" in note for note in log.meta["notes"])
    assert log.meta["columns"]["time_ns"] == "inferred" and log.meta["columns"]["peer"] == "absent"
    assert log["time_ns"].tolist() == [0, 1000, 2000, 3000, 4000, 5000, 6000]  # not every line has a time


def test_times_from_glog_and_absl_prefixes_when_every_line_has_one(tmp_path: Path) -> None:
    path = tmp_path / "timed.log"
    path.write_text(
        f"{GLOG}eager/execute.cc:1161] Executing op MatMul in device {L}GPU:0\n"
        "2021-10-01 12:00:00.5: I tensorflow/core/common_runtime/eager/execute.cc:1161] Executing op Add in device"
        f" {L}GPU:0\n"
        f"I0000 00:00:1633089600.000001   42 execute.cc:1234] Executing op Mul in device {L}CPU:0\n"
    )
    log = gpuviz.load(path)
    noon = 1_633_089_600 * 10**9  # 2021-10-01 12:00:00 UTC
    assert log["time_ns"].tolist() == [noon + 123_456_000, noon + 500_000_000, noon + 500_000_000]  # never backwards
    assert log.meta["columns"]["time_ns"] == "exact"


def test_device_names() -> None:
    assert device_name("/job:localhost/replica:0/task:0/device:XLA_GPU:0") == "XLA_GPU:0"
    assert device_name("/cpu:0") == "CPU:0"
    with pytest.raises(LogFormatError, match="not a TensorFlow device name"):
        device_name("GPU")


def test_sniffing_is_strict() -> None:
    assert not sniff(b"Executing op MatMul on the GPU\nhello\n")
    assert not sniff(b"a: (b): c\n")
    assert not sniff(json.dumps({"cells": [{"outputs": [{"text": "Executing op"}]}]}).encode())
    notebook = {"cells": [{"outputs": [{"text": ["Executing op MatMul in device /device:GPU:0\n"]}]}]}
    assert sniff(json.dumps(notebook, indent=1).encode())


def test_a_broken_notebook_is_a_clear_error(tmp_path: Path) -> None:
    data = (trace_path("tf_placement_colab_gpu_guide.ipynb")).read_bytes()
    path = tmp_path / "cut.ipynb"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(LogFormatError, match="looks like a notebook but is not valid JSON"):
        gpuviz.load(path)
