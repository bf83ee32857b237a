"""The documentation: the site builds with warnings as errors, every code block of the README
and of docs/ runs as written (the convention is in tests/docblocks.py), and the README keeps
the shape users rely on (its two commands first, short, a screenshot at the top)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from docblocks import RUN_LANGUAGES, SHOWN_LANGUAGES, Block, blocks, missing_frameworks

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
README_COMMANDS = [
    "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/gpuviz demo",
    "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest",
]
# pages whose blocks take more than a few seconds (they run the demo, replays, several processes)
SLOW_PAGES = {
    "README.md",
    "docs/install.md",
    "docs/distributed.md",
    "docs/whatif.md",
    "docs/guide/notebook.md",
    "docs/guide/reports-cli.md",
    "docs/guide/views.md",
    "docs/formats/pytorch-memory-timeline.md",
    "docs/formats/pytorch-profiler.md",
    "docs/formats/pytorch-snapshot.md",
    "docs/formats/xplane.md",
}


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _page_params() -> list[object]:
    """The pages with a runnable block (others only show code)."""
    return [
        pytest.param(page, id=_name(page), marks=[pytest.mark.slow] if _name(page) in SLOW_PAGES else [])
        for page in PAGES
        if any(b.runs for b in blocks(page, _name(page)))
    ]


def _all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page, _name(page))]


def test_every_block_is_run_or_says_why_not() -> None:
    """A block is run (python, ipython, bash), shown (text, mermaid), or marked not-run with a reason."""
    found = _all_blocks()
    assert len([b for b in found if b.runs]) >= 30  # the pages teach by running code
    for block in found:
        if block.not_run is not None:
            assert block.not_run, f"{block.where}: a not-run marker needs a reason: <!-- not-run: REASON -->"
        else:
            assert block.language in RUN_LANGUAGES + SHOWN_LANGUAGES, (
                f"{block.where}: fence it as one of {RUN_LANGUAGES + SHOWN_LANGUAGES}, "
                "or mark it <!-- not-run: REASON -->"
            )
        if block.language == "bash" and block.runs:
            prompts = [line for line in block.code.splitlines() if line.startswith("$ ")]
            assert not prompts, f"{block.where}: bash blocks hold commands, not prompts: {prompts[0]!r}"


@pytest.mark.parametrize("page", _page_params())
def test_code_blocks_run_as_written(page: Path, tmp_path: Path) -> None:
    """Every runnable block of the page runs, in order, in a fresh folder and a fresh process."""
    page_blocks = [b for b in blocks(page, _name(page)) if b.runs]
    if missing_frameworks(page_blocks[0]):
        pytest.skip(f"{_name(page)}: {', '.join(missing_frameworks(page_blocks[0]))} is not installed")
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # gpuviz and python of this environment
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PLOTLY_RENDERER"] = "json"  # a figure shown in a cell never opens a browser
    env.pop("GPUVIZ_LOG_DIR", None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "docblocks.py"), str(page), _name(page)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard, not a speed bound
    )
    assert proc.returncode == 0, f"{_name(page)}: a block failed\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("skipped: ")]
    if skipped:  # the blocks before them ran and passed
        warnings.warn("\n".join(skipped), stacklevel=1)


@pytest.mark.slow
def test_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    mkdocs = BIN / "mkdocs"
    if not mkdocs.exists():
        found = shutil.which("mkdocs")
        if found is None:
            pytest.fail("mkdocs is not installed; install the project with its [test] extra")
        mkdocs = Path(found)
    proc = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = tmp_path / "site"
    assert (site / "index.html").is_file()
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("gpuviz.load", "gpuviz.EventLog", "gpuviz.BFCAllocator", "gpuviz.whatif"):
        assert name in api, f"the API reference has no entry for {name}"


def test_the_readme_opens_with_the_two_commands_and_stays_short() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the details belong in docs/"
    first = [b for b in blocks(ROOT / "README.md", "README.md")][:2]
    assert [b.code.strip() for b in first] == README_COMMANDS
    assert all(b.language == "bash" for b in first)
    image = re.search(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert image is not None and image.start() < text.index("```"), "a screenshot comes before the commands"
    assert (ROOT / image.group(1)).is_file()


def test_docs_speak_of_the_product_only() -> None:
    """No narration of how the code was made: sessions, people, issue numbers."""
    diary = re.compile(r"\b(\w+th session|this session|the lead|issues? #?\d+)\b", re.I)
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            found = diary.search(line)
            assert found is None, f"{_name(page)}:{number}: {found.group()!r} in {line.strip()!r}"


def test_the_runner_names_the_failing_block_and_skips_marked_ones(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n```python\nvalue = 41\n```\n\n"
        "<!-- not-run: shows a failure -->\n```python\nraise SystemExit(3)\n```\n\n"
        "```text\nnot code\n```\n\n```python\nassert value == 42, 'off by one'\n```\n",
        encoding="utf-8",
    )
    found = blocks(page, "page.md")
    assert [(b.line, b.language, b.not_run, b.runs) for b in found] == [
        (3, "python", None, True),
        (8, "python", "shows a failure", False),
        (12, "text", None, False),
        (16, "python", None, True),
    ]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "docblocks.py"), str(page), "page.md"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert "ok: page.md:3 (python)" in proc.stdout
    assert "FAILED: the block at page.md:16 (python)" in proc.stdout
    assert 'File "page.md", line 17' in proc.stderr and "off by one" in proc.stderr


def test_a_block_needing_a_missing_framework_is_skipped_with_the_rest_of_its_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    import docblocks

    page = tmp_path / "page.md"
    page.write_text(
        "```python\nfirst = 1\n```\n\n```python\nimport jax\n```\n\n```python\nraise AssertionError('ran')\n```\n",
        encoding="utf-8",
    )
    real = importlib.util.find_spec
    monkeypatch.setattr(docblocks.importlib.util, "find_spec", lambda name, *a: None if name == "jax" else real(name))
    assert docblocks.run_page(page, "page.md") == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "ok: page.md:1 (python)",
        "skipped: page.md:5 (python): JAX is not installed (the block at page.md:5 (python) needs it)",
        "skipped: page.md:9 (python): JAX is not installed (the block at page.md:5 (python) needs it)",
    ]
