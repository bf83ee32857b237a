"""Live capture from PyTorch: ``gpuviz.torch.record()`` and ``%%gpuviz --torch``, with the CPU build of torch
(installed by .ci/run; without torch these tests are skipped, except in CI where they must run)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import gpuviz
from gpuviz import replay
from gpuviz.analysis.profile import profile

torch: Any = pytest.importorskip("torch") if not os.environ.get("CI") else __import__("torch")
PRE = "PREEXISTING"  # memory allocated before the recording began (freed or counted during it)
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path; CUDA machines record the GPU")


@cpu_only
def test_cpu_record_gives_exactly_the_tensors_allocated_and_freed() -> None:
    with gpuviz.torch.record() as rec:
        a = torch.empty(1000, dtype=torch.float32)
        b = torch.ones((100, 100), dtype=torch.float64)
        c = torch.zeros(3, dtype=torch.int16)
        del a, c
    assert rec.mode == "cpu" and rec.log.device_names == ["CPU:0"]
    allocs = [e for e in rec.log.filter(kind="alloc") if e.tag != PRE]
    assert [e.requested for e in allocs] == [4000, 80_000, 6]
    assert [e.requested for e in rec.log.filter(kind="free") if e.tag != PRE] == [4000, 6]
    assert [e.address for e in allocs][1] == b.data_ptr()
    final = replay(rec.log).state_at(-1)
    live = [(c.address, c.size) for s in final.segments for c in s.chunks if c.in_use and c.tag != PRE]
    assert live == [(b.data_ptr(), 80_000)]
    changes = [e.size if e.kind == "alloc" else -e.size for e in rec.log.filter(kind=["alloc", "free"])]
    assert profile(rec.log).devices["CPU:0"].peak.bytes == max(np.cumsum(changes))  # the views' analysis runs on it
    assert rec.log.meta["source"]["format"] == "pytorch-profiler" and rec.log.meta["source"]["torch"]


@cpu_only
def test_the_log_is_built_when_the_block_raises() -> None:
    with pytest.raises(ZeroDivisionError), gpuviz.torch.record() as rec:
        keep = torch.empty(256, dtype=torch.uint8)
        1 / 0  # noqa: B018
    assert [e.requested for e in rec.log.filter(kind="alloc") if e.tag != PRE] == [256] and keep.numel() == 256


@cpu_only
def test_cuda_required_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="PyTorch sees no CUDA device"), gpuviz.torch.record(cuda=True):
        pass
    with pytest.raises(ValueError, match="max_entries must be >= 1"), gpuviz.torch.record(max_entries=0):
        pass


@cpu_only
def test_torch_cell_magic_shows_and_saves_the_cells_pytorch_memory(tmp_path: Path) -> None:
    ip = InteractiveShell.instance()
    if "GpuvizMagics" not in ip.magics_manager.registry:
        ip.run_line_magic("load_ext", "gpuviz")
    ip.run_cell("import torch")
    save = tmp_path / "torch.arrow"
    with capture_output() as captured:
        ip.run_cell_magic("gpuviz", f"--torch --save {save}", "t = torch.empty((64, 64), dtype=torch.float32)")
    assert len(captured.outputs) == 1 and "CPU:0" in captured.outputs[0].data["text/html"]
    magics = ip.magics_manager.registry["GpuvizMagics"]
    assert [e.requested for e in magics.last.filter(kind="alloc") if e.tag != PRE] == [64 * 64 * 4]
    assert [e.size for e in gpuviz.load(save).filter(kind="alloc") if e.tag != PRE] == [64 * 64 * 4]
    ip.run_cell("%reset -f")


@pytest.mark.gpu
def test_cuda_record_imports_the_snapshot_with_exact_requests() -> None:
    with gpuviz.torch.record() as rec:
        x = torch.empty(1000, dtype=torch.float32, device="cuda")
        y = torch.empty((1024, 1024), dtype=torch.float16, device="cuda")
        del x
    assert rec.mode == "cuda" and "GPU:0" in rec.log.device_names
    allocs = [e for e in rec.log.filter(kind="alloc", device="GPU:0") if e.tag != "PREEXISTING"]
    assert [e.requested for e in allocs][-2:] == [4000, 2 << 20]
    assert y.data_ptr() in {e.address for e in allocs}
