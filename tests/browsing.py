"""Helpers for the browser tests (Debian's Chromium through Playwright): the browser, the rule
that skips them where it is missing, and what they read from a page."""

from __future__ import annotations

import os
from collections.abc import Iterator
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
