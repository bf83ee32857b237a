"""The top level of a JSON document, found by a streaming scan that never decodes what it skips.

``scan(chunks)`` reads a document from an iterator of byte chunks and says what it is: for an
object, its top-level keys in order and the raw text of each small top-level value; for
anything else, its kind. Nested values are skipped with regular expressions (strings and
containers up to six levels deep are matched whole, in C), deeper nesting is followed with
a counter, never with recursion, so the scan's memory is one chunk plus what it keeps, and
its time is linear in the document's length:

    top = scan(chunks)
    top.kind           # "object", "array", "string", "number", "literal" or "" (not JSON)
    top.keys           # ["metadata", "traceEvents", "schemaVersion", ...]
    top.value("schemaVersion")   # a captured small value, decoded (None when not captured)

Limits (each stops the scan with ``problem`` set, keeping what was found before it): a key of
at most ``MAX_KEY_BYTES``; at most ``MAX_KEYS`` keys; nesting at most ``MAX_DEPTH`` levels;
at most ``max_bytes`` of document (decompressed) scanned. Values of at most
``MAX_VALUE_BYTES`` are kept as raw text, ``MAX_CAPTURED_BYTES`` in all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JsonTop", "scan", "MAX_SCAN_BYTES", "MAX_DEPTH", "MAX_KEYS", "MAX_KEY_BYTES"]

MAX_SCAN_BYTES = 1 << 33  # 8 GiB of document scanned at most
MAX_DEPTH = 10_000  # levels of nesting
MAX_KEYS = 10_000  # top-level keys
MAX_KEY_BYTES = 4096  # bytes of one key, as written
MAX_VALUE_BYTES = 1 << 16  # a top-level value kept as raw text when at most this long
MAX_CAPTURED_BYTES = 1 << 20  # raw text kept in all

# Every pattern is an "unrolled loop": runs of plain bytes between strings and containers, whose
# pieces start with different bytes, so a failed match backtracks in time linear in what it read
# (Python 3.10 has no possessive quantifiers).
_PLAIN = rb'[^"\[\]{}]*'
_STR = rb'"[^"\\]*(?:\\.[^"\\]*)*"'


def _container(levels: int) -> bytes:
    inner = _STR if levels == 1 else rb"(?:" + _STR + rb"|" + _container(levels - 1) + rb")"
    return rb"[\[{]" + _PLAIN + rb"(?:" + inner + _PLAIN + rb")*[\]}]"


_CONTAINER = _container(6)
_STRING = re.compile(_STR, re.S)
_WHOLE = re.compile(_CONTAINER, re.S)  # a container nested at most 6 levels, whole
_SKIP = re.compile(_PLAIN + rb"(?:(?:" + _STR + rb"|" + _CONTAINER + rb")" + _PLAIN + rb")*", re.S)
_STRING_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # the rest of a string, its closing quote
_STRING_PART = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.S)  # the rest of a string that goes on
_SPACE = re.compile(rb"[ \t\n\r]*")
_SCALAR = re.compile(rb'[^,}\]\[{" \t\n\r]*')
_LITERALS = (b"true", b"false", b"null")

# states of the scan of a top-level object
_KEY_OR_END, _KEY, _COLON, _VALUE, _SCALAR_VALUE, _NESTED, _IN_STRING, _AFTER, _DONE = range(9)


@dataclass
class JsonTop:
    """What a JSON document is at its top level (see the module docstring)."""

    kind: str = ""
    keys: list[str] = field(default_factory=list)
    raw: dict[str, bytes] = field(default_factory=dict)  # small top-level values, as written
    complete: bool = False  # scanned to the end of the top-level value
    problem: str | None = None  # why the scan stopped before the end, if it did
    scanned: int = 0  # bytes of document read

    def value(self, key: str) -> Any:
        """The decoded value of ``key`` when it was captured (small), else None."""
        text = self.raw.get(key)
        if text is None:
            return None
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            return None

    def describe(self) -> str:
        """A few words on what the document is, e.g. "a JSON object with top-level keys a, b"."""
        if self.kind == "object":
            if not self.keys:
                text = "an empty JSON object" if self.complete else "a JSON object"
            else:
                shown = ", ".join(repr(key)[1:-1] for key in self.keys[:12])
                more = f" and {len(self.keys) - 12} more" if len(self.keys) > 12 else ""
                text = f"a JSON object with top-level keys {shown}{more}"
            if self.problem:
                text += f" ({self.problem})"
            return text
        if self.kind:
            return f"a JSON {self.kind}"
        return "not JSON" + (f" ({self.problem})" if self.problem else "")


def scan(chunks: Iterable[bytes], *, max_bytes: int = MAX_SCAN_BYTES) -> JsonTop:
    """Scan the document made of ``chunks`` (see the module docstring). What the chunks raise
    (a truncated gzip stream, an OS error) passes through."""
    return _Scanner(iter(chunks), max_bytes).run()


class _Scanner:
    def __init__(self, chunks: Iterator[bytes], max_bytes: int) -> None:
        self.chunks = chunks
        self.max_bytes = max_bytes
        self.buf = b""
        self.pos = 0
        self.dropped = 0  # bytes before the buffer
        self.eof = False
        self.top = JsonTop()
        # capture of the current top-level value
        self.key = ""
        self.capturing = False
        self.capture_from = 0
        self.parts: list[bytes] = []
        self.part_bytes = 0
        self.captured = 0
        self.depth = 1
        self.after_string = _AFTER

    def more(self) -> bool:
        """Read the next chunk, keeping what is not consumed; False at the end or at the byte limit."""
        if self.capturing:
            part = self.buf[self.capture_from : self.pos]
            self.parts.append(part)
            self.part_bytes += len(part)
            self.capture_from = 0
            if self.part_bytes > MAX_VALUE_BYTES:
                self.capturing = False
                self.parts = []
        for chunk in self.chunks:
            if not chunk:
                continue
            self.dropped += self.pos
            self.buf = self.buf[self.pos :] + chunk
            self.pos = 0
            self.top.scanned += len(chunk)
            if self.top.scanned > self.max_bytes:
                self.top.problem = f"not scanned past its first {self.max_bytes} bytes"
                return False
            return True
        self.eof = True
        return False

    def space(self) -> str:
        """Skip white space; the next byte as a character ('' at the end)."""
        while True:
            self.pos = _SPACE.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return chr(self.buf[self.pos])
            if not self.more():
                return ""

    def fail(self, what: str) -> JsonTop:
        if self.top.problem is None:
            self.top.problem = f"{what} at byte {self.dropped + self.pos}"
        return self.top

    def run(self) -> JsonTop:
        if not self.more():
            return self.top
        if self.buf.startswith(b"\xef\xbb\xbf"):
            self.pos = 3
        first = self.space()
        kinds = {"{": "object", "[": "array", '"': "string"}
        if first in kinds:
            self.top.kind = kinds[first]
        elif first and (first in "-0123456789"):
            self.top.kind = "number"
        elif first and any(self.buf.startswith(literal, self.pos) for literal in _LITERALS):
            self.top.kind = "literal"
        if self.top.kind != "object":
            return self.top
        self.pos += 1
        return self.members()

    def begin_value(self) -> None:
        self.capturing = self.captured < MAX_CAPTURED_BYTES
        self.capture_from = self.pos
        self.parts = []
        self.part_bytes = 0

    def end_value(self) -> None:
        if self.capturing:
            self.parts.append(self.buf[self.capture_from : self.pos])
            text = b"".join(self.parts)
            if len(text) <= MAX_VALUE_BYTES:
                self.top.raw[self.key] = text
                self.captured += len(text)
        self.capturing = False
        self.parts = []

    def members(self) -> JsonTop:  # one state machine
        state = _KEY_OR_END
        top = self.top
        while True:
            if state in (_KEY_OR_END, _KEY):
                found = self.space()
                if found == "}" and state == _KEY_OR_END:
                    self.pos += 1
                    top.complete = True
                    return top
                if found != '"':
                    return self.fail("a key (a string) expected" if found else "cut short")
                match = _STRING.match(self.buf, self.pos)
                while match is None:  # the key goes on in the next chunk
                    if len(self.buf) - self.pos > MAX_KEY_BYTES:
                        return self.fail(f"a key longer than {MAX_KEY_BYTES} bytes")
                    if not self.more():
                        return self.fail("cut short in a key")
                    match = _STRING.match(self.buf, self.pos)
                try:
                    key = json.loads(match.group())
                except ValueError:
                    key = match.group()[1:-1].decode("utf-8", errors="replace")
                self.pos = match.end()
                if len(top.keys) >= MAX_KEYS:
                    return self.fail(f"more than {MAX_KEYS} keys")
                top.keys.append(key)
                self.key = key
                state = _COLON
            elif state == _COLON:
                if self.space() != ":":
                    return self.fail("':' expected")
                self.pos += 1
                state = _VALUE
            elif state == _VALUE:
                found = self.space()
                self.begin_value()
                if found == '"':
                    match = _STRING.match(self.buf, self.pos)
                    if match is not None:
                        self.pos = match.end()
                        state = _AFTER
                    else:
                        self.pos += 1
                        self.after_string = _AFTER
                        state = _IN_STRING
                elif found in ("[", "{"):
                    match = _WHOLE.match(self.buf, self.pos)
                    if match is not None:
                        self.pos = match.end()
                        state = _AFTER
                    else:
                        self.pos += 1
                        self.depth = 2
                        state = _NESTED
                elif found and found not in ",}]:":
                    state = _SCALAR_VALUE
                else:
                    return self.fail("a value expected" if found else "cut short")
                if state == _AFTER:
                    self.end_value()
            elif state == _SCALAR_VALUE:
                self.pos = _SCALAR.match(self.buf, self.pos).end()  # type: ignore[union-attr]
                if self.pos == len(self.buf) and self.more():
                    continue
                self.end_value()
                state = _AFTER
            elif state == _NESTED:
                self.pos = _SKIP.match(self.buf, self.pos).end()  # type: ignore[union-attr]
                if self.pos == len(self.buf):
                    if not self.more():
                        return self.fail("cut short")
                    continue
                found = chr(self.buf[self.pos])
                self.pos += 1
                if found == '"':
                    self.after_string = _NESTED
                    state = _IN_STRING
                elif found in "[{":
                    self.depth += 1
                    if self.depth > MAX_DEPTH:
                        return self.fail(f"nested more than {MAX_DEPTH} levels deep")
                else:
                    self.depth -= 1
                    if self.depth == 1:
                        self.end_value()
                        state = _AFTER
            elif state == _IN_STRING:
                match = _STRING_REST.match(self.buf, self.pos)
                if match is None:
                    self.pos = _STRING_PART.match(self.buf, self.pos).end()  # type: ignore[union-attr]
                    if not self.more():  # keeps a lone trailing backslash for the next chunk
                        return self.fail("cut short in a string")
                    continue
                self.pos = match.end()
                state = self.after_string
                if state == _AFTER:
                    self.end_value()
            elif state == _AFTER:
                found = self.space()
                if found == ",":
                    self.pos += 1
                    state = _KEY
                elif found == "}":
                    self.pos += 1
                    top.complete = True
                    return top
                else:
                    return self.fail("',' or '}' expected" if found else "cut short")
