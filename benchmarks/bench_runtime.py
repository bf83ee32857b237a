"""Runtime benchmarks: an op on a small DeviceArray vs the same NumPy op, and a recorded
transfer vs a bare memcpy.

Run by hand:  .venv/bin/python benchmarks/bench_runtime.py
"""

from __future__ import annotations

import timeit

import numpy as np

import gpuviz


def best(stmt, number: int, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    """Best time per call in microseconds."""
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    host = np.ones((16, 16), dtype=np.float32)
    x = gpuviz.asarray(host)
    numpy_add = best(lambda: host + host, 20000)
    device_add = best(lambda: x + x, 5000)
    print(f"small op (16x16 float32 add): numpy {numpy_add:.2f} us, DeviceArray {device_add:.2f} us"
          f" -> overhead {device_add - numpy_add:.1f} us per op")  # fmt: skip

    for size in (4 << 10, 1 << 20, 64 << 20):
        data = np.ones(size, dtype=np.uint8)
        target = np.empty_like(data)
        bare = best(lambda d=data, t=target: np.copyto(t, d), 20 if size > 1 << 20 else 2000)
        recorded = best(lambda d=data: gpuviz.asarray(d), 20 if size > 1 << 20 else 2000)
        print(f"H2D copy of {size >> 10:>6} KiB: memcpy {bare:9.2f} us, recorded transfer {recorded:9.2f} us"
              f" -> overhead {recorded - bare:8.2f} us")  # fmt: skip


if __name__ == "__main__":
    main()
