"""The lines of a text file that remember how it ended: a text importer flags a file that ends
inside a line (cut short by a crash or a copy) or whose compressed stream ends early."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from typing import IO

__all__ = ["TextLines"]


class TextLines:
    """Iterate the lines of ``text``; ``count`` is the lines read so far; afterwards ``complete``
    says whether the last line ended with a newline and ``cut`` holds why a compressed stream
    ended early (else None)."""

    def __init__(self, text: IO[str]) -> None:
        self.text = text
        self.complete = True
        self.cut: str | None = None
        self.count = 0

    def __iter__(self) -> Iterator[str]:
        try:
            for line in self.text:
                self.complete = line.endswith(("\n", "\r"))
                self.count += 1
                yield line
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            self.cut = str(exc)
