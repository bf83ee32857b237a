"""Device strings in TensorFlow's syntax."""

from __future__ import annotations

import pytest

from gpuviz import DeviceSpec, parse_device


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("/job:localhost/replica:0/task:0/device:GPU:0", DeviceSpec("GPU", 0)),
        ("/job:localhost/replica:0/task:0/device:CPU:0", DeviceSpec("CPU", 0)),
        ("/device:GPU:1", DeviceSpec("GPU", 1)),
        ("/device:CPU:0", DeviceSpec("CPU", 0)),
        ("/GPU:0", DeviceSpec("GPU", 0)),
        ("/gpu:0", DeviceSpec("GPU", 0)),
        ("/cpu:0", DeviceSpec("CPU", 0)),
        ("GPU:0", DeviceSpec("GPU", 0)),
        ("gpu:3", DeviceSpec("GPU", 3)),
        ("CPU", DeviceSpec("CPU", 0)),
        ("/job:localhost/device:GPU:2", DeviceSpec("GPU", 2)),
    ],
)
def test_parse(text: str, spec: DeviceSpec) -> None:
    assert parse_device(text) == spec


def test_round_trips() -> None:
    for spec in (DeviceSpec("GPU", 0), DeviceSpec("CPU", 0), DeviceSpec("GPU", 7)):
        assert parse_device(spec.full) == spec
        assert parse_device(spec.short) == spec
    assert DeviceSpec("GPU", 0).full == "/job:localhost/replica:0/task:0/device:GPU:0"
    assert str(DeviceSpec("CPU", 0)) == "CPU:0"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty device string"),
        ("/", "empty device string"),
        ("TPU:0", "unknown device type 'TPU'"),
        ("GPU:x", "device index 'x'"),
        ("GPU:-1", "device index '-1'"),
        ("/device:GPU:0/device:CPU:0", "multiple device types"),
        ("/job:worker/device:GPU:0", "job:worker"),
        ("/replica:1/device:GPU:0", "replica:1"),
        ("/foo:1/device:GPU:0", "unknown attribute 'foo:1'"),
        ("GPU:0:1", "malformed device string"),
        ("/job:localhost", "no device type"),
        ("/device:GPU:0//", "empty component"),
    ],
)
def test_malformed_strings_name_the_bad_part(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_device(text)


def test_non_strings() -> None:
    with pytest.raises(TypeError):
        parse_device(0)  # type: ignore[arg-type]
