"""gpuviz/log/_xxh3.h (the native XXH3-64) must equal the ``xxhash`` package for every input.

The header is compiled with the system ``gcc`` into a throwaway shared library and called through
ctypes, three times: as the extensions build it (AVX2 long path where the CPU has it), with the
SIMD path compiled out (scalar), and scalar with the portable 32-bit-limb multiply."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

HEADER_DIR = Path(__file__).resolve().parents[1] / "gpuviz" / "log"
SOURCE = """#include "_xxh3.h"
uint64_t check(const void *p, size_t n) { return gv_xxh3_64(p, n); }
void hex(uint64_t h, char *out) { gv_hex16(h, out); }
#ifdef GV_XXH_HAVE_SIMD
int avx2(void) { return gv_xxh_use_avx2(); }
#else
int avx2(void) { return 0; }
#endif
"""
DATA = np.random.default_rng(0).integers(0, 256, 300_100, dtype=np.uint8).tobytes()
BUF = ctypes.create_string_buffer(DATA, len(DATA))  # fixed address, for unaligned starts
FLAGS = {"default": [], "scalar": ["-DGV_XXH_NO_SIMD"], "portable": ["-DGV_XXH_NO_INT128", "-DGV_XXH_NO_SIMD"]}


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
    so.hex.argtypes, so.hex.restype = [ctypes.c_uint64, ctypes.c_char_p], None
    return so


def test_path_taken(lib: ctypes.CDLL, variant: str) -> None:
    """The default build must really run AVX2 where the CPU has it, or this file tests scalar thrice."""
    cpuinfo = Path("/proc/cpuinfo")
    has_avx2 = cpuinfo.exists() and " avx2" in cpuinfo.read_text()
    assert lib.avx2() == (variant == "default" and has_avx2)


def test_every_length_up_to_2100(lib: ctypes.CDLL) -> None:
    for n in range(2101):
        assert lib.check(DATA[:n], n) == xxhash.xxh3_64_intdigest(DATA[:n]), n


def test_block_boundaries(lib: ctypes.CDLL) -> None:
    lengths = {1024 * k + d for k in range(1, 293) for d in (-65, -64, -63, -1, 0, 1, 63, 64, 65)}
    for n in sorted(lengths):
        for start in (0, 3):  # an odd start too: the header must not assume alignment
            got = lib.check(ctypes.addressof(BUF) + start, n)
            assert got == xxhash.xxh3_64_intdigest(DATA[start : start + n]), (start, n)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=5000))
def test_hypothesis(lib: ctypes.CDLL, data: bytes) -> None:
    assert lib.check(data, len(data)) == xxhash.xxh3_64_intdigest(data)


def test_hex16(lib: ctypes.CDLL) -> None:
    out = ctypes.create_string_buffer(16)
    for n in (0, 1, 5, 17, 200, 5000):
        lib.hex(lib.check(DATA[:n], n), out)
        assert out.raw.decode() == xxhash.xxh3_64_hexdigest(DATA[:n])
    for h in (0, 1, 0xF, 2**63, 2**64 - 1, 0x0123456789ABCDEF):
        lib.hex(h, out)
        assert out.raw.decode() == f"{h:016x}"
