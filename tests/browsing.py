"""Helpers for the browser tests (Debian's Chromium through Playwright): the browser, the rule
that skips them where it is missing, and what they read from a page."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM) and os.environ.get("CI"):
    raise RuntimeError(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium before the tests")
needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (apt-get install chromium)"
)
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]  # fmt: skip


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per test module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield instance
        instance.close()


def run_notebook(browser: Any, lab_server: tuple[str, str, Path], name: str, cells: list[str], *,
                 viewport: dict[str, int]) -> tuple[Any, list[str]]:  # fmt: skip
    """A notebook ``name`` of ``cells`` written into the JupyterLab server's root, opened in a new
    page of ``browser`` and every cell run from the top; the page and its uncaught errors."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    base, token, root = lab_server
    book = new_notebook(cells=[new_code_cell(source) for source in cells])  # type: ignore[no-untyped-call]
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(book, root / name)  # type: ignore[no-untyped-call]
    page = browser.new_page(viewport=viewport)
    errors = collect_errors(page, console=False)
    page.goto(f"{base}/lab/tree/{name}?reset&token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=90_000)
    page.locator(".jp-Cell").first.click()
    for _ in cells:
        page.keyboard.press("Shift+Enter")
    return page, errors


def open_offline(
    browser: Any, path: Path, *, viewport: dict[str, int], wait_until: str = "load"
) -> tuple[Any, list[str]]:
    """A new page of ``browser`` at the file ``path`` with no network; the page and its errors
    (uncaught and ``console.error``) as they come."""
    page = browser.new_page(viewport=viewport)
    errors = collect_errors(page)
    offline(page)
    page.goto(path.as_uri(), wait_until=wait_until)
    return page, errors


def drag_zoom(page: Any, selector: str) -> None:
    """Drag a zoom box with the real mouse across a tenth to a half of the plot ``selector``."""
    area = page.locator(f"{selector} .nsewdrag").first
    area.scroll_into_view_if_needed()
    box = area.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.1, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.3, y + 2, steps=5)
    page.mouse.move(box["x"] + box["width"] * 0.5, y + 2, steps=5)
    page.mouse.up()


def collect_errors(page: Any, *, console: bool = True) -> list[str]:
    """The page's uncaught errors as they come, and with ``console`` its ``console.error``
    messages too (a JupyterLab page's own console is left out: it is not gpuviz's)."""
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    if console:
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return errors


def offline(page: Any) -> None:
    """No network for ``page``: every http(s) request fails, so only what the file holds draws."""
    page.route("http*://**", lambda route: route.abort())
