"""A progress sink for the import tests (gpuviz.importers.source.Progress)."""

from __future__ import annotations


class ProgressCounter:
    """Keeps every ``update``'s bytes in ``seen``."""

    def __init__(self, seen: list[int]) -> None:
        self.seen = seen

    def update(self, n: int) -> None:
        self.seen.append(n)

    def close(self) -> None:
        pass
