from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from browsing import browser  # noqa: F401 (one headless Chromium per test module: the fixture `browser`)
from traces import pytest_configure, pytest_runtest_setup  # noqa: F401 (the real traces' hooks)

from gpuviz import SimUpstream
from gpuviz.capture import ReferenceBFCAllocator


@pytest.fixture(autouse=True)
def _real_main_module() -> Iterator[None]:
    """IPython's InteractiveShell (the magic tests) puts its own ``__main__`` module in
    ``sys.modules``, without the ``__spec__`` multiprocessing needs to start a worker (Dask's
    LocalCluster, the process pool): put the real one back after each test."""
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main


def snapshot(alloc: ReferenceBFCAllocator) -> tuple[object, object, int]:
    """Everything a bad call must leave unchanged: heap state, stats, log length."""
    return alloc.state(), alloc.stats(), len(alloc.log)


def _allocator_classes() -> list[object]:
    from gpuviz.capture.native import NativeBFCAllocator, native_core_available

    built = pytest.mark.skipif(not native_core_available(), reason="the native core is not built (no C compiler)")
    return [
        pytest.param(ReferenceBFCAllocator, id="python"),
        pytest.param(NativeBFCAllocator, id="native", marks=built),
    ]


ALLOCATOR_CLASSES = _allocator_classes()
"""The BFC allocator classes every allocator test runs against: the Python reference
(``ReferenceBFCAllocator``) and the native core (``NativeBFCAllocator``, ``gpuviz.BFCAllocator`` where built)."""


@pytest.fixture(params=ALLOCATOR_CLASSES)
def bfc(request: pytest.FixtureRequest) -> type[ReferenceBFCAllocator]:
    """The allocator class under test (``bfc(SimUpstream(...), ...)`` makes one)."""
    cls: type[ReferenceBFCAllocator] = request.param
    return cls


def _built_classes() -> dict[str, Callable[..., ReferenceBFCAllocator]]:
    from gpuviz.capture.native import NativeBFCAllocator, native_core_available

    built: dict[str, Callable[..., ReferenceBFCAllocator]] = {"python": ReferenceBFCAllocator}
    if native_core_available():
        built["native"] = NativeBFCAllocator
    return built


ALLOCATOR_FACTORIES = _built_classes()
"""The allocator classes built here, by name (the native core where a C compiler built it)."""


@pytest.fixture
def make_allocator(bfc: type[ReferenceBFCAllocator]) -> Callable[..., ReferenceBFCAllocator]:
    """The allocator class under test as a factory (one per class of ``ALLOCATOR_CLASSES``)."""
    return bfc


@pytest.fixture
def alloc(bfc: type[ReferenceBFCAllocator]) -> ReferenceBFCAllocator:
    a = bfc(SimUpstream("1GiB"), growth=True)
    a.allocate(1000, tag="x")
    a.allocate(3000)
    return a


@pytest.fixture
def runtime_log():  # type: ignore[no-untyped-def]
    """A fresh, unconfigured runtime recording into a new log; everything released after."""
    import gpuviz
    from gpuviz.capture.marks import default_log, set_default_log

    gpuviz.reset(configuration=True)
    previous = default_log()
    log = gpuviz.EventLog()
    set_default_log(log)
    yield log
    gpuviz.reset(configuration=True)
    set_default_log(previous)


def _gpu_present() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.is_available())
    except Exception:
        return False


SLOW_FIXTURES = frozenset({"browser", "chromium", "lab_server"})
"""Fixtures that start Chromium or a JupyterLab server: a test using one is ``slow`` (seconds each)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that start Chromium or JupyterLab are marked ``slow`` (``pytest -m "not slow"`` leaves
    them out); ``gpu``-marked tests need a real NVIDIA GPU with CuPy: without one they are skipped."""
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    if _gpu_present():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CuPy (none present)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def lab_server(
    request: pytest.FixtureRequest, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, Path]]:
    """A real JupyterLab server over ``tmp_path``: (base URL, token, root folder).

    Indirect parameters (optional): ``{"args": [more server options], "env": {more environment}}``.
    """
    port, token = _free_port(), "gpuviz-test-token"
    extra = getattr(request, "param", {})
    workspaces = tmp_path_factory.mktemp("workspaces")  # no tabs restored from other tests
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1", "--allow-root",
         f"--ServerApp.root_dir={tmp_path}", f"--IdentityProvider.token={token}", "--ServerApp.disable_check_xsrf=True",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         f"--LabApp.workspaces_dir={workspaces}", *extra.get("args", [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **extra.get("env", {})},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    json.load(r)
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError("jupyter lab did not start")
        yield base, token, tmp_path
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:  # shutting kernels down can outlast 30 s on a loaded machine
            server.kill()
            server.wait(timeout=30)
