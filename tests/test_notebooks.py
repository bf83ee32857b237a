"""Every tutorial notebook runs from top to bottom on a real kernel (nbclient)."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from traces import TRACES, needs_traces

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
pytestmark = pytest.mark.slow  # a kernel per notebook, seconds each
ON_REAL_TRACES = {"08-what-if"}
"""Notebooks that open a real third-party trace (from the folder GPUVIZ_TRACES names: the tests pass
GPUVIZ_TEST_TRACES's)."""


def test_there_are_notebooks() -> None:
    assert len(NOTEBOOKS) >= 6


@pytest.mark.parametrize(
    "path", [pytest.param(p, id=p.stem, marks=[needs_traces] if p.stem in ON_REAL_TRACES else []) for p in NOTEBOOKS]
)
def test_notebook_runs(path: Path, tmp_path: Path) -> None:
    book = nbformat.read(path, as_version=4)
    client = NotebookClient(book, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    env = os.environ.copy()
    if TRACES is not None:
        env["GPUVIZ_TRACES"] = str(TRACES)
    client.execute(env=env)
    errors = [o for cell in book.cells if cell.cell_type == "code" for o in cell.outputs if o.output_type == "error"]
    assert errors == []
    assert any(cell.outputs for cell in book.cells if cell.cell_type == "code")
