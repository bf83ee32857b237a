"""Real third-party traces: optional test data, found through one setting.

The environment variable ``GPUVIZ_TEST_TRACES`` names the folder that holds them (CI sets it to
``../shared/data/traces``). Tests reach the real traces only through this module:

* unset: every test that needs them is skipped with one reason (``REASON``), and collection never
  fails, wherever the repository is cloned;
* set: a file a test expects that is not in the folder is a failure naming the file and the folder,
  never a skip and never a silently empty parametrization.

Usage::

    from traces import needs_traces, trace_path, trace_files

    def test_x() -> None:
        path = trace_path("pt_snapshot_ftcourse_2024.pickle")   # skip (unset) or fail (missing)

    @pytest.mark.parametrize("path", trace_files(EXPECTED, pattern="pt_snapshot_*.pickle"))
    def test_each(path: Path) -> None: ...
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import pytest

ENV = "GPUVIZ_TEST_TRACES"
REASON = "GPUVIZ_TEST_TRACES is not set: the real third-party traces (../shared/data/traces) are not available"
MISSING_MARK = "trace_missing"
"""The mark a parameter of ``trace_files`` carries when the folder does not hold what the test expects
(``pytest_runtest_setup`` below, a hook conftest.py imports, fails such a test before its fixtures
run, with the mark's message)."""


def _folder() -> Path | None:
    value = os.environ.get(ENV, "").strip()
    return Path(value).expanduser().resolve() if value else None


TRACES: Path | None = _folder()
"""The folder of real traces, or None where ``GPUVIZ_TEST_TRACES`` is not set."""

needs_traces = pytest.mark.skipif(TRACES is None, reason=REASON)
"""Skips a test (or, as ``pytestmark``, a module) where the real traces are not available."""


def _missing(name: str) -> str:
    return f"{name} is not in {TRACES} (the folder {ENV} names)"


def trace_path(name: str) -> Path:
    """The real trace ``name`` in the folder: skips the calling test where ``GPUVIZ_TEST_TRACES`` is
    unset, fails it where the variable is set but the file is not there."""
    if TRACES is None:
        pytest.skip(REASON)
    if not TRACES.is_dir():
        pytest.fail(f"{ENV}={TRACES} is not a folder")
    path = TRACES / name
    if not path.is_file():
        pytest.fail(_missing(name))
    return path


def optional_trace(name: str) -> Path | None:
    """The real trace ``name`` where the real traces are available (failing the test where the folder
    is set but lacks it), else None: for a test whose real-file part is one case among generated ones."""
    return None if TRACES is None else trace_path(name)


def trace_files(
    expected: Collection[str],
    *,
    pattern: str | None = None,
    exclude: Collection[str] = (),
    xfail: Mapping[str, str] | None = None,
) -> list[Any]:
    """``pytest.param`` s for a test over real traces: one per name in ``expected`` (sorted, id = the
    file name, value = its path).

    Where ``GPUVIZ_TEST_TRACES`` is set, an expected file that is not in the folder becomes a
    parameter that fails, naming the file and the folder; with ``pattern`` (a glob), the expected
    list must also be complete: a file of the folder that matches it (less ``exclude``) and is not
    expected becomes a failing parameter too. Where it is unset, the list is one parameter, skipped
    with ``REASON`` (a test is never silently left uncollected).
    """
    if not expected:
        raise ValueError("trace_files needs the list of files the test expects")
    if TRACES is None:
        return [pytest.param(None, id="no-traces", marks=pytest.mark.skip(reason=REASON))]
    folder = TRACES
    is_dir = folder.is_dir()
    present = {p.name for p in folder.iterdir() if p.is_file()} if is_dir else set()
    unexpected = {n for n in present if fnmatch.fnmatch(n, pattern)} - set(exclude) if pattern else set()
    wanted = set(expected)
    params: list[Any] = []
    for name in sorted(wanted | unexpected):
        marks: list[Any] = []
        if not is_dir:
            marks = [getattr(pytest.mark, MISSING_MARK)(f"{ENV}={folder} is not a folder")]
        elif name not in present:
            marks = [getattr(pytest.mark, MISSING_MARK)(_missing(name))]
        elif name not in wanted:
            message = f"{name} in {folder} matches {pattern!r} but is not in the test's list of expected files: add it"
            marks = [getattr(pytest.mark, MISSING_MARK)(message)]
        elif xfail and name in xfail:
            marks = [pytest.mark.xfail(reason=xfail[name], strict=True)]
        params.append(pytest.param(folder / name, id=name, marks=marks))
    return params


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MISSING_MARK}(message): a real trace the test expects is not there (fails)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A parameter of ``trace_files`` whose file is missing (or not expected) fails, before any
    fixture opens it."""
    mark = item.get_closest_marker(MISSING_MARK)
    if mark is not None:
        pytest.fail(mark.args[0], pytrace=False)
