"""DeviceArrays: NumPy code, placement, soft placement, transfers, release."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import gpuviz
from gpuviz import EventLog, config
from gpuviz.base.tags import parse_array_tag
from gpuviz.log.schema import Direction
from gpuviz.runtime.context import get_runtime

A = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
B = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]


def transfers(log: EventLog) -> list[tuple[int, str, str, int]]:
    return [(e.flags, e.device, e.peer, e.size) for e in log.filter(kind="transfer")]


def placements(log: EventLog) -> list[tuple[str, str, str | None, int]]:
    return [(e.tag, e.device, e.peer, e.flags) for e in log.filter(kind="placement")]


def test_tf_guide_matmul(runtime_log: EventLog, capsys: pytest.CaptureFixture[str]) -> None:
    config.set_log_device_placement(True)
    a = gpuviz.asarray(A)
    b = gpuviz.asarray(B)
    c = a @ b
    assert c.device == "GPU:0"
    np.testing.assert_array_equal(c.numpy(), [[22, 28], [49, 64]])
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "Executing op Const in device /job:localhost/replica:0/task:0/device:GPU:0",
        "Executing op Const in device /job:localhost/replica:0/task:0/device:GPU:0",
        "Executing op MatMul in device /job:localhost/replica:0/task:0/device:GPU:0",
    ]
    # two H2D copies of 48 bytes (the constants) and one D2H of 32 bytes (numpy())
    assert transfers(runtime_log) == [
        (Direction.H2D, "CPU:0", "GPU:0", 48),
        (Direction.H2D, "CPU:0", "GPU:0", 48),
        (Direction.D2H, "GPU:0", "CPU:0", 32),
    ]


def test_tf_guide_constants_on_cpu_matmul_on_gpu(runtime_log: EventLog) -> None:
    with gpuviz.device("/CPU:0"):
        a = gpuviz.asarray(A)
        b = gpuviz.asarray(B)
    assert (a.device, b.device) == ("CPU:0", "CPU:0")
    assert transfers(runtime_log) == []
    c = a @ b
    assert c.device == "GPU:0"
    assert transfers(runtime_log) == [(Direction.H2D, "CPU:0", "GPU:0", 48), (Direction.H2D, "CPU:0", "GPU:0", 48)]
    np.testing.assert_array_equal(c.numpy(), [[22, 28], [49, 64]])


def test_tf_guide_replication_over_two_logical_gpus(runtime_log: EventLog) -> None:
    config.set_logical_device_configuration("GPU:0", [1024, 1024])
    products = []
    for gpu in config.list_logical_devices("GPU"):
        with gpuviz.device(gpu.name):
            a = gpuviz.asarray(A)
            b = gpuviz.asarray(B)
            products.append(a @ b)
    assert [p.device for p in products] == ["GPU:0", "GPU:1"]
    with gpuviz.device("/CPU:0"):
        total = sum(products)
    assert total.device == "CPU:0"
    np.testing.assert_array_equal(total.numpy(), [[44, 56], [98, 128]])
    d2h = [t for t in transfers(runtime_log) if t[0] == Direction.D2H]
    assert d2h == [(Direction.D2H, "GPU:0", "CPU:0", 32), (Direction.D2H, "GPU:1", "CPU:0", 32)]


def test_numpy_code_gives_numpys_results(runtime_log: EventLog) -> None:
    rng = np.random.default_rng(0)
    x_host = rng.standard_normal((8, 5))
    y_host = rng.standard_normal((5, 3))
    x, y = gpuviz.asarray(x_host), gpuviz.asarray(y_host)
    checks = [
        (x @ y, x_host @ y_host),
        (x + 1, x_host + 1),
        (2 * x - x / 3, 2 * x_host - x_host / 3),
        (np.exp(x), np.exp(x_host)),
        (np.maximum(x, 0), np.maximum(x_host, 0)),
        (x.sum(axis=0), x_host.sum(axis=0)),
        (np.mean(x), np.mean(x_host)),
        (x.reshape(5, 8), x_host.reshape(5, 8)),
        (x.T, x_host.T),
        (x[2:5, ::2], x_host[2:5, ::2]),
        (np.concatenate([x, x]), np.concatenate([x_host, x_host])),
        (x.astype(np.float32), x_host.astype(np.float32)),
        (x > 0, x_host > 0),
        (np.dot(x, y), np.dot(x_host, y_host)),
        (x.max(), x_host.max()),
    ]
    for got, expected in checks:
        assert isinstance(got, gpuviz.DeviceArray) and got.device == "GPU:0"
        np.testing.assert_allclose(got.numpy(), expected)
    assert np.asarray(x).shape == (8, 5)
    assert float(np.sum(x)) == pytest.approx(float(np.sum(x_host)))
    x[0, 0] = 42.0
    assert x.numpy()[0, 0] == 42.0


def test_operators_with_arrays_scalars_and_host_arrays(runtime_log: EventLog) -> None:
    """Python operators run the op directly for DeviceArray and scalar operands (reflected ones
    too) and through NumPy's dispatch for anything else: the same values, op names and tags."""
    x_host = np.arange(1.0, 7.0).reshape(2, 3)
    x = gpuviz.asarray(x_host)
    start = len(placements(runtime_log))
    checks = [
        (x + x, x_host + x_host), (2 - x, 2 - x_host), (x * 3, x_host * 3), (1 / x, 1 / x_host),
        (x // 2, x_host // 2), (7 % x, 7 % x_host), (x**2, x_host**2), (2**x, 2**x_host),
        (x @ x.T, x_host @ x_host.T), (x + x_host, x_host + x_host), (x_host - x, x_host - x_host),
        (x - [1.0, 2.0, 3.0], x_host - [1.0, 2.0, 3.0]),
    ]  # fmt: skip
    for got, expected in checks:
        assert isinstance(got, gpuviz.DeviceArray) and got.device == "GPU:0"
        np.testing.assert_allclose(got.numpy(), expected)
    ops = [tag for tag, *_ in placements(runtime_log)[start:] if tag not in ("Transpose", "Const")]
    assert ops == ["AddV2", "Sub", "Mul", "Divide", "FloorDiv", "Remainder", "Pow", "Pow", "MatMul", "AddV2",
                   "Sub", "Sub"]  # fmt: skip
    assert runtime_log.filter(kind="alloc")[-1].tag == "Sub:float64[2,3]"
    x.release()
    with pytest.raises(RuntimeError, match="was released"):
        x + 1


def test_views_share_memory_and_outputs_get_new_memory(runtime_log: EventLog) -> None:
    x = gpuviz.asarray(np.arange(12.0))
    allocs = len(runtime_log.filter(kind="alloc"))
    v = x.reshape(3, 4)
    s = x[2:6]
    assert len(runtime_log.filter(kind="alloc")) == allocs  # views: no allocation
    assert s.address == x.address + 16
    y = x + 1
    assert len(runtime_log.filter(kind="alloc")) == allocs + 1
    assert y.address != x.address
    tag = parse_array_tag(runtime_log.filter(kind="alloc")[-1].tag)
    assert tag == ("AddV2", "float64", (12,))
    del v, s


def test_dtype_and_shape_are_recorded_as_tags(runtime_log: EventLog) -> None:
    gpuviz.asarray(np.zeros((3, 4), dtype=np.float32))
    (event,) = runtime_log.filter(kind="alloc", device="GPU:0")
    assert event.tag == "Const:float32[3,4]"
    assert event.requested == 48


def test_arrays_are_freed_when_collected_and_on_release(runtime_log: EventLog) -> None:
    gpu = get_runtime().devices["GPU:0"].allocator
    x = gpuviz.asarray(np.ones(1000))
    assert gpu.stats().bytes_in_use == 8192
    del x
    gc.collect()
    assert gpu.stats().bytes_in_use == 0
    y = gpuviz.asarray(np.ones(1000))
    view = y[10:20]
    y.release()
    assert gpu.stats().bytes_in_use == 0
    with pytest.raises(RuntimeError, match="was released"):
        view.numpy()


def test_soft_placement(runtime_log: EventLog) -> None:
    with gpuviz.device("/device:GPU:2"):
        x = gpuviz.asarray([1.0, 2.0])
    assert x.device == "GPU:0"
    assert placements(runtime_log)[-1] == ("Const", "GPU:0", "GPU:2", 1)
    # an op with no GPU kernel (strings) falls back to the CPU
    with gpuviz.device("GPU:0"):
        s = gpuviz.asarray(np.array(["a", "b"]))
    assert s.device == "CPU:0"
    assert placements(runtime_log)[-1] == ("Const", "CPU:0", "GPU:0", 1)


def test_strict_placement_raises_for_unknown_devices(runtime_log: EventLog) -> None:
    config.set_soft_device_placement(False)
    x = gpuviz.asarray([1.0])
    before = len(runtime_log)
    unknown = r"/job:localhost/replica:0/task:0/device:GPU:2 unknown device"
    with pytest.raises(RuntimeError, match=unknown), gpuviz.device("/GPU:2"):
        x + 1
    with pytest.raises(RuntimeError, match="no GPU kernel for op Const"), gpuviz.device("GPU:0"):
        gpuviz.asarray(np.array(["a"]))
    assert len(runtime_log.filter(kind="placement")) == len(runtime_log[:before].filter(kind="placement"))
    with pytest.raises(ValueError, match="unknown device type 'XPU'"), gpuviz.device("XPU:0"):
        pass


def test_automatic_copies_between_devices(runtime_log: EventLog) -> None:
    config.set_logical_device_configuration("GPU:0", ["64MiB", "64MiB"])
    with gpuviz.device("GPU:1"):
        x = gpuviz.asarray(np.ones(100, dtype=np.float32))
    with gpuviz.device("GPU:0"):
        y = x * 2  # D2D copy GPU:1 -> GPU:0
    assert y.device == "GPU:0"
    assert transfers(runtime_log)[-1] == (Direction.D2D, "GPU:1", "GPU:0", 400)
    with gpuviz.device("CPU:0"):
        z = y + 1  # D2H
    assert transfers(runtime_log)[-1] == (Direction.D2H, "GPU:0", "CPU:0", 400)
    np.testing.assert_array_equal(z.numpy(), np.full(100, 3.0, dtype=np.float32))


def test_transfer_durations_follow_the_model(runtime_log: EventLog) -> None:
    config.set_transfer_model(h2d_bytes_per_s=1e9, latency_ns=1000)
    gpuviz.asarray(np.zeros(1_000_000, dtype=np.uint8))
    (event,) = runtime_log.filter(kind="transfer")
    assert event.duration_ns == 1000 + 1_000_000  # 1 MB at 1 GB/s = 1 ms
    assert runtime_log.meta["transfer_model"]["h2d_bytes_per_s"] == 1e9


def test_reset_returns_every_byte_upstream(runtime_log: EventLog) -> None:
    config.set_simulated_gpus(2, "1GiB")
    x = gpuviz.asarray(np.ones(1000))
    with gpuviz.device("GPU:1"):
        y = gpuviz.asarray(np.ones(1000))
    runtime = get_runtime()
    assert all(d.upstream.reserved > 0 for d in runtime.gpus)
    gpuviz.reset()
    assert [d.upstream.reserved for d in runtime.devices.values()] == [0, 0, 0]
    for d in runtime.devices.values():
        s = d.allocator.stats()
        assert (s.bytes_in_use, s.pool_bytes) == (0, 0)
        d.allocator.check()
    assert len(runtime_log.filter(kind="segment_free")) == 2  # one per GPU; the CPU allocated nothing
    with pytest.raises(RuntimeError, match=r"released by gpuviz\.reset"):
        x + y
    # the runtime keeps working after a reset
    assert (gpuviz.asarray([1.0, 2.0]) * 2).tolist() == [2.0, 4.0]


def test_session_records_one_run_into_its_own_log(runtime_log: EventLog) -> None:
    gpuviz.asarray([1.0])
    with gpuviz.Session() as session:
        gpuviz.mark("inside")
        gpuviz.asarray([1.0, 2.0]) + 1
    kinds = [e.kind for e in session.log]
    assert kinds[0] == "mark" and "placement" in kinds and kinds[-1] == "segment_free"
    replayed = gpuviz.replay(session.log)
    for device in replayed.devices:
        assert replayed.state_at(-1, device=device).segments == ()
    assert gpuviz.default_log() is runtime_log


def test_record_into_keeps_arrays_and_replays_exactly(runtime_log: EventLog) -> None:
    x = gpuviz.asarray(np.arange(100.0))
    fresh = EventLog()
    gpuviz.record_into(fresh)
    y = x * 2  # x is still usable
    assert gpuviz.default_log() is fresh
    heap = gpuviz.replay(fresh)
    for name, dev in get_runtime().devices.items():
        if name in heap.devices:
            assert heap.state_at(-1, device=name) == dev.allocator.state()
    assert [e.kind for e in fresh.filter(kind="placement")] == ["placement"]
    np.testing.assert_array_equal(y.numpy(), np.arange(100.0) * 2)


def test_reconfigure_memory_limit_and_stacks(runtime_log: EventLog) -> None:
    gpuviz.asarray([1.0])
    with pytest.raises(RuntimeError):
        config.set_memory_limit("GPU:0", "64MiB")
    gpuviz.reconfigure()
    config.set_memory_growth("GPU:0", True)
    config.set_memory_limit("GPU:0", "64MiB")
    config.set_record_stacks(True)
    x = gpuviz.asarray(np.ones(10))
    gpu = get_runtime().devices["GPU:0"].allocator
    assert (gpu.memory_limit, gpu.growth) == (64 * 1024 * 1024, True)
    event = runtime_log.filter(kind="alloc", device="GPU:0")[-1]
    frames = runtime_log.stacks[event.stack]
    assert frames[0].function == "test_reconfigure_memory_limit_and_stacks"
    with pytest.raises(ValueError, match="memory limit must be between"):
        gpuviz.reconfigure()
        config.set_memory_limit("GPU:0", "64GiB")
    del x
