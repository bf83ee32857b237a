"""The string table of an EventLog, compact: one UTF-8 buffer, end offsets and a hash index.

A ``str`` object costs ~50 bytes over its text and a dict entry ~50 more, so a log of
many distinct tags (an imported trace names every tensor) held them at ~150 bytes each;
here a string costs its UTF-8 bytes plus ~28 (8 offset, 8 hash, 4 x 2-4 index slots).
Strings are decoded when read (``table[i]``); the strings found by a lookup map to their index
in the dict ``recent`` (up to ``_RECENT``, then emptied), so a recorder that repeats its tags
probes the index once per tag.

``StringTable`` reads as a ``Sequence[str]`` (indices, slices -> list, iteration, ``len``,
``==`` with another table or a list, ``in``, ``index``); ``append`` always adds (a file's table
may repeat a string: positions are kept, lookups find the first), ``intern`` adds only what is
new. Not thread-safe: the log serialises additions and the lookups that miss ``recent``.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

__all__ = ["StringTable"]

_EMPTY = -1
_RECENT = 1 << 12  # strings whose index is kept in a dict (the dict is emptied when full)


class StringTable(Sequence[str]):
    """Strings by index (see the module docstring); ``nbytes``: its memory in bytes."""

    def __init__(self, texts: Iterable[str] = ()) -> None:
        self._data = bytearray()  # the strings' UTF-8 bytes, one after another
        self._offsets = array("q", [0])  # string i is _data[_offsets[i]:_offsets[i + 1]]
        self._hashes = array("q")  # hash() of each string
        self._slots = array("i", [_EMPTY]) * 8  # open addressing (linear probing): a string index or _EMPTY
        self.recent: dict[str, int] = {}  # string -> index of those looked up lately (read it, never write it)
        for text in texts:
            self.append(text)

    # ------------------------------------------------------------------ lookups
    def find(self, text: str) -> int:
        """The index of the first ``text`` in the table, or -1."""
        index = self.recent.get(text)
        if index is None:
            index = self._probe(text, hash(text))[1]
            if index != _EMPTY:
                self._remember(index)
        return index

    def intern(self, text: str) -> int:
        """The index of ``text``, added at the end if the table does not hold it."""
        index = self.recent.get(text)
        if index is not None:
            return index
        h = hash(text)
        slot = h & (len(self._slots) - 1)
        if self._slots[slot] != _EMPTY:  # else new at once (most new strings, the index being half empty)
            slot, index = self._probe(text, h)
            if index != _EMPTY:
                self._remember(index)  # found by a probe: remembered (a new string is not)
                return index
        return self._add(text, h, slot)

    def append(self, text: str) -> None:
        """Add ``text`` at the end, even if the table holds it (lookups keep finding the first)."""
        if not isinstance(text, str):
            raise TypeError(f"a string table holds str, not {type(text).__name__}")
        h = hash(text)
        slot, index = self._probe(text, h)
        self._add(text, h, slot if index == _EMPTY else _EMPTY)

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        if isinstance(value, str) and start == 0 and stop is None:
            index = self.find(value)
            if index != _EMPTY:
                return index
        elif isinstance(value, str):
            return super().index(value, start, len(self) if stop is None else stop)
        raise ValueError(f"{value!r} is not in the string table")

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and self.find(value) != _EMPTY

    def _probe(self, text: str, h: int) -> tuple[int, int]:
        """``(slot, index)``: the slot holding ``text``'s first index, or the empty slot where it goes
        with index ``_EMPTY``."""
        slots, hashes, offsets, data = self._slots, self._hashes, self._offsets, self._data
        mask = len(slots) - 1
        slot = h & mask
        encoded: bytes | None = None
        while True:
            index = slots[slot]
            if index == _EMPTY:
                return slot, _EMPTY
            if hashes[index] == h:
                if encoded is None:
                    encoded = text.encode("utf-8", "surrogatepass")
                if data[offsets[index] : offsets[index + 1]] == encoded:
                    return slot, index
            slot = (slot + 1) & mask

    def _add(self, text: str, h: int, slot: int) -> int:
        """Append ``text`` (hash ``h``) and index it at ``slot`` unless that is ``_EMPTY``."""
        index = len(self._hashes)
        data = self._data
        data += text.encode("utf-8", "surrogatepass")
        self._offsets.append(len(data))
        self._hashes.append(h)
        if slot != _EMPTY:
            slots = self._slots
            slots[slot] = index
            if 2 * index + 2 > len(slots):  # keep the index at most half full
                self._grow()
        return index

    def _grow(self) -> None:
        """Twice the slots, the indexed strings placed again. In NumPy: taken in order of their home
        slot, each goes to its home or just past the one before, whichever is later (what inserting
        them one by one in that order gives); those pushed past the last slot wrap around, one by one."""
        old = np.frombuffer(self._slots, dtype=np.int32)
        indexed = old[old != _EMPTY]
        slots = np.full(2 * len(old), _EMPTY, dtype=np.int32)
        mask = len(slots) - 1
        home = np.frombuffer(self._hashes, dtype=np.int64)[indexed] & mask
        order = np.argsort(home, kind="stable")
        indexed, home = indexed[order], home[order]
        rank = np.arange(len(home))
        place = rank + np.maximum.accumulate(home - rank)
        inside = place <= mask
        slots[place[inside]] = indexed[inside]
        for index in indexed[~inside].tolist():
            slot = 0
            while slots[slot] != _EMPTY:
                slot += 1
            slots[slot] = index
        self._slots = array("i", slots.tobytes())

    def _remember(self, index: int) -> None:
        """Keep string ``index`` in the recent dict, as a str of its own (the table never keeps a
        caller's str alive)."""
        if len(self.recent) >= _RECENT:
            self.recent.clear()
        self.recent[self[index]] = index

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        offsets = self._offsets
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(offsets) - 1))]
        position = index + len(offsets) - 1 if index < 0 else index
        if not 0 <= position < len(offsets) - 1:
            raise IndexError(f"string {index} of a table of {len(offsets) - 1}")
        raw = self._data[offsets[position] : offsets[position + 1]]
        try:
            return raw.decode()  # strict is the fast path; lone surrogates are rare
        except UnicodeDecodeError:
            return raw.decode("utf-8", "surrogatepass")

    def __iter__(self) -> Iterator[str]:
        data, offsets = bytes(self._data), self._offsets
        for i in range(len(offsets) - 1):
            raw = data[offsets[i] : offsets[i + 1]]
            try:
                yield raw.decode()
            except UnicodeDecodeError:
                yield raw.decode("utf-8", "surrogatepass")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringTable):
            return self._offsets == other._offsets and self._data == other._data
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __reduce__(self) -> tuple[type[StringTable], tuple[list[str]]]:
        """Pickled as its strings: the hash index is rebuilt where it is loaded (``hash`` of a
        str differs between processes)."""
        return StringTable, (list(self),)

    def __repr__(self) -> str:
        shown = self[:8]
        more = f", ... ({len(self)} strings)" if len(self) > 8 else ""
        return f"StringTable({shown!r}{more})"

    @property
    def nbytes(self) -> int:
        """Bytes the table's buffers hold (not counting the ``_RECENT`` dict)."""
        arrays = (self._offsets, self._hashes, self._slots)
        return len(self._data) + sum(a.itemsize * len(a) for a in arrays)
