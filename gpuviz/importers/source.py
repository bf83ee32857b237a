"""The input of an import: a file on disk, gzip-compressed or not, read with progress.

``Source(path)`` opens the file once to sniff its first bytes (decompressed when the file
is gzip-compressed), so importers are chosen by content, never by file name.
``source.open()`` gives a binary stream of the decompressed content whose reads advance
the progress bar by the bytes taken from disk.
"""

from __future__ import annotations

import gzip
import io
import mmap
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Protocol

from gpuviz.base.errors import GpuvizError, LogFormatError
from gpuviz.importers.jsontop import MAX_SCAN_BYTES, JsonTop, scan

__all__ = ["Source", "Progress", "NullProgress", "Passes", "make_progress", "HEAD_BYTES", "PROGRESS_MIN_BYTES",
           "InputTooLarge"]  # fmt: skip

HEAD_BYTES = 1 << 16  # how much decompressed content the importers sniff
PROGRESS_MIN_BYTES = 8 << 20  # files smaller than this import without a progress bar (auto mode)
_GZIP_MAGIC = b"\x1f\x8b"
_SPOOL_CHUNK = 1 << 20  # bytes decompressed at a time into the spool file
DECOMPRESSED_RATIO = 200
"""A gzip file may decompress to this many bytes per compressed byte (real traces: 5-50x)..."""
DECOMPRESSED_FLOOR = 1 << 30
"""... or to 1 GiB, whichever is more ..."""
DECOMPRESSED_CAP = 1 << 36
"""... and never to more than 64 GiB: past its limit a stream stops with ``InputTooLarge``."""


class InputTooLarge(GpuvizError, MemoryError):
    """A compressed file decompresses to more than its limit (a gzip bomb): refused, not read."""


class _Capped(io.RawIOBase):
    """A decompressed stream that raises ``InputTooLarge`` once it passes ``limit`` bytes."""

    def __init__(self, stream: IO[bytes], limit: int, path: Path) -> None:
        self._stream, self._limit, self._path, self._total = stream, limit, path, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._stream.readinto(buffer)  # type: ignore[attr-defined]
        self._total += n
        if self._total > self._limit:
            raise InputTooLarge(
                f"{self._path} decompresses to more than {self._limit:,} bytes ({DECOMPRESSED_RATIO}x its size, "
                "at least 1 GiB, at most 64 GiB): refused as a gzip bomb"
            )
        return int(n)

    def tell(self) -> int:
        """Bytes handed out so far."""
        return self._total

    def close(self) -> None:
        self._stream.close()
        super().close()


SCAN_RATIO = 256  # the key scan of a gzip file reads at most this many times its compressed size...
SCAN_FLOOR = 64 << 20  # ...or this many bytes, whichever is more (and never more than jsontop.MAX_SCAN_BYTES)


class Progress(Protocol):
    """What an import reports progress to (a ``tqdm`` bar fits)."""

    def update(self, n: int) -> object: ...

    def close(self) -> None: ...


class NullProgress:
    """Progress that shows nothing."""

    def update(self, n: int) -> None:
        return None

    def close(self) -> None:
        return None


class Passes:
    """Progress for an import that reads the same file ``passes`` times: each byte read moves
    ``progress`` by 1/``passes`` of a byte (rounded down, so a bar sized for the file fills
    exactly once, and moves in every pass)."""

    def __init__(self, progress: Progress, passes: int) -> None:
        if passes < 1:
            raise ValueError(f"passes must be >= 1, got {passes!r}")
        self._progress = progress
        self._passes = passes
        self._read = 0  # bytes, over all passes
        self._sent = 0  # bytes reported to progress

    def update(self, n: int) -> None:
        self._read += n
        due = self._read // self._passes
        if due > self._sent:
            self._progress.update(due - self._sent)
            self._sent = due

    def close(self) -> None:
        self._progress.close()


def make_progress(total_bytes: int, description: str, enabled: bool | None = None) -> Progress:
    """A progress bar over ``total_bytes`` read from disk.

    ``enabled=None`` shows one only for files of at least ``PROGRESS_MIN_BYTES`` and only
    where tqdm is installed (``tqdm.auto``: a widget in notebooks, text in terminals);
    ``True`` shows one whatever the size (tqdm required); ``False`` never.
    """
    if enabled is False or (enabled is None and total_bytes < PROGRESS_MIN_BYTES):
        return NullProgress()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        if enabled:
            raise ImportError("progress bars need tqdm: pip install tqdm") from None
        return NullProgress()
    bar: Progress = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc=description)
    return bar


class _CountingReader(io.RawIOBase):
    """A raw stream over ``file`` that reports every byte read to ``progress``."""

    def __init__(self, file: IO[bytes], progress: Progress) -> None:
        self._file = file
        self._progress = progress

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._file.readinto(buffer)  # type: ignore[attr-defined]
        if n:
            self._progress.update(n)
        return int(n or 0)

    def tell(self) -> int:
        return int(self._file.tell())

    def close(self) -> None:
        self._file.close()
        super().close()


class Source:
    """A file to import: its path, on-disk size, whether it is gzip-compressed, its first bytes.

    Raises ``FileNotFoundError``/``IsADirectoryError``/``PermissionError`` as ``open`` does.
    A gzip file whose first bytes cannot be decompressed raises ``LogFormatError``.
    """

    def __init__(self, path: str | Path, *, progress: Progress | None = None) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise IsADirectoryError(f"{self.path} is a directory, not a trace file")
        self.size = os.path.getsize(self.path)
        self.progress: Progress = progress if progress is not None else NullProgress()
        with open(self.path, "rb") as file:
            raw_head = file.read(HEAD_BYTES)
        self.compressed = raw_head.startswith(_GZIP_MAGIC)
        if self.compressed:
            try:
                self.head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw_head, HEAD_BYTES)
            except zlib.error as exc:
                raise LogFormatError(
                    f"{self.path} starts like a gzip file but cannot be decompressed ({exc})"
                ) from None
        else:
            self.head = raw_head
        self._json_top: JsonTop | None = None

    def json_top(self) -> JsonTop:
        """The top level of the content read as JSON (``jsontop.scan``: its top-level keys and
        small values, skipped values never decoded), scanned once, streamed and bounded: a gzip
        file's content at most ``SCAN_RATIO`` times its size (at least ``SCAN_FLOOR`` bytes).
        A gzip stream cut short or corrupt ends the scan with ``problem`` set."""
        if self._json_top is None:
            broken: list[str] = []

            def chunks(stream: IO[bytes]) -> Iterator[bytes]:
                try:
                    yield from iter(lambda: stream.read(_SPOOL_CHUNK), b"")
                except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
                    broken.append(f"the gzip stream is cut short or corrupt ({exc})")

            limit = min(MAX_SCAN_BYTES, max(SCAN_FLOOR, SCAN_RATIO * self.size)) if self.compressed else MAX_SCAN_BYTES
            with gzip.GzipFile(self.path, mode="rb") if self.compressed else open(self.path, "rb") as stream:
                top = scan(chunks(stream), max_bytes=limit)  # type: ignore[arg-type]
            if broken:
                top.problem = broken[0]
            self._json_top = top
        return self._json_top

    @property
    def name(self) -> str:
        return str(self.path)

    def open(self, *, buffered: bool = True) -> IO[bytes]:
        """The decompressed content as a binary stream (reads advance the progress): buffered
        (1 MiB), or with ``buffered=False`` for a reader that asks for large blocks itself, an
        uncompressed file's reads go straight to the file (no buffer's copy of the content)."""
        counting = _CountingReader(open(self.path, "rb", buffering=0), self.progress)  # noqa: SIM115
        raw: IO[bytes] = io.BufferedReader(counting, 1 << 20) if buffered else counting  # type: ignore[assignment]
        if self.compressed:
            capped = _Capped(gzip.GzipFile(fileobj=raw, mode="rb"), self.content_limit(), self.path)  # type: ignore[arg-type]
            return io.BufferedReader(capped, 1 << 20) if buffered else capped  # type: ignore[return-value]
        return raw

    def content_limit(self) -> int:
        """The most bytes the content can hold: the file's size, or for a gzip file the size past
        which its stream stops with ``InputTooLarge``. ``open()``'s streams support ``tell()``."""
        if not self.compressed:
            return self.size
        return min(DECOMPRESSED_CAP, max(DECOMPRESSED_FLOOR, DECOMPRESSED_RATIO * self.size))

    def mapped(self) -> bytes | mmap.mmap:
        """The whole decompressed content, memory-mapped read-only (its pages are read when
        touched): an uncompressed file itself; a gzip-compressed one decompressed first, 1 MiB
        at a time, into an unnamed temporary file, so that its content is never whole in
        memory either. An empty file (nothing to map) comes as ``b""``.
        A gzip file cut short raises ``LogFormatError``."""
        if self.size == 0:
            return b""
        if not self.compressed:
            with open(self.path, "rb") as file:
                data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            self.progress.update(self.size)
            return data
        with tempfile.TemporaryFile() as spool, self.open() as stream:
            try:
                shutil.copyfileobj(stream, spool, _SPOOL_CHUNK)
            except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
                raise LogFormatError(f"{self.path}: the gzip stream is truncated or corrupt ({exc})") from None
            spool.flush()
            if spool.tell() == 0:
                return b""
            return mmap.mmap(spool.fileno(), 0, access=mmap.ACCESS_READ)  # the mapping outlives the file object

    def read_all(self) -> bytes:
        """The whole decompressed content. A gzip file cut short raises ``LogFormatError``."""
        if not self.compressed:  # one read of the known size: no chunks joined (peak memory 1x the file)
            with open(self.path, "rb") as file:
                data = file.read()
            self.progress.update(len(data))
            return data
        with self.open() as stream:
            try:
                return stream.read()
            except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
                raise LogFormatError(f"{self.path}: the gzip stream is truncated or corrupt ({exc})") from None
