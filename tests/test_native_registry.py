"""The registry of native modules (``gpuviz.base.native``): every C extension of setup.py is in
it, ``gpuviz info`` lists each with its state, ``import gpuviz`` warns once about any that was
not built or failed to load, and ``GPUVIZ_NATIVE=0`` stays the silent opt-out. Missing modules
are simulated in a subprocess, through the registry's own seam (``GPUVIZ_NATIVE_SKIP``) or a
failing import."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from gpuviz.base import native

ROOT = Path(__file__).resolve().parents[1]
SETUP = runpy.run_path(str(ROOT / "setup.py"), run_name="setup")  # its functions, without running setup()


def python(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("GPUVIZ_NATIVE", "GPUVIZ_NATIVE_SKIP")}
    return subprocess.run(
        [sys.executable, "-W", "default", "-c", textwrap.dedent(script)],
        capture_output=True, text=True, env={**base, **env},
    )  # fmt: skip


def test_the_registry_names_every_extension_that_setup_builds() -> None:
    assert sorted(module.name for module in native.MODULES) == sorted(ext.name for ext in SETUP["EXTENSIONS"])
    assert len(native.MODULES) == 10
    assert all(module.speeds_up for module in native.MODULES)
    assert {m.name for m in native.MODULES if not m.switchable} == {"gpuviz.log._staging", "gpuviz.log._batchwriter"}
    with pytest.raises(ValueError, match=r"gpuviz\.capture\._nothing is not one of gpuviz's native modules"):
        native.status("gpuviz.capture._nothing")


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
def test_where_a_compiler_exists_every_module_is_built_and_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUVIZ_NATIVE", raising=False)
    monkeypatch.delenv("GPUVIZ_NATIVE_SKIP", raising=False)
    assert [(s.module.name, s.state, s.reason) for s in native.statuses()] == [
        (m.name, "loaded", "") for m in native.MODULES
    ]
    assert native.problems() == []
    assert all(native.available(m.name) for m in native.MODULES)
    monkeypatch.setenv("GPUVIZ_NATIVE", "0")  # read at each call
    assert [native.available(m.name) for m in native.MODULES] == [not m.switchable for m in native.MODULES]
    assert native.status("gpuviz.log._heapcore").state == "disabled"
    assert native.why_not("gpuviz.log._heapcore") == "GPUVIZ_NATIVE=0"
    assert native.problems() == []


def test_gpuviz_info_lists_every_module_with_its_state() -> None:
    proc = python("from gpuviz.frontends.cli import main; main(['info'])")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("native modules:\n", 1)[1].splitlines()[: len(native.MODULES)]
    for module, line in zip(native.MODULES, lines, strict=True):
        entry = native.status(module.name)
        state = entry.state + (f" ({entry.reason})" if entry.reason else "")
        assert line == f"  {module.name}: {state} - {module.speeds_up}"
    proc = python("from gpuviz.frontends.cli import main; main(['info'])", GPUVIZ_NATIVE="0")
    assert "  gpuviz.capture._bfcnative: disabled (GPUVIZ_NATIVE=0) - " in proc.stdout
    assert "  gpuviz.log._staging: loaded - " in proc.stdout or "gpuviz.log._staging: not built" in proc.stdout


def test_a_module_not_built_is_named_once_with_its_reason_and_gpuviz_runs_without_it() -> None:
    script = """
        import warnings
        import gpuviz
        from gpuviz.base import native
        from gpuviz.capture.native import allocator_description, native_core_available
        from gpuviz.log.heapbuilder import HeapBuilder, PythonHeapBuilder
        import gpuviz.capture, gpuviz.log.heapbuilder  # no second warning for what is already named
        assert HeapBuilder is PythonHeapBuilder and not native_core_available()
        assert gpuviz.BFCAllocator.__name__ == "ReferenceBFCAllocator"
        print(allocator_description())
        print(native.status("gpuviz.log._heapcore"))
        alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"))
        alloc.free(alloc.allocate(1000))
        print(len(alloc.log))
    """
    proc = python(script, GPUVIZ_NATIVE_SKIP="gpuviz.log._heapcore, gpuviz.capture._bfcnative")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("RuntimeWarning") == 1, proc.stderr
    assert "gpuviz runs 2 of its native modules as pure Python (same results, slower):" in proc.stderr
    assert "  gpuviz.capture._bfcnative (the BFC allocator's hot path (gpuviz.BFCAllocator)): not built: " \
        "skipped by GPUVIZ_NATIVE_SKIP" in proc.stderr  # fmt: skip
    assert "  gpuviz.log._heapcore (rebuilding heaps from imported traces (HeapBuilder)): not built: " in proc.stderr
    out = proc.stdout.splitlines()
    assert out[0] == "Python (not built: skipped by GPUVIZ_NATIVE_SKIP)"
    assert "state='not built'" in out[1] and out[2] == "5"  # segment, split, alloc, free, merge
    quiet = python(script, GPUVIZ_NATIVE_SKIP="gpuviz.log._heapcore,gpuviz.capture._bfcnative", GPUVIZ_NATIVE="0")
    assert quiet.returncode == 0 and "RuntimeWarning" not in quiet.stderr, quiet.stderr  # the explicit opt-out


def test_a_module_that_fails_to_load_is_named_with_the_import_error() -> None:
    script = """
        import importlib.machinery
        real = importlib.machinery.ExtensionFileLoader.create_module

        def create_module(self, spec):
            if spec.name == "gpuviz.importers._xplanewire":
                raise ImportError("undefined symbol: simulated_missing_symbol")
            return real(self, spec)

        importlib.machinery.ExtensionFileLoader.create_module = create_module
        import gpuviz
        from gpuviz.importers import xplane
        print(xplane.native_decoder_available())
    """
    proc = python(script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "False\n"
    assert proc.stderr.count("RuntimeWarning") == 1, proc.stderr
    assert (
        "  gpuviz.importers._xplanewire (decoding TensorFlow/JAX XPlane memory events): failed to load: "
        "ImportError: undefined symbol: simulated_missing_symbol"
    ) in proc.stderr


def test_the_build_tells_a_missing_compiler_from_missing_headers(tmp_path: Path) -> None:
    reason = SETUP["failure_reason"]
    error = RuntimeError("command 'gcc' failed: No such file or directory")
    assert reason(["/no/such/gcc", "-O2"], [str(tmp_path)], error) == "no C compiler (/no/such/gcc not found)"
    assert reason([], [], error) == "no C compiler (cc not found)"
    assert reason([sys.executable, "-O2"], [str(tmp_path)], error) == (
        f"the Python headers are missing (no Python.h in {tmp_path}; install python3-dev or its equivalent)"
    )
    (tmp_path / "Python.h").write_text("")
    failed = RuntimeError("x.c: In function 'f':\nx.c:3:1: error: expected ';' before '}' token\n")
    assert reason(["ccache", sys.executable], [str(tmp_path)], failed) == (
        "the C compiler failed: x.c:3:1: error: expected ';' before '}' token"
    )


def test_the_build_record_gives_the_reason_a_module_was_not_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = tmp_path / "_native_build.json"
    record.write_text('{"built": [], "failed": {"gpuviz.log._heapcore": "no C compiler (cc not found)"}}')
    monkeypatch.setattr(native, "BUILD_RECORD", record)
    monkeypatch.setattr(native, "_file", lambda name: None)  # as where nothing was built
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setattr(native, "_warned", set())
    monkeypatch.delenv("GPUVIZ_NATIVE", raising=False)
    entry = native.status("gpuviz.log._heapcore")
    assert (entry.state, entry.reason) == ("not built", "no C compiler (cc not found)")
    assert native.status("gpuviz.log._staging").reason == "its compiled file is missing (the build recorded no failure)"
    every = len(native.MODULES)
    with pytest.warns(RuntimeWarning, match=rf"gpuviz runs {every} of its native modules as pure Python") as caught:
        native.warn_problems()
    assert (
        "gpuviz.log._heapcore (rebuilding heaps from imported traces (HeapBuilder)): not built: no C compiler"
        in str(caught[0].message)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        native.warn_problems()  # once: nothing new to say
    record.unlink()
    assert native.status("gpuviz.log._heapcore").reason == "gpuviz was installed without building its C extensions"
