from __future__ import annotations

import pytest

from gpuviz import BFCAllocator, SimUpstream


def snapshot(alloc: BFCAllocator) -> tuple[object, object, int]:
    """Everything a bad call must leave unchanged: heap state, stats, log length."""
    return alloc.state(), alloc.stats(), len(alloc.log)


@pytest.fixture
def alloc() -> BFCAllocator:
    a = BFCAllocator(SimUpstream("1GiB"), growth=True)
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``gpu``-marked tests need a real NVIDIA GPU with CuPy; without one they are skipped."""
    if _gpu_present():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CuPy (none present)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
