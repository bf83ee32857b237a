"""Checksum speed: XXH3-64 of a batch block as csrc/log/_batchwriter.c hashes it.

Run by hand:  .venv/bin/python -m benchmarks.bench_hash [--kib 160] [--json PATH]

csrc/log/_hash.h (upstream xxHash, vendored) is compiled with the system ``gcc`` into a
throwaway library, as the extension builds it and in the variants tests/test_xxh3.py checks,
and each hashes one block (160 KiB: a file batch of flush_rows // 3 rows, all columns) in a
C loop; best of the repeats, GB/s (1e9 bytes per second). The ``xxhash`` package (the Python
checksums of checksums.py) is timed on the same block for reference, Python call included.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import xxhash

from benchmarks._results import Results, add_json_option

HEADER_DIR = Path(__file__).resolve().parents[1] / "csrc" / "log"
SOURCE = """#include <time.h>
#include "_hash.h"
double bench(const void *p, size_t n, int iterations) { /* ns per hash */
    struct timespec a, b;
    uint64_t sink = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < iterations; i++) sink += gv_xxh3_64(p, n - (size_t)(i & 1));
    clock_gettime(CLOCK_MONOTONIC, &b);
    __asm__ volatile("" : : "r"(sink));
    return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / iterations;
}
"""
VARIANTS = {  # name: gcc flags
    "as built (x86: the kernel picked at load time)": [],
    "x86 dispatch without AVX-512": ["-DXXH_DISPATCH_AVX512=0"],
    "compile-time kernel, baseline flags (x86-64: SSE2)": ["-DGV_XXH_NO_DISPATCH"],
    "scalar": ["-DGV_XXH_NO_DISPATCH", "-DXXH_VECTOR=0"],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kib", type=int, default=160, help="block size, KiB")
    parser.add_argument("--repeats", type=int, default=15)
    add_json_option(parser)
    args = parser.parse_args()
    results = Results("hash", "XXH3-64 of one file batch's block (checksums), GB/s.", vars(args))
    if shutil.which("gcc") is None:
        raise SystemExit("bench_hash needs gcc")
    n = args.kib << 10
    block = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8).tobytes()
    buffer = ctypes.create_string_buffer(block, n)
    iterations = max(1, (2 << 30) // n // args.repeats)  # ~2 GB hashed per variant
    with tempfile.TemporaryDirectory(prefix="gpuviz-hash-") as tmp:
        (Path(tmp) / "bench.c").write_text(SOURCE)
        for index, (name, flags) in enumerate(VARIANTS.items()):
            so = Path(tmp) / f"bench{index}.so"
            cmd = [
                "gcc",
                "-O2",
                "-shared",
                "-fPIC",
                *flags,
                f"-I{HEADER_DIR}",
                "-o",
                str(so),
                str(Path(tmp) / "bench.c"),
            ]
            subprocess.run(cmd, check=True)
            lib = ctypes.CDLL(str(so))
            lib.bench.argtypes, lib.bench.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_double
            best = min(lib.bench(buffer, n, iterations) for _ in range(args.repeats))
            print(f"{name:52s}: {n / best:6.1f} GB/s ({best / 1e3:.2f} us a block)")
            results.add(f"XXH3-64 of {args.kib} KiB, {name} (best of {args.repeats})", n / best, "GB/s")
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter_ns()
        for _ in range(iterations):
            xxhash.xxh3_64_intdigest(block)
        times.append((time.perf_counter_ns() - start) / iterations)
    print(f"{'xxhash package (Python call included)':52s}: {n / min(times):6.1f} GB/s")
    results.add(
        f"XXH3-64 of {args.kib} KiB, xxhash package from Python (best of {args.repeats})", n / min(times), "GB/s"
    )
    results.write(args.json)


if __name__ == "__main__":
    main()
