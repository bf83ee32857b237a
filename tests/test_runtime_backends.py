"""The runtime's backend seam: the CuPy backend's driver-free parts here, the rest on a GPU."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip(
    "cupy", reason="CuPy is not installed (it is not in the test extra: pip install -e .[test,cuda12] or [cuda13])"
)

import gpuviz  # noqa: E402
from gpuviz import EventLog, SimUpstream, config  # noqa: E402
from gpuviz.capture import ReferenceBFCAllocator  # noqa: E402
from gpuviz.runtime.backends import CupyBackend, cupy_gpu_count  # noqa: E402
from gpuviz.runtime.context import get_runtime  # noqa: E402

BASE = 1 << 40


@pytest.fixture
def backend() -> CupyBackend:
    return CupyBackend(0, ReferenceBFCAllocator(SimUpstream("1GiB")))


def test_views_over_device_addresses_and_view_detection(backend: CupyBackend) -> None:
    owner = object()
    view = backend.view(BASE + 512, 4 * 12, (3, 4), np.dtype(np.float32), owner)
    assert isinstance(view, cupy.ndarray) and view.shape == (3, 4) and view.data.ptr == BASE + 512
    assert view.data.mem._owner is owner
    part = view[1:]
    assert backend.offset(part, BASE + 512) == 16
    assert backend.shares_memory(part, view) and backend.shares_memory(view.reshape(12), view)
    other = backend.view(BASE + 4096, 48, (3, 4), np.dtype(np.float32), owner)
    assert not backend.shares_memory(other, view)
    assert backend.is_array(view) and not backend.is_array(np.ones(3))


def test_numpy_functions_translate_to_cupy(backend: CupyBackend) -> None:
    assert backend._translate(np.add) is cupy.add
    assert backend._translate(np.add.__call__) is cupy.add
    assert backend._translate(np.add.reduce) == cupy.add.reduce
    assert backend._translate(np.matmul) is cupy.matmul
    assert backend._translate(np.concatenate) is cupy.concatenate
    own = lambda a: a.copy()  # noqa: E731 - the runtime's own small ops pass through
    assert backend._translate(own) is own
    with pytest.raises(TypeError, match="has no CuPy equivalent"):
        backend._translate(np.lib.stride_tricks.sliding_window_view)


def test_backend_configuration(runtime_log: EventLog) -> None:
    if cupy_gpu_count():
        pytest.skip("a GPU is present")
    assert config.get_backend() == "simulated"
    with pytest.raises(RuntimeError, match="needs CuPy and an NVIDIA GPU"):
        config.set_backend("cupy")
    with pytest.raises(ValueError, match="backend must be one of"):
        config.set_backend("tpu")
    config.set_backend("simulated")
    assert type(get_runtime().devices["GPU:0"].backend).__name__ == "SimulatedBackend"


@pytest.mark.gpu
def test_runtime_on_a_real_gpu(runtime_log: EventLog) -> None:
    assert config.get_backend() == "cupy"
    assert len(config.list_physical_devices("GPU")) == cupy.cuda.runtime.getDeviceCount()
    for gpu in config.list_physical_devices("GPU"):  # growth cannot differ between GPUs
        config.set_memory_growth(gpu, True)
    a = gpuviz.asarray([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = gpuviz.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    c = a @ b
    assert isinstance(c._data, cupy.ndarray)
    np.testing.assert_array_equal(c.numpy(), [[22, 28], [49, 64]])
    np.testing.assert_allclose(np.exp(c).sum(axis=0).numpy(), np.exp([[22, 28], [49, 64]]).sum(axis=0))
    kinds = [e.kind for e in runtime_log]
    assert "transfer" in kinds and "placement" in kinds
    gpu = get_runtime().devices["GPU:0"]
    assert gpu.upstream.reserved > 0
    gpuviz.reset()
    assert gpu.upstream.reserved == 0
