"""Live capture from JAX: ``gpuviz.jax.record()`` and ``%%gpuviz --jax``, with JAX's CPU build.

On the CPU JAX's profile holds no allocator events; what JAX records is its device memory
profile (pprof, gzip-compressed), which ``record()`` takes when the block ends. These tests
check that difference as stated, on the files JAX wrote.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import gpuviz
from gpuviz.importers import xplane
from gpuviz.importers.source import Source

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("jax") is None, reason="JAX is not installed (pip install 'gpuviz[jax]')"
    ),
    # said by record() while gpuviz has no reader of JAX's memory profiles (the tests check the problem itself)
    pytest.mark.filterwarnings("ignore:gpuviz.jax. the recording holds no memory events:RuntimeWarning"),
]
READER = importlib.util.find_spec("gpuviz.importers.jax_memory_profile") is not None


def _jnp() -> Any:
    import jax

    if jax.default_backend() != "cpu":
        pytest.skip("these tests state what JAX records on the CPU; this JAX runs on " + jax.default_backend())
    import jax.numpy as jnp

    return jnp


@pytest.mark.slow
def test_cpu_recording_states_the_difference_and_keeps_the_memory_profile(tmp_path: Path) -> None:
    from gpuviz.jax import CPU_DIFFERENCE

    jnp = _jnp()
    with gpuviz.jax.record(logdir=tmp_path) as rec:
        x = jnp.ones((1000, 1000), dtype=jnp.float32)
        y = (x @ x).block_until_ready()
    assert rec.mode == "cpu"
    assert rec.problems[0] == CPU_DIFFERENCE and rec.log.meta["live"]["problems"][0] == CPU_DIFFERENCE
    assert rec.xplane is not None and rec.xplane.parent.parent.parent == tmp_path / "plugins"
    planes, records = xplane.decode_memory_records(Source(rec.xplane).mapped())
    assert len(records) == 0 and "/host:CPU" in [p.name for p in planes]  # JAX's own file: no memory events
    assert rec.memory_profile is not None and gzip.decompress(rec.memory_profile)  # pprof, gzip-compressed
    live = [e.size for e in rec.log.filter(kind="alloc")]
    if READER:
        assert live.count(4_000_000) >= 2  # x and y, alive when the block ended
    else:
        assert live == [] and "gpuviz.importers.jax_memory_profile is missing" in rec.problems[1]
    assert float(y[0, 0]) == 1000.0


@pytest.mark.slow
def test_the_log_is_built_when_the_block_raises() -> None:
    jnp = _jnp()
    with pytest.raises(ZeroDivisionError), gpuviz.jax.record() as rec:
        keep = jnp.zeros(256)
        1 / 0  # noqa: B018
    assert rec.log.meta["live"]["framework"] == "jax" and rec.memory_profile and keep.shape == (256,)


@pytest.mark.slow
def test_jax_cell_magic_shows_the_dashboard_and_says_what_the_cpu_records(tmp_path: Path) -> None:
    _jnp()
    ip = InteractiveShell.instance()
    if "GpuvizMagics" not in ip.magics_manager.registry:
        ip.run_line_magic("load_ext", "gpuviz")
    save = tmp_path / "jax.arrow"
    with capture_output() as captured:
        ip.run_cell_magic("gpuviz", f"--jax --save {save}", "import jax.numpy as jnp\nkept = jnp.ones(1000)")
    assert len(captured.outputs) == 1 and "%%gpuviz --jax (cpu)" in captured.outputs[0].data["text/html"]
    assert "%%gpuviz --jax: JAX on the CPU records no allocator events" in captured.stderr
    log = gpuviz.load(save)
    assert log.meta["live"]["framework"] == "jax"
    if READER:
        assert 4000 in [e.size for e in log.filter(kind="alloc")]
    ip.run_cell("%reset -f")


def test_a_recorder_that_cannot_start_is_a_usage_error_and_the_cell_does_not_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from contextlib import contextmanager

    from IPython.core.error import UsageError

    @contextmanager
    def busy(**options: Any) -> Any:
        raise RuntimeError("another profiler session is running")
        yield

    monkeypatch.setattr(gpuviz.jax, "record", busy)
    ip = InteractiveShell.instance()
    if "GpuvizMagics" not in ip.magics_manager.registry:
        ip.run_line_magic("load_ext", "gpuviz")
    with pytest.raises(UsageError, match="--jax: JAX's recording could not start: another profiler session"):
        ip.run_cell_magic("gpuviz", "--jax", "ran = True")
    assert "ran" not in ip.user_ns
