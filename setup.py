"""Build configuration beyond pyproject.toml: the optional C extensions and the JupyterLab
extension.

The JupyterLab extension (TypeScript in ``labextension/``) ships prebuilt inside the gpuviz
wheel, as JupyterLab extensions are distributed: its federated bundle under
``share/jupyter/labextensions/gpuviz-labextension/`` and the server extension's config under
``etc/jupyter/jupyter_server_config.d/``. ``BuildLabextension`` builds the bundle into
``labextension/dist`` with the machine's Node.js (``jlpm`` from jupyter-builder, a build
requirement, else ``npm``) when it is absent or older than its sources; an sdist carries the
built bundle, so installing from one needs no Node.js.

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
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

from setuptools import Command, Extension, setup
from setuptools.command.build import build
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist
from setuptools.dist import Distribution as _Distribution

BUILD_RECORD = "gpuviz/base/_native_build.json"  # relative to the folder the package is built into
ROOT = Path(__file__).resolve().parent
LABEXTENSION = ROOT / "labextension"
LAB_BUILT = LABEXTENSION / "dist"  # package.json's jupyterlab.outputDir
LAB_NAME = "gpuviz-labextension"
LAB_SOURCES = ("src", "style", "package.json", "tsconfig.json", "yarn.lock")


def labextension_is_current() -> bool:
    """Whether ``labextension/dist`` holds a built bundle at least as new as its sources."""
    marks = [LAB_BUILT / "package.json", LAB_BUILT / "static" / "style.js"]
    if not all(mark.is_file() for mark in marks):
        return False
    built = min(mark.stat().st_mtime for mark in marks)
    sources = [LABEXTENSION / name for name in LAB_SOURCES]
    files = [f for s in sources for f in ([s] if s.is_file() else s.rglob("*") if s.is_dir() else []) if f.is_file()]
    return all(f.stat().st_mtime <= built for f in files)


def _jlpm() -> list[str] | None:
    """The command that runs jlpm (jupyter-builder's pinned yarn) on the machine's Node.js, or
    None without Node.js or jupyter-builder (a build requirement: it also drives the bundler)."""
    if shutil.which("node") is None:
        return None
    try:
        import jupyter_builder  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-c", "import sys; from jupyter_builder.jlpm import main; sys.argv[0] = 'jlpm'; main()"]


def build_labextension() -> None:
    """Build the JupyterLab extension into ``labextension/dist``: its npm dependencies (jlpm, from
    the committed yarn.lock), the TypeScript, then the federated bundle (jupyter-builder)."""
    jlpm = _jlpm()
    if jlpm is None:
        raise RuntimeError(
            "building gpuviz's JupyterLab extension needs Node.js (node on PATH) and the Python package "
            f"jupyter-builder, and no prebuilt extension exists in {LAB_BUILT}. Install Node.js >= 20 "
            "(and pip install jupyter-builder when building without isolation), or install gpuviz from a wheel "
            "or an sdist: both carry the built extension."
        )
    builder = [sys.executable, "-c", "from jupyter_builder.main import main; main()"]
    shutil.rmtree(LAB_BUILT, ignore_errors=True)  # no chunks of an older build left beside the new ones
    steps = [[*jlpm, "install"], ["node", "node_modules/typescript/bin/tsc"], [*builder, "build", "."]]
    for step in steps:
        print(f"gpuviz: building the JupyterLab extension: {' '.join(step[-2:])}", file=sys.stderr)
        subprocess.run(step, cwd=LABEXTENSION, check=True)
    if not labextension_is_current():
        raise RuntimeError(f"the JupyterLab extension's build left no bundle in {LAB_BUILT}")


def labextension_data_files() -> list[tuple[str, list[str]]]:
    """``data_files`` for the built extension: share/jupyter/labextensions/... and the server config."""
    share = f"share/jupyter/labextensions/{LAB_NAME}"
    files: dict[str, list[str]] = {share: [str((LABEXTENSION / "install.json").relative_to(ROOT))]}
    for path in sorted(LAB_BUILT.rglob("*")):
        if path.is_file():
            folder = Path(share, path.parent.relative_to(LAB_BUILT)).as_posix().rstrip("/.")
            files.setdefault(folder, []).append(path.relative_to(ROOT).as_posix())
    config = LABEXTENSION / "jupyter-config" / "server-config" / "gpuviz.json"
    files["etc/jupyter/jupyter_server_config.d"] = [config.relative_to(ROOT).as_posix()]
    return sorted(files.items())


class BuildLabextension(Command):
    """Builds the JupyterLab extension when it is absent or stale, and lists its files as data files."""

    description = "build gpuviz's JupyterLab extension (labextension/dist) where needed"
    user_options: ClassVar[list[tuple[str, str | None, str]]] = []

    def initialize_options(self) -> None:
        pass

    def finalize_options(self) -> None:
        pass

    def run(self) -> None:
        if not labextension_is_current():
            if LAB_BUILT.joinpath("package.json").is_file() and _jlpm() is None:
                print(f"WARNING: {LAB_BUILT} is older than its sources and Node.js is missing: shipping it as it is",
                      file=sys.stderr)  # fmt: skip
            else:
                build_labextension()
        data_files = [entry for entry in self.distribution.data_files or [] if "labextensions" not in entry[0]]
        self.distribution.data_files = data_files + labextension_data_files()
        install_data = self.distribution.command_obj.get("install_data")
        if install_data is not None:  # already finalized (editable installs): it copied the list then
            install_data.data_files = self.distribution.data_files


class Build(build):
    sub_commands: ClassVar[list[tuple[str, object]]] = [("build_labextension", None), *build.sub_commands]


class Distribution(_Distribution):
    def has_data(self) -> bool:
        """Whether there are data files: editable installs ask this name (``editable_wheel._run_install``
        looks for ``has_data``, which setuptools' distribution lacks) before installing them."""
        return self.has_data_files()


class Sdist(sdist):
    """An sdist carries the built extension, so that installing it needs no Node.js."""

    def run(self) -> None:
        self.run_command("build_labextension")
        super().run()


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


# Native code lives in csrc/, one folder per Python layer it serves (csrc/README.md maps each
# C file to its Python twin and the test that holds them equal). Each csrc/<layer>/<name>.c that
# defines PyInit_<name> is the extension gpuviz.<layer>.<name>; the headers are found, not listed.
CSRC = ROOT / "csrc"
# what an extension compiles besides its own file, and links against
EXTRA_SOURCES = {
    "gpuviz.capture._bfcnative": [
        "csrc/capture/_bfcnative_owner.c",
        "csrc/capture/_bfcnative_views.c",
        "csrc/capture/_bfc_core.c",
    ],
    "gpuviz.capture._pluggable": ["csrc/capture/_bfc_core.c"],
    "gpuviz.scenarios._whatifcore": ["csrc/capture/_bfc_core.c"],
    "gpuviz.analysis._replaykernel": ["csrc/analysis/_replayheap.c"],
    "gpuviz.importers._snapshotpickle": [
        "csrc/importers/_snapshotpickle_memo.c",
        "csrc/importers/_snapshotpickle_entries.c",
    ],
    "gpuviz.importers._xplanewire": ["csrc/importers/_xplanewire_keys.c"],
}
LIBRARIES = {"gpuviz.log._batchwriter": ["pthread"], "gpuviz.capture._pluggable": ["dl", "pthread"]}


def native_extensions() -> list[Extension]:
    """Every C extension under csrc/: optional (gpuviz runs its Python twin where one fails), -O2,
    rebuilt when any header under csrc/ (the vendored xxHash included) changes."""
    headers = sorted(p.relative_to(ROOT).as_posix() for p in CSRC.rglob("*") if p.suffix in (".h", ".c"))
    extensions = []
    for source in sorted(CSRC.glob("*/*.c")):
        if f"PyInit_{source.stem}" not in source.read_text(encoding="utf-8"):
            continue  # a part compiled into others (EXTRA_SOURCES)
        name = f"gpuviz.{source.parent.name}.{source.stem}"
        extensions.append(
            Extension(
                name,
                sources=[source.relative_to(ROOT).as_posix(), *EXTRA_SOURCES.get(name, [])],
                depends=headers,
                extra_compile_args=["-O2"],
                libraries=LIBRARIES.get(name, []),
                optional=True,
            )
        )
    return extensions


EXTENSIONS = native_extensions()

if __name__ == "__main__":
    setup(
        distclass=Distribution,
        ext_modules=EXTENSIONS,
        cmdclass={"build_ext": BuildExt, "build_labextension": BuildLabextension, "build": Build, "sdist": Sdist},
    )
