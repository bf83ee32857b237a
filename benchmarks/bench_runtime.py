"""Runtime benchmarks: an op on a small DeviceArray vs the same NumPy op, and a recorded
transfer vs a bare memcpy.

Run by hand:  .venv/bin/python benchmarks/bench_runtime.py [--instructions]

``--instructions`` counts instructions per small op with valgrind (callgrind), which does
not move with the load of a shared machine: each case runs twice in a child process, with
``OPS`` ops and with none after the same set-up, and the difference is divided by ``OPS``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import timeit

import numpy as np

import gpuviz
from benchmarks._results import Results, add_json_option

OPS = 5000


def best(stmt, number: int, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    """Best time per call in microseconds."""
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number * 1e6


def child(case: str, ops: int) -> None:
    host = np.ones((16, 16), dtype=np.float32)
    x = gpuviz.asarray(host) if case == "DeviceArray" else host
    for _ in range(10):  # warm caches (tags, interned strings, the first segment)
        x + x
    for _ in range(ops):
        x + x


def instructions(case: str, ops: int) -> float:
    """Instructions per ``x + x`` on a 16x16 float32 array (NumPy or DeviceArray)."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    counts = []
    for n in (ops, 0):
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
                   "--child", case, "--ops", str(n)]  # fmt: skip
        proc = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
        match = re.search(r"refs:\s+([\d,]+)", proc.stderr)
        if match is None:
            raise RuntimeError(f"no instruction count in valgrind's output:\n{proc.stderr[-2000:]}")
        counts.append(int(match.group(1).replace(",", "")))
    return (counts[0] - counts[1]) / ops


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--child", choices=["numpy", "DeviceArray"])
    parser.add_argument("--ops", type=int, default=OPS)
    add_json_option(parser)
    args = parser.parse_args()
    results = Results(
        "runtime", "Runtime: a small DeviceArray op vs NumPy, a recorded transfer vs a bare copy.", vars(args)
    )
    if args.child:
        child(args.child, args.ops)
        return
    if args.instructions:
        if shutil.which("valgrind") is None:
            sys.exit("valgrind is not installed (apt-get install valgrind)")
        numpy_op, device_op = instructions("numpy", args.ops), instructions("DeviceArray", args.ops)
        print(f"small op (16x16 float32 add): numpy {numpy_op:,.0f} instructions, DeviceArray {device_op:,.0f}"
              f" ({device_op / numpy_op:.0f}x)")  # fmt: skip
        results.add("small op (16x16 float32 add), NumPy", numpy_op, "instructions")
        results.add("small op (16x16 float32 add), DeviceArray", device_op, "instructions")
        results.write(args.json)
        return
    host = np.ones((16, 16), dtype=np.float32)
    x = gpuviz.asarray(host)
    numpy_add = best(lambda: host + host, 20000)
    device_add = best(lambda: x + x, 5000)
    print(f"small op (16x16 float32 add): numpy {numpy_add:.2f} us, DeviceArray {device_add:.2f} us"
          f" -> overhead {device_add - numpy_add:.1f} us per op")  # fmt: skip
    results.add("small op (16x16 float32 add), NumPy", numpy_add, "us")
    results.add("small op (16x16 float32 add), DeviceArray", device_add, "us")

    for size in (4 << 10, 1 << 20, 64 << 20):
        data = np.ones(size, dtype=np.uint8)
        target = np.empty_like(data)
        bare = best(lambda d=data, t=target: np.copyto(t, d), 20 if size > 1 << 20 else 2000)
        recorded = best(lambda d=data: gpuviz.asarray(d), 20 if size > 1 << 20 else 2000)
        print(f"H2D copy of {size >> 10:>6} KiB: memcpy {bare:9.2f} us, recorded transfer {recorded:9.2f} us"
              f" -> overhead {recorded - bare:8.2f} us")  # fmt: skip
        results.add(f"H2D copy of {size >> 10} KiB, bare memcpy", bare, "us")
        results.add(f"H2D copy of {size >> 10} KiB, recorded transfer", recorded, "us")
    results.write(args.json)


if __name__ == "__main__":
    main()
