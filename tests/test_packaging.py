"""One package: the sdist and the wheel that ``python -m build`` makes carry the Python package,
the native modules and the prebuilt JupyterLab extension; the wheel, installed into a fresh
virtual environment, runs ``gpuviz demo`` and JupyterLab lists its extension as enabled.

The fresh environment borrows this one's dependencies (numpy, pyarrow, jupyterlab, ...)
through a path file, not its ``.pth`` hooks, so the gpuviz it imports is the wheel's.
"""

from __future__ import annotations

import os
import re
import runpy
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARE = "share/jupyter/labextensions/gpuviz-labextension/"
SERVER_CONFIG = "etc/jupyter/jupyter_server_config.d/gpuviz.json"

SETUP = runpy.run_path(str(ROOT / "setup.py"), run_name="setup")  # its functions, without running setup()


def clean_env() -> dict[str, str]:
    """The environment without this checkout on the path (tests may run with PYTHONPATH set)."""
    return {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel) built from this checkout with ``python -m build`` (the wheel from the sdist)."""
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True, text=True, env=clean_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (sdist,), (wheel,) = sorted(out.glob("gpuviz-*.tar.gz")), sorted(out.glob("gpuviz-*.whl"))
    return sdist, wheel


@pytest.mark.slow
def test_the_sdist_holds_what_a_build_needs(built: tuple[Path, Path]) -> None:
    sdist, _ = built
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for needed in ("setup.py", "pyproject.toml", "LICENSE", "csrc/capture/_bfc_core.c", "csrc/log/_rows.h",
                   "labextension/package.json", "labextension/yarn.lock", "labextension/src/index.ts",
                   "labextension/dist/package.json", "labextension/dist/static/style.js",
                   "labextension/jupyter-config/server-config/gpuviz.json"):  # fmt: skip
        assert needed in names, needed
    assert not [name for name in names if "node_modules" in name or name.endswith(".so")]


@pytest.mark.slow
def test_the_wheel_holds_the_labextension_and_the_native_modules(built: tuple[Path, Path]) -> None:
    from gpuviz.base.native import MODULES

    _, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    data = [name.split(".data/data/", 1)[1] for name in names if ".data/data/" in name]
    assert f"{SHARE}package.json" in data and f"{SHARE}install.json" in data and f"{SHARE}static/style.js" in data
    assert any(re.fullmatch(rf"{SHARE}static/remoteEntry\.\w+\.js", name) for name in data)
    assert SERVER_CONFIG in data
    assert "gpuviz/frontends/labserver.py" in names and "gpuviz/base/_native_build.json" in names
    # the licences: gpuviz's, and xxHash's (compiled into gpuviz.log._batchwriter)
    licences = sorted(name.split(".dist-info/licenses/", 1)[1] for name in names if ".dist-info/licenses/" in name)
    assert licences == ["LICENSE", "csrc/log/vendor/xxhash/LICENSE"]
    for module in MODULES:  # this machine has a C compiler: every native module is in the wheel
        path = module.name.replace(".", "/")
        assert [name for name in names if name.startswith(path + ".") and name.endswith(".so")], module.name


@pytest.fixture(scope="module")
def fresh_venv(built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with the wheel installed; its other dependencies come from
    this environment's site-packages, added as a plain path (no ``.pth`` hooks of its own run,
    so no editable install of gpuviz can leak in)."""
    _, wheel = built
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, env=clean_env(),
    ).stdout.strip()  # fmt: skip
    borrowed = [path for path in site.getsitepackages() if Path(path).is_dir()]
    Path(purelib, "borrowed-dependencies.pth").write_text("".join(f"{path}\n" for path in borrowed))
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", str(wheel)],
        capture_output=True, text=True, env=clean_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return venv


def run_in(venv: Path, *args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command of the fresh environment, away from this checkout (``python -c`` would
    import the gpuviz of its working directory)."""
    env = {**clean_env(), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd or venv, env=env)


@pytest.mark.slow
def test_the_installed_wheel_is_what_runs(fresh_venv: Path) -> None:
    script = (
        "import gpuviz, gpuviz.capture._bfcnative as core, importlib.metadata as m; "
        "print(gpuviz.__file__); print(core.__file__); print(m.distribution('gpuviz').locate_file(''))"
    )
    proc = run_in(fresh_venv, fresh_venv / "bin" / "python", "-c", script)
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.splitlines():
        assert line.startswith(str(fresh_venv)), proc.stdout  # not this checkout, not an editable install


@pytest.mark.slow
def test_gpuviz_demo_runs_from_the_wheel(fresh_venv: Path, tmp_path: Path) -> None:
    proc = run_in(fresh_venv, fresh_venv / "bin" / "gpuviz", "demo", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "report:    gpuviz-demo.html" in proc.stdout and "out-of-memory" in proc.stdout
    assert (tmp_path / "gpuviz-demo.html").stat().st_size > 0 and (tmp_path / "gpuviz-demo.arrow").is_file()
    assert "RuntimeWarning" not in proc.stderr  # every native module was built and loads


@pytest.mark.slow
def test_jupyterlab_lists_the_extension_enabled_after_one_install(fresh_venv: Path) -> None:
    python = fresh_venv / "bin" / "python"
    proc = run_in(fresh_venv, python, "-m", "jupyterlab.labextensions", "list")
    listing = proc.stdout + proc.stderr  # JupyterLab prints the list on stderr
    assert proc.returncode == 0, listing
    assert re.search(rf"{re.escape(str(fresh_venv))}/share/jupyter/labextensions", listing), listing
    assert re.search(r"gpuviz-labextension v0\.1\.0 \S*enabled\S* \S*OK\S* \(python, gpuviz\)", listing), listing
    proc = run_in(fresh_venv, python, "-m", "jupyter_server.extension.serverextension", "list")
    listing = proc.stdout + proc.stderr
    assert re.search(rf"{re.escape(str(fresh_venv))}/etc/jupyter\n\s+gpuviz \S*enabled\S*\n", listing), listing
    assert re.search(r"gpuviz 0\.1\.0 \S*OK", listing), listing


@pytest.mark.slow
def test_an_editable_install_installs_the_labextension_too(tmp_path: Path) -> None:
    """``pip install -e .`` (the README's test command) puts the extension's files in the
    environment as a wheel does: setuptools' editable installs skip data files unless asked
    through ``has_data`` (setup.py's ``Distribution``). Installed from a copy of the checkout,
    so the compiled modules in this one are left alone."""
    ignored = shutil.ignore_patterns(".git", ".venv", "node_modules", "build", "dist", "*.so", "*.egg-info",
                                     "__pycache__", "_native_build.json", ".*_cache", ".hypothesis")  # fmt: skip
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=ignored)
    shutil.copytree(ROOT / "labextension" / "dist", source / "labextension" / "dist")  # the built bundle
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = run_in(venv, python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    Path(purelib, "borrowed.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages() if Path(p).is_dir()))
    proc = run_in(venv, python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", source)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (venv / SHARE / "static" / "style.js").is_file() and (venv / SERVER_CONFIG).is_file()
    listing = run_in(venv, python, "-m", "jupyterlab.labextensions", "list")
    assert re.search(r"gpuviz-labextension v0\.1\.0 \S*enabled\S* \S*OK", listing.stdout + listing.stderr)


def test_without_node_and_without_a_built_extension_the_build_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    build = SETUP["build_labextension"]
    monkeypatch.setitem(build.__globals__, "_jlpm", lambda: None)  # as on a machine without Node.js
    with pytest.raises(RuntimeError) as error:
        build()
    assert str(error.value) == (
        "building gpuviz's JupyterLab extension needs Node.js (node on PATH) and the Python package "
        f"jupyter-builder, and no prebuilt extension exists in {ROOT / 'labextension' / 'dist'}. Install Node.js "
        ">= 20 (and pip install jupyter-builder when building without isolation), or install gpuviz from a wheel "
        "or an sdist: both carry the built extension."
    )
