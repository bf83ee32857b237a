"""The code blocks of the README and the documentation pages, and a runner for one page.

The convention every page follows (tests/test_docs.py holds them to it):

* a ```python block runs as written, in order with the page's other ```python blocks, in one
  namespace per page; the working directory is a fresh temporary folder;
* a ```ipython block is a notebook cell (magics allowed), run in order in one IPython
  ``InteractiveShell`` per page;
* a ```bash block runs with ``bash -e -o pipefail`` in the same folder, with the ``gpuviz``
  command on ``PATH``; its lines are commands (no ``$`` prompts);
* a ```text or ```mermaid block is never run, and neither is a block preceded by the line
  ``<!-- not-run: REASON -->`` (the reason is required);
* a block that imports PyTorch, TensorFlow or JAX where that framework is not installed is
  skipped with that reason, together with the page's blocks after it.

Run one page by hand from a scratch folder::

    cd "$(mktemp -d)" && python /path/to/gpuviz/tests/docblocks.py /path/to/gpuviz/docs/whatif.md
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

RUN_LANGUAGES = ("python", "ipython", "bash")
SHOWN_LANGUAGES = ("text", "mermaid")
NOT_RUN = re.compile(r"^<!--\s*not-run:(.*?)-->\s*$")
FRAMEWORKS = {"torch": "PyTorch", "tensorflow": "TensorFlow", "jax": "JAX"}
_IMPORTS = re.compile(r"^\s*(?:import|from)\s+(torch|tensorflow|jax)\b", re.M)


@dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown page."""

    page: str  # the page's path as given
    line: int  # line of the opening fence, 1-based
    language: str  # the fence's info string, first word ("" when none)
    code: str
    not_run: str | None  # the reason of a ``<!-- not-run: REASON -->`` line just before it, else None

    @property
    def runs(self) -> bool:
        return self.not_run is None and self.language in RUN_LANGUAGES

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line} ({self.language or 'no language'})"

    def frameworks(self) -> list[str]:
        """The deep-learning frameworks (``torch``, ``tensorflow``, ``jax``) the block imports."""
        return sorted(set(_IMPORTS.findall(self.code)))


def blocks(path: Path, name: str | None = None) -> list[Block]:
    """Every fenced block of the Markdown file ``path`` (fences at the start of a line)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.startswith("```"):
            index += 1
            continue
        fence = re.match(r"`{3,}", line)
        assert fence is not None
        language = line[fence.end() :].strip().split(" ")[0]
        end = index + 1
        while end < len(lines) and not lines[end].startswith(fence.group()):
            end += 1
        if end == len(lines):
            raise ValueError(f"{name or path}:{index + 1}: the code block is never closed")
        before = index - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = NOT_RUN.match(lines[before]) if before >= 0 else None
        found.append(
            Block(
                page=name or str(path),
                line=index + 1,
                language=language,
                code="\n".join(lines[index + 1 : end]) + "\n",
                not_run=marker.group(1).strip() if marker else None,
            )
        )
        index = end + 1
    return found


def _run_python(block: Block, namespace: dict[str, object]) -> None:
    # padded so that a traceback's line numbers are the page's own
    source = "\n" * block.line + block.code
    exec(compile(source, block.page, "exec"), namespace)


def _run_ipython(block: Block) -> None:
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    with capture_output() as captured:
        result = shell.run_cell(block.code, store_history=True)
    if not result.success:
        print(captured.stdout, captured.stderr, sep="\n")
        error = result.error_in_exec or result.error_before_exec
        raise AssertionError(f"the cell failed: {type(error).__name__}: {error}")


def _run_bash(block: Block) -> None:
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
        raise AssertionError(f"bash exited with status {proc.returncode}")


def missing_frameworks(block: Block) -> list[str]:
    """The frameworks the block imports that are not installed here, by their names (``PyTorch``)."""
    return [FRAMEWORKS[f] for f in block.frameworks() if importlib.util.find_spec(f) is None]


def run_page(path: Path, name: str | None = None) -> int:
    """Runs every runnable block of the page in order; 0 when all pass, else 1 (the failing block named).

    A block that imports a framework that is not installed is skipped, and so is every block
    after it on the page (they may use what it made); each skip is printed as ``skipped: ...``.
    """
    namespace: dict[str, object] = {"__name__": "__docs__"}
    skipping: str | None = None
    for block in blocks(path, name):
        if not block.runs:
            continue
        missing = missing_frameworks(block)
        if missing and skipping is None:
            skipping = f"{', '.join(missing)} is not installed (the block at {block.where} needs it)"
        if skipping is not None:
            print(f"skipped: {block.where}: {skipping}", flush=True)
            continue
        try:
            if block.language == "python":
                _run_python(block, namespace)
            elif block.language == "ipython":
                _run_ipython(block)
            else:
                _run_bash(block)
        except BaseException:
            traceback.print_exc()
            print(f"FAILED: the block at {block.where}", flush=True)
            return 1
        print(f"ok: {block.where}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_page(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None))
