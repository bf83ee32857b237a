"""TensorFlow memory records held as columns: ``MemoryColumns`` is a sequence of ``MemoryRecord``
that keeps each field in a NumPy array (about 80 bytes a record instead of ~400 as objects) and
builds a record only when one is read. The XPlane importer decodes into it line by line and
sorts it by time once, so a profile of millions of memory events is never a list of objects.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple, overload

import numpy as np

__all__ = ["MemoryRecord", "MemoryColumns", "MemoryColumnsBuilder"]

_INTS = ("time_ns", "address", "requested", "size", "bytes_in_use", "peak_bytes_in_use", "step", "thread")
_BLOCK = 1 << 13  # records built at a time when iterating
_Kind = tuple[str, str, str | None, str | None, str]


class MemoryRecord(NamedTuple):
    """One MemoryAllocation (``is_alloc``) or MemoryDeallocation of a TF allocator. Bytes, ns.
    (A named tuple: importers build millions of them, one at a time.)"""

    time_ns: int
    is_alloc: bool
    allocator: str
    address: int
    requested: int
    size: int
    bytes_in_use: int  # TF's bytes_allocated after the event; -1 when absent
    peak_bytes_in_use: int
    fragmentation: float  # TF's (free - largest free chunk) / free after the event; -1.0 when absent
    op: str
    dtype: str | None
    shape: str | None
    region_type: str
    step: int | None
    thread: int


class MemoryColumns(Sequence[MemoryRecord]):
    """Records in columns: the integer fields of ``_INTS``, ``is_alloc``, ``has_step`` (bools),
    ``fragmentation`` (float) and ``texts``, an index into ``kinds``: the record's
    (allocator, op, dtype, shape, region_type)."""

    def __init__(self, columns: dict[str, np.ndarray], kinds: list[_Kind]):
        self.columns = columns
        self.kinds = kinds

    @classmethod
    def of(cls, records: Iterable[MemoryRecord]) -> MemoryColumns:
        """Columns holding ``records``."""
        builder = MemoryColumnsBuilder()
        for record in records:
            builder.add(record)
        return builder.build()

    @classmethod
    def from_buffers(cls, buffers: dict[str, Any], kinds: list[_Kind]) -> MemoryColumns:
        """Columns over raw little-endian buffers (not copied): each of ``_INTS`` (int64), ``flags``
        (uint8: bit 0 is_alloc, bit 1 has a step), ``fragmentation`` (float64) and ``texts`` (int32,
        an index into ``kinds``). Equal kinds become one (in order of first appearance)."""
        flags = np.frombuffer(buffers["flags"], dtype=np.uint8)
        columns: dict[str, np.ndarray] = {name: np.frombuffer(buffers[name], dtype=np.int64) for name in _INTS}
        columns["is_alloc"] = (flags & 1) != 0
        columns["has_step"] = (flags & 2) != 0
        columns["fragmentation"] = np.frombuffer(buffers["fragmentation"], dtype=np.float64)
        texts = np.frombuffer(buffers["texts"], dtype=np.int32)
        first: dict[_Kind, int] = {}
        index = [first.setdefault(kind, len(first)) for kind in kinds]
        if len(first) < len(kinds):
            texts = np.asarray(index, dtype=np.int32)[texts]
        columns["texts"] = texts
        return cls(columns, list(first))

    def __len__(self) -> int:
        return len(self.columns["time_ns"])

    @overload
    def __getitem__(self, index: int) -> MemoryRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[MemoryRecord]: ...

    def __getitem__(self, index: int | slice) -> MemoryRecord | list[MemoryRecord]:
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step == 1:
                return list(self._records(start, stop))
            return [self[i] for i in range(start, stop, step)]
        position = index + n if index < 0 else index
        if not 0 <= position < n:
            raise IndexError(f"record {index} of {n}")
        return next(self._records(position, position + 1))

    def __iter__(self) -> Iterator[MemoryRecord]:
        return self._records(0, len(self))

    def _records(self, start: int, stop: int) -> Iterator[MemoryRecord]:
        c = self.columns
        kinds = self.kinds
        names = (*_INTS, "is_alloc", "has_step", "fragmentation", "texts")
        for first in range(start, stop, _BLOCK):
            window = slice(first, min(stop, first + _BLOCK))
            fields = [c[name][window].tolist() for name in names]
            for time_ns, address, requested, size, in_use, peak, step, thread, is_alloc, has_step, frag, text in zip(
                *fields, strict=True
            ):
                allocator, op, dtype, shape, region = kinds[text]
                yield MemoryRecord(
                    time_ns=time_ns, is_alloc=is_alloc, allocator=allocator, address=address, requested=requested,
                    size=size, bytes_in_use=in_use, peak_bytes_in_use=peak, fragmentation=frag, op=op, dtype=dtype,
                    shape=shape, region_type=region, step=step if has_step else None, thread=thread,
                )  # fmt: skip

    def counts(self, field: int, *, allocations_only: bool = False) -> dict[str, int]:
        """How many records have each value of one ``kinds`` field (0: allocator, 4: region type), in
        order of first appearance; ``allocations_only``: count allocations only."""
        texts = self.columns["texts"]
        if allocations_only:
            texts = texts[self.columns["is_alloc"]]
        ids: dict[str, int] = {}
        of_kind = np.array([ids.setdefault(str(kind[field]), len(ids)) for kind in self.kinds], dtype=np.int64)
        values, first, counts = np.unique(of_kind[texts], return_index=True, return_counts=True)
        names = list(ids)
        return {names[values[i]]: int(counts[i]) for i in np.argsort(first, kind="stable").tolist()}

    def sorted_by_time(self, then: np.ndarray | None = None) -> MemoryColumns:
        """The records in time order (stable: equal times keep their order, or, given ``then``, one
        value per record, go in its order first); ``self`` when they are in that order."""
        times = self.columns["time_ns"]
        if then is None:
            if bool(np.all(times[1:] >= times[:-1])):
                return self
            order = np.argsort(times, kind="stable")
        else:
            order = np.lexsort((then, times))  # stable
            if bool(np.all(order[1:] > order[:-1])):
                return self
        columns = {}
        for name in list(self.columns):
            columns[name] = self.columns.pop(name)[order]  # one column copied at a time
        return MemoryColumns(columns, self.kinds)


class MemoryColumnsBuilder:
    """Appends records into typed arrays (no object kept per record)."""

    def __init__(self) -> None:
        self._ints = {name: array("q") for name in _INTS}
        self._flags = array("B")  # bit 0: is_alloc, bit 1: has step
        self._fragmentation = array("d")
        self._texts = array("i")
        self._kinds: dict[_Kind, int] = {}

    def add(self, record: MemoryRecord) -> None:
        ints = self._ints
        ints["time_ns"].append(record.time_ns)
        ints["address"].append(record.address)
        ints["requested"].append(record.requested)
        ints["size"].append(record.size)
        ints["bytes_in_use"].append(record.bytes_in_use)
        ints["peak_bytes_in_use"].append(record.peak_bytes_in_use)
        ints["step"].append(0 if record.step is None else record.step)
        ints["thread"].append(record.thread)
        self._flags.append(int(record.is_alloc) | (record.step is not None) << 1)
        self._fragmentation.append(record.fragmentation)
        key = (record.allocator, record.op, record.dtype, record.shape, record.region_type)
        text = self._kinds.get(key)
        if text is None:
            text = self._kinds[key] = len(self._kinds)
        self._texts.append(text)

    def build(self) -> MemoryColumns:
        """The columns (the builder is left empty: the arrays belong to the columns)."""
        buffers: dict[str, Any] = {**self._ints, "flags": self._flags, "fragmentation": self._fragmentation,
                                   "texts": self._texts}  # fmt: skip
        kinds = sorted(self._kinds, key=self._kinds.__getitem__)
        self.__init__()  # type: ignore[misc]  # drop the arrays: a column is freed when its view goes
        return MemoryColumns.from_buffers(buffers, kinds)
