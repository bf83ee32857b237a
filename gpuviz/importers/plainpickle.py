"""Unpickling an untrusted file as plain data, with bounded work.

``load(stream, limit)`` runs pickle's own (pure-Python) unpickler with every global refused,
by name or by extension code (``Refused``: nothing of the pickle is run), and bounds that the C
unpickler does not have:

- **declared lengths**: a string, bytes, a frame or a long integer whose declared length
  reaches past the end of the input (``limit``: the most bytes the input can hold, i.e. the
  file's size, or a gzip file's decompression limit) is refused (``TooLong``) before anything is
  read or allocated for it; a long value is read in steps of ``STEP`` bytes, so memory follows
  the bytes that arrive, never the length declared;
- **the memo**: an index stored is at most the number of memo stores before it (the order
  every pickler gives them out in), else ``MemoIndex``; the memo is a list that grows with the
  stores, so an index like 2^30 costs nothing before it is refused;
- frames are not enforced (as neither the C unpickler nor gpuviz's C reader does), only
  checked to fit the input.

Each shared object is built once and referenced again, as pickle does; what the caller makes of
shared references is the caller's to bound. gpuviz's C reader of snapshots follows the same rules,
so the two read the same pickles.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from struct import unpack
from typing import IO, Any, ClassVar, cast

__all__ = ["load", "Refused", "TooLong", "MemoIndex", "STEP"]

STEP = 1 << 20  # bytes of a long value read at a time


class Refused(pickle.UnpicklingError):
    """The pickle names a global (a class or function); nothing of it was run."""


class TooLong(pickle.UnpicklingError):
    """A declared length reaches past the end of the input."""


class MemoIndex(pickle.UnpicklingError):
    """A memo index past the number of memo stores before it."""


_MISSING = object()  # a memo slot never stored


class _PlainUnpickler(pickle._Unpickler):
    """pickle's unpickler with globals refused and the bounds of the module docstring."""

    dispatch: ClassVar[dict[int, Callable[[Any], None]]] = dict(pickle._Unpickler.dispatch)

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        super().__init__(stream)
        self.memo: list[Any] = []
        self._stores = 0  # memo stores so far
        self._filled = 0  # memo slots stored (MEMOIZE's index, as pickle's len(memo))
        self._limit = limit
        self._tell = stream.tell

    def find_class(self, module: str, name: str) -> Any:
        raise Refused(f"{module}.{name}")

    def _room(self, n: int, what: str) -> None:
        """``TooLong`` unless ``n`` more bytes can follow the position read so far."""
        at = self._tell()
        left = self._limit - at
        if n > left:
            raise TooLong(f"{what} of {n:,} bytes declared at byte {at:,}, where at most {max(left, 0):,} bytes remain")

    def _take(self, n: int) -> bytes:
        """``n`` bytes (fewer at the end of the input), read in steps of ``STEP``."""
        read = cast(Any, self).read
        if n <= STEP:
            return read(n)  # type: ignore[no-any-return]
        parts, got = [], 0
        while got < n:
            part = read(min(STEP, n - got))
            if not part:
                break
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def _length(self, size: int, signed: bool, what: str) -> int:
        """A declared length of ``size`` bytes, checked to fit the input."""
        raw = cast(Any, self).read(size)
        if len(raw) < size:
            raise EOFError("the pickle ends inside a length")
        n = int.from_bytes(raw, "little", signed=signed)
        if n < 0:
            raise pickle.UnpicklingError(f"{what} with a negative length {n}")
        self._room(n, what)
        return n

    def _store(self, index: int) -> None:
        if index < 0 or index > self._stores:
            raise MemoIndex(
                f"memo index {index:,} stored after {self._stores:,} memo stores (a pickler numbers them in order)"
            )
        self._stores += 1
        memo: list[Any] = self.memo
        value = cast(Any, self).stack[-1]
        if index >= len(memo):
            memo.extend([_MISSING] * (index + 1 - len(memo)))
        if memo[index] is _MISSING:
            self._filled += 1
        memo[index] = value

    def _fetch(self, index: int) -> None:
        memo: list[Any] = self.memo
        value = memo[index] if 0 <= index < len(memo) else _MISSING
        if value is _MISSING:
            raise pickle.UnpicklingError(f"Memo value not found at index {index}")
        cast(Any, self).append(value)


_Handler = Callable[[Any], None]


def _on(*opcodes: bytes) -> Callable[[_Handler], _Handler]:
    def register(handler: _Handler) -> _Handler:
        for opcode in opcodes:
            _PlainUnpickler.dispatch[opcode[0]] = handler
        return handler

    return register


@_on(pickle.FRAME)
def _frame(u: Any) -> None:
    u._length(8, False, "a frame")  # read on as one stream: the frame's bytes follow


@_on(pickle.BINUNICODE)
def _binunicode(u: Any) -> None:
    u.append(str(u._take(u._length(4, False, "a string")), "utf-8", "surrogatepass"))


@_on(pickle.BINUNICODE8)
def _binunicode8(u: Any) -> None:
    u.append(str(u._take(u._length(8, False, "a string")), "utf-8", "surrogatepass"))


@_on(pickle.BINSTRING)
def _binstring(u: Any) -> None:
    u.append(u._decode_string(u._take(u._length(4, True, "a string"))))


@_on(pickle.BINBYTES)
def _binbytes(u: Any) -> None:
    u.append(u._take(u._length(4, False, "a bytes value")))


@_on(pickle.BINBYTES8)
def _binbytes8(u: Any) -> None:
    u.append(u._take(u._length(8, False, "a bytes value")))


@_on(pickle.BYTEARRAY8)
def _bytearray8(u: Any) -> None:
    n = u._length(8, False, "a bytearray")
    data = u._take(n)
    if len(data) < n:
        raise EOFError("the pickle ends inside a bytearray")
    u.append(bytearray(data))


@_on(pickle.LONG4)
def _long4(u: Any) -> None:
    u.append(int.from_bytes(u._take(u._length(4, True, "an integer")), "little", signed=True))


@_on(pickle.PUT)
def _put(u: Any) -> None:
    u._store(int(u.readline()[:-1]))


@_on(pickle.BINPUT)
def _binput(u: Any) -> None:
    u._store(u.read(1)[0])


@_on(pickle.LONG_BINPUT)
def _long_binput(u: Any) -> None:
    (index,) = unpack("<I", u.read(4))
    u._store(index)


@_on(pickle.MEMOIZE)
def _memoize(u: Any) -> None:
    u._store(u._filled)


@_on(pickle.GET)
def _get(u: Any) -> None:
    u._fetch(int(u.readline()[:-1]))


@_on(pickle.BINGET)
def _binget(u: Any) -> None:
    u._fetch(u.read(1)[0])


@_on(pickle.LONG_BINGET)
def _long_binget(u: Any) -> None:
    (index,) = unpack("<I", u.read(4))
    u._fetch(index)


def _extension(size: int) -> _Handler:
    """EXT1/EXT2/EXT4: a global by number, refused (even where copyreg's cache knows the code)."""

    def refuse(u: Any) -> None:
        raise Refused(f"with extension code {int.from_bytes(u.read(size), 'little', signed=size == 4)}")

    return refuse


for _opcode, _size in ((pickle.EXT1, 1), (pickle.EXT2, 2), (pickle.EXT4, 4)):
    _on(_opcode)(_extension(_size))


def load(stream: IO[bytes], limit: int) -> Any:
    """The object pickled in ``stream`` (which must support ``tell``), holding at most ``limit`` bytes.

    Raises ``Refused`` for a global, ``TooLong`` and ``MemoIndex`` past the bounds above, and
    what pickle raises for a broken pickle (``UnpicklingError``, ``EOFError``, ``ValueError``...).
    """
    return _PlainUnpickler(stream, limit).load()
