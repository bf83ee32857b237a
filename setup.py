"""Build configuration beyond pyproject.toml: the optional C extensions.

Every extension is optional: where one cannot be built (no C compiler, the Python headers
missing, a compiler error) the build goes on without it and gpuviz runs its Python twin
(same results, slower). ``BuildExt`` says so loudly (a banner on stderr) and records each
failure and its reason in ``gpuviz/base/_native_build.json``, which ``gpuviz.base.native``
reads: ``gpuviz info`` lists every module, and ``import gpuviz`` warns about the missing ones.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

BUILD_RECORD = "gpuviz/base/_native_build.json"  # relative to the folder the package is built into


def failure_reason(compiler: list[str], include_dirs: list[str], error: BaseException) -> str:
    """Why an extension could not be built, in words: no C compiler, the Python headers missing,
    or the compiler's own first error line. ``compiler``: the compile command's argv
    (e.g. ``["gcc", "-pthread", ...]``); ``include_dirs``: where ``Python.h`` is looked for."""
    program = next((part for part in compiler if part not in ("ccache", "sccache")), "") if compiler else ""
    if not program or shutil.which(program) is None:
        return f"no C compiler ({program or 'cc'} not found)"
    if not any(os.path.isfile(os.path.join(folder, "Python.h")) for folder in include_dirs):
        where = ", ".join(include_dirs) or "no include folder"
        return f"the Python headers are missing (no Python.h in {where}; install python3-dev or its equivalent)"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    first = next((line for line in lines if "error" in line.lower()), lines[0] if lines else type(error).__name__)
    return f"the C compiler failed: {first}"


class BuildExt(build_ext):
    """``build_ext`` that skips an extension it cannot build, prints a banner naming it and
    why, and writes the build record (``BUILD_RECORD``) that ``gpuviz.base.native`` reads."""

    def run(self) -> None:
        self._failed: dict[str, str] = {}
        super().run()
        inplace = self.inplace or getattr(self, "editable_mode", False)
        folder = Path(__file__).resolve().parent if inplace else Path(self.build_lib)
        record = folder / BUILD_RECORD
        record.parent.mkdir(parents=True, exist_ok=True)
        built = sorted(ext.name for ext in self.extensions if ext.name not in self._failed)
        record.write_text(json.dumps({"built": built, "failed": self._failed}, indent=1) + "\n")
        if self._failed:
            rows = "\n".join(f"  {name}: {reason}" for name, reason in sorted(self._failed.items()))
            bar = "!" * 78
            print(
                f"\n{bar}\nWARNING: gpuviz built without {len(self._failed)} of its {len(self.extensions)} "
                f"C extensions; they run as pure Python (same results, slower):\n{rows}\n"
                f"`import gpuviz` warns about them and `gpuviz info` lists them.\n{bar}\n",
                file=sys.stderr,
            )

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as error:  # CCompilerError, CompileError, LinkError, DistutilsError, ...
            if not ext.optional:
                raise
            compiler = list(getattr(self.compiler, "compiler_so", None) or [])
            include_dirs = [str(folder) for folder in (*(self.include_dirs or []), *ext.include_dirs)]
            self._failed[ext.name] = failure_reason(compiler, include_dirs, error)
            print(f"WARNING: gpuviz's C extension {ext.name} was not built: {self._failed[ext.name]}", file=sys.stderr)


WHATIF_PARTS = ("sets", "heap", "policies")  # included by gpuviz/scenarios/_whatifcore.c

EXTENSIONS = [
    Extension(
        "gpuviz.capture._rowwriter",
        sources=["gpuviz/capture/_rowwriter.c"],
        depends=[
            "gpuviz/log/_rows.h",
            "gpuviz/capture/_clock.h",
            "gpuviz/log/_rowsink.h",
            "gpuviz/log/_window.h",
        ],
        optional=True,
    ),
    Extension(
        "gpuviz.log._staging",
        sources=["gpuviz/log/_staging.c"],
        depends=["gpuviz/log/_chunks.h", "gpuviz/log/_rowsink.h", "gpuviz/log/_rows.h", "gpuviz/log/_window.h"],
        extra_compile_args=["-O2"],
        libraries=["pthread"],  # the thread that maps and populates the next chunk (_chunks.h)
        optional=True,
    ),
    Extension(  # the batches of a log recording to a file, written off the recording thread
        "gpuviz.log._batchwriter",
        sources=["gpuviz/log/_batchwriter.c"],
        depends=["gpuviz/log/_ipcmessage.h", "gpuviz/log/_rows.h", "gpuviz/log/_window.h", "gpuviz/log/_xxh3.h"],
        extra_compile_args=["-O2"],
        libraries=["pthread"],
        optional=True,
    ),
    Extension(
        "gpuviz.capture._bfcnative",
        sources=["gpuviz/capture/_bfcnative.c", "gpuviz/capture/_bfc_core.c"],
        depends=[
            "gpuviz/capture/_bfc_core.h",
            "gpuviz/log/_rows.h",
            "gpuviz/capture/_clock.h",
            "gpuviz/log/_rowsink.h",
            "gpuviz/log/_window.h",
        ],
        extra_compile_args=["-O2"],
        optional=True,
    ),
    Extension(  # the core with gpuviz_malloc/gpuviz_free, for PyTorch's pluggable allocator (POSIX)
        "gpuviz.capture._pluggable",
        sources=["gpuviz/capture/_pluggable.c", "gpuviz/capture/_bfc_core.c"],
        depends=["gpuviz/capture/_bfc_core.h", "gpuviz/log/_window.h", "gpuviz/log/_rows.h"],
        extra_compile_args=["-O2"],
        libraries=["dl", "pthread"],
        optional=True,
    ),
    Extension(  # the streaming reader of PyTorch snapshot pickles (gpuviz.importers.snapshot_reader)
        "gpuviz.importers._snapshotpickle",
        sources=["gpuviz/importers/_snapshotpickle.c"],
        depends=["gpuviz/importers/_columns.h"],
        extra_compile_args=["-O2"],
        optional=True,
    ),
    Extension(  # the decoder of XPlane memory events (gpuviz.importers.xplane)
        "gpuviz.importers._xplanewire",
        sources=["gpuviz/importers/_xplanewire.c"],
        depends=["gpuviz/importers/_columns.h"],
        extra_compile_args=["-O2"],
        optional=True,
    ),
    Extension(  # HeapBuilder's heap (gpuviz.log.heapbuilder.NativeHeapBuilder)
        "gpuviz.log._heapcore",
        sources=["gpuviz/log/_heapcore.c"],
        depends=["gpuviz/log/_rowsink.h", "gpuviz/log/_rows.h", "gpuviz/log/_window.h"],
        extra_compile_args=["-O2"],
        optional=True,
    ),
    Extension(  # what-if replays under every policy (gpuviz.scenarios.native)
        "gpuviz.scenarios._whatifcore",
        sources=["gpuviz/scenarios/_whatifcore.c", "gpuviz/capture/_bfc_core.c"],
        depends=["gpuviz/capture/_bfc_core.h", "gpuviz/log/_rows.h", "gpuviz/log/_window.h"]
        + [f"gpuviz/scenarios/_whatif_{part}.h" for part in WHATIF_PARTS],
        extra_compile_args=["-O2"],
        optional=True,
    ),
    Extension(  # LiveFollower.update's pass over the new rows (gpuviz.analysis.live)
        "gpuviz.analysis._livekernel",
        sources=["gpuviz/analysis/_livekernel.c"],
        extra_compile_args=["-O2"],
        optional=True,
    ),
    Extension(
        "gpuviz.analysis._replaykernel",
        sources=["gpuviz/analysis/_replaykernel.c"],
        extra_compile_args=["-O2"],
        optional=True,
    ),
]

if __name__ == "__main__":
    setup(ext_modules=EXTENSIONS, cmdclass={"build_ext": BuildExt})
