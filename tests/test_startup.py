"""A light import: ``import gpuviz``, ``import gpuviz.capture`` and ``gpuviz --help`` load no
plotting or notebook library; they load when a view is asked for. (Timings: benchmarks/bench_startup.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gpuviz

HEAVY = ("plotly", "pandas", "ipywidgets", "anywidget", "IPython")


def loaded_after(code: str) -> list[str]:
    """The heavy modules in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    script = (
        textwrap.dedent(code) + f"\nimport sys, json; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    loaded: list[str] = json.loads(proc.stdout.splitlines()[-1])
    return loaded


@pytest.mark.parametrize(
    "code",
    [
        "import gpuviz",
        "import gpuviz.capture",
        "import gpuviz; gpuviz.BFCAllocator, gpuviz.EventLog, gpuviz.SimUpstream, gpuviz.mark",
        # recording to a file, the way a training rank does
        """
        import os, tempfile, gpuviz
        log = gpuviz.EventLog(os.path.join(tempfile.mkdtemp(), "run.arrow"))
        alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), log=log)
        with gpuviz.span("step"):
            alloc.free(alloc.allocate(1 << 20, tag="weights"))
        log.close()
        """,
        """
        from gpuviz.frontends.cli import main
        try:
            main(["--help"])
        except SystemExit:
            pass
        """,
    ],
    ids=["import gpuviz", "import gpuviz.capture", "public names", "recording", "gpuviz --help"],
)
def test_no_plotting_or_notebook_library_is_loaded(code: str) -> None:
    assert loaded_after(code) == []


def test_the_views_load_when_asked_for() -> None:
    code = """
        import gpuviz
        log = gpuviz.EventLog()
        gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), log=log).allocate(1000)
        bundle = log._repr_mimebundle_()
        assert set(bundle) == {"application/vnd.gpuviz.v1+json", "text/html", "text/plain"}, set(bundle)
    """
    assert set(loaded_after(code)) >= {"plotly", "pandas"}


def test_every_public_name_still_works() -> None:
    for name in gpuviz.__all__:
        assert getattr(gpuviz, name) is not None, name
    for name in ("HeapState", "SIM_BASE", "UpstreamOutOfMemory", "ChunkState", "Run", "resample"):  # compatibility
        assert getattr(gpuviz, name) is not None and name not in gpuviz.__all__
    assert set(gpuviz.__all__) <= set(dir(gpuviz))
    from gpuviz.scenarios.whatif import whatif

    assert gpuviz.whatif is whatif and callable(gpuviz.load_ipython_extension)
    with pytest.raises(AttributeError, match="module 'gpuviz' has no attribute 'nothing'"):
        _ = gpuviz.nothing  # type: ignore[attr-defined]


def test_the_help_lists_every_policy() -> None:
    from gpuviz.frontends.whatif_options import DEFAULT_POLICIES
    from gpuviz.scenarios.policies import POLICY_NAMES

    assert DEFAULT_POLICIES == POLICY_NAMES  # the --policy help names them without importing the policies


def test_load_ext_registers_the_magics() -> None:
    code = """
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "gpuviz")
        assert "gpuviz" in shell.magics_manager.magics["line"] and "gpuviz" in shell.magics_manager.magics["cell"]
    """
    assert "IPython" in loaded_after(code)


def test_gpuviz_report_writes_the_report_and_checks_its_folder_first(tmp_path: Path) -> None:
    import gpuviz

    log = gpuviz.EventLog()
    alloc = gpuviz.BFCAllocator(gpuviz.SimUpstream("1GiB"), log=log)
    alloc.allocate(4096)
    written = gpuviz.report(log, tmp_path / "run.html", advise=False)
    assert written == tmp_path / "run.html" and written.read_text().startswith("<!DOCTYPE html>")
    assert "report" in gpuviz.__all__
    with pytest.raises(OSError, match=r"missing/run\.html: the folder .*missing does not exist"):
        gpuviz.report(log, tmp_path / "missing" / "run.html")
