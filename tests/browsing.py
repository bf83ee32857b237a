"""Helpers for the browser tests (Chromium through Playwright)."""

from __future__ import annotations

from typing import Any


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
