"""A JSON document read as a stream: objects key by key, arrays element by element, each
scalar or small value decoded whole (``json.JSONDecoder.raw_decode``) from a sliding buffer
of text, so the memory a reader needs is that of one value, not of the document.

    stream = JsonStream(chunks)              # chunks: an iterator of str (e.g. 64 KiB each)
    for key in stream.items():               # the top object: each key, then its value is read
        if key == "big":
            for _ in stream.elements():      # an array: each element, then it is read
                use(stream.value())
        else:
            stream.skip()

A document cut short, or not JSON, raises ``json.JSONDecodeError`` (a ``ValueError``) naming
the position in the document; what the chunks raise (a truncated gzip stream) passes through.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

__all__ = ["JsonStream"]

_SPACE = re.compile(r"[ \t\n\r]*")
_LOOKAHEAD = 32  # characters past a decoded value that must be read (a number cut by a chunk boundary)
_DECODER = json.JSONDecoder()
_SKIP_DEPTH = 1  # levels ``skip`` walks (a big array: element by element); deeper values are decoded whole
MAX_VALUE = 1 << 26
"""The most characters one value decoded whole may span (64 Mi): a longer string or member is
refused, so memory stays a small multiple of this whatever the file holds."""


class JsonStream:
    """Reads one JSON document from ``chunks`` (see the module docstring)."""

    def __init__(self, chunks: Iterator[str]) -> None:
        self._chunks = chunks
        self._buffer = ""
        self._pos = 0  # in the buffer
        self._dropped = 0  # characters before the buffer
        self._eof = False

    def _more(self, at_least: int = 1) -> bool:
        """Read more chunks, ``at_least`` characters of them where the document has them
        (dropping what was consumed); False at the end of the document."""
        pieces: list[str] = []
        read = 0
        for chunk in self._chunks:
            if chunk:
                pieces.append(chunk)
                read += len(chunk)
                if read >= at_least:
                    break
        if not pieces:
            self._eof = True
            return False
        self._dropped += self._pos
        self._buffer = self._buffer[self._pos :] + "".join(pieces)
        self._pos = 0
        return True

    def _error(self, message: str, pos: int | None = None) -> json.JSONDecodeError:
        at = self._dropped + (self._pos if pos is None else pos)
        error = json.JSONDecodeError(message, "", 0)
        error.pos = at
        error.args = (f"{message}: character {at} of the document",)
        return error

    def peek(self) -> str:
        """The next character that is not white space (not consumed); '' at the end."""
        while True:
            self._pos = _SPACE.match(self._buffer, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._buffer):
                return self._buffer[self._pos]
            if not self._more():
                return ""

    def _expect(self, char: str) -> None:
        found = self.peek()
        if found != char:
            raise self._error(f"expecting {char!r}, found {found!r}" if found else f"expecting {char!r}: the end")
        self._pos += 1

    def value(self) -> Any:
        """The next value, decoded whole."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self._buffer, self._pos)
            except json.JSONDecodeError as exc:
                incomplete = exc.pos >= len(self._buffer) - _LOOKAHEAD or exc.msg.startswith("Unterminated")
                spanned = len(self._buffer) - self._pos
                if incomplete and spanned > MAX_VALUE:
                    raise self._error(f"a value longer than {MAX_VALUE:,} characters") from None
                # read as much again as the value spans so far: each retry decodes the value
                # from its start, so doubling keeps the work linear in its length
                if incomplete and self._more(spanned):
                    continue
                raise self._error(exc.msg, exc.pos) from None
            except RecursionError:
                raise self._error("nested too deeply") from None
            if end + _LOOKAHEAD > len(self._buffer) and not self._eof and self._more():
                continue  # a number or literal may go on in the next chunk: decode it again
            if end - self._pos > MAX_VALUE:
                raise self._error(f"a value longer than {MAX_VALUE:,} characters")
            self._pos = end
            return value

    def items(self) -> Iterator[str]:
        """The keys of the next value, an object; after each, the caller reads (or skips) its value."""
        for _ in self._members("{", "}", "an object's value"):
            key = self.value()
            if not isinstance(key, str):
                raise self._error("expecting an object key (a string)")
            self._expect(":")
            yield key

    def elements(self) -> Iterator[None]:
        """Once per element of the next value, an array; the caller reads (or skips) each element."""
        yield from self._members("[", "]", "an array's element")

    def _members(self, open_: str, close: str, what: str) -> Iterator[None]:
        """Once per member of the container opened by ``open_``, past the ',' or ``close`` after it."""
        self._expect(open_)
        if self.peek() == close:
            self._pos += 1
            return
        while True:
            yield None
            found = self.peek()
            self._pos += 1
            if found == close:
                return
            if found != ",":
                raise self._error(f"expecting ',' or {close!r} after {what}, found {found!r}", self._pos - 1)

    def skip(self, _depth: int = 0) -> None:
        """Read past the next value: an array element by element, an object value by value
        (each of its members decoded whole: C speed, the memory of one member)."""
        first = self.peek()
        if first == "[" and _depth < _SKIP_DEPTH:
            for _ in self.elements():
                self.skip(_depth + 1)
        elif first == "{" and _depth < _SKIP_DEPTH:
            for _ in self.items():
                self.skip(_depth + 1)
        else:
            self.value()

    def end(self) -> None:
        """Check that nothing but white space follows the document."""
        found = self.peek()
        if found:
            raise self._error(f"extra data after the document: {found!r}")
