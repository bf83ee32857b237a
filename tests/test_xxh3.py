"""csrc/log/_hash.h (upstream xxHash, vendored) must give the ``xxhash`` package's XXH3-64 for
every input: the checksums csrc/log/_batchwriter.c writes are checked by checksums.py.

The header is compiled with the system ``gcc`` into a throwaway shared library and called through
ctypes, three ways: as the extension builds it (on x86 the kernel picked at load time: AVX-512,
AVX2 or SSE2), x86 dispatch without AVX-512 (AVX2 where the CPU has it), and the compile-time
choice with the vector kernels compiled out (scalar)."""

from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

HEADER_DIR = Path(__file__).resolve().parents[1] / "csrc" / "log"
X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
SOURCE = """#include "_hash.h"
uint64_t check(const void *p, size_t n) { return gv_xxh3_64(p, n); }
#ifdef XXH_X86DISPATCH
int kernel(void) { return XXH_featureTest(); } /* XXH_SCALAR 0, XXH_SSE2 1, XXH_AVX2 2, XXH_AVX512 3 */
#else
int kernel(void) { return -1; }
#endif
"""
DATA = np.random.default_rng(0).integers(0, 256, 300_100, dtype=np.uint8).tobytes()
BUF = ctypes.create_string_buffer(DATA, len(DATA))  # fixed address, for unaligned starts
FLAGS = {"default": [], "no-avx512": ["-DXXH_DISPATCH_AVX512=0"], "scalar": ["-DGV_XXH_NO_DISPATCH", "-DXXH_VECTOR=0"]}


def _cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    return set(cpuinfo.read_text().split()) if cpuinfo.exists() else set()


@pytest.fixture(scope="module", params=list(FLAGS))
def variant(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def lib(variant: str, tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed (CI installs it)")
    tmp = tmp_path_factory.mktemp(f"xxh3_{variant}")
    (tmp / "check.c").write_text(SOURCE)
    cmd = ["gcc", "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", *FLAGS[variant], f"-I{HEADER_DIR}"]
    subprocess.run([*cmd, "-o", str(tmp / "check.so"), str(tmp / "check.c")], check=True)
    so = ctypes.CDLL(str(tmp / "check.so"))
    so.check.argtypes, so.check.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_uint64
    so.kernel.argtypes, so.kernel.restype = [], ctypes.c_int
    return so


def test_kernel_taken(lib: ctypes.CDLL, variant: str) -> None:
    """On x86 the build runs the widest kernel the CPU has, or this file tests one kernel thrice."""
    if variant == "scalar" or not X86:
        assert lib.kernel() == -1  # no dispatch: the compile-time kernel
        return
    flags = _cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo to tell the CPU's features")
    widest = 3 if "avx512f" in flags and variant == "default" else 2 if "avx2" in flags else 1
    assert lib.kernel() == widest


def test_every_length_up_to_2100(lib: ctypes.CDLL) -> None:
    for n in range(2101):
        assert lib.check(DATA[:n], n) == xxhash.xxh3_64_intdigest(DATA[:n]), n


def test_block_boundaries(lib: ctypes.CDLL) -> None:
    lengths = {1024 * k + d for k in range(1, 293) for d in (-65, -64, -63, -1, 0, 1, 63, 64, 65)}
    for n in sorted(lengths):
        for start in (0, 3):  # an odd start too: the kernels must not assume alignment
            got = lib.check(ctypes.addressof(BUF) + start, n)
            assert got == xxhash.xxh3_64_intdigest(DATA[start : start + n]), (start, n)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=5000))
def test_hypothesis(lib: ctypes.CDLL, data: bytes) -> None:
    assert lib.check(data, len(data)) == xxhash.xxh3_64_intdigest(data)
