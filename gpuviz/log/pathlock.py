"""A recorder's claim on its file: one live recorder per path, and no temporary left behind.

A recording file is created under a temporary name, locked (``flock``, held for as long as
the recorder is open, by a descriptor of its own) and only then linked to its path, so the
path never shows an unlocked recording file. A second recorder, or ``save``, aimed at that
path finds the lock and is refused with ``PathInUse`` before it touches anything; the first
recorder's events are never overwritten. A finished log (no lock) is replaced as before.

Temporary files are named ``.NAME.PID.TID.tmp`` beside the log; one whose process is gone
(a crash inside ``close``) is removed by the next recorder or ``save`` of that path.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from pathlib import Path

from gpuviz.base.errors import GpuvizError

try:
    import fcntl
except ImportError:  # not POSIX: recorders on one path are not detected
    fcntl = None  # type: ignore[assignment]

__all__ = ["PathInUse", "PathClaim", "claim", "check_free", "temporary_name", "remove_stale_temporaries"]


class PathInUse(GpuvizError, FileExistsError):
    """Another recorder is writing the file at this path (its events would be lost)."""


def _in_use(path: Path) -> PathInUse:
    return PathInUse(
        f"{path} is being recorded by another recorder (this or another process): "
        "record to another path, or stop that recorder first"
    )


def temporary_name(path: Path) -> Path:
    """The temporary file this process and thread write before renaming it to ``path``."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def remove_stale_temporaries(path: Path) -> None:
    """Remove the temporaries of ``path`` whose writing process no longer exists."""
    prefix = f".{path.name}."
    with contextlib.suppress(OSError):
        for entry in os.scandir(path.parent):
            name = entry.name
            if not (name.startswith(prefix) and name.endswith(".tmp")):
                continue
            pid_text = name[len(prefix) : -len(".tmp")].split(".")[0]
            if not pid_text.isdigit():
                continue
            try:
                os.kill(int(pid_text), 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
            except OSError:  # alive, another user's
                pass


def _locked_by_another(path: Path) -> bool:
    """Whether a live recorder holds ``path``'s file (False when it is missing or not locked)."""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # releases the probe's lock
    return False


def check_free(path: Path) -> None:
    """``PathInUse`` when a live recorder writes ``path``; removes stale temporaries of it."""
    remove_stale_temporaries(path)
    if _locked_by_another(path):
        raise _in_use(path)


class PathClaim:
    """A new, empty file at ``path``, open for writing (``file``) and locked until ``release``."""

    def __init__(self, path: Path, file: io.FileIO, lock_fd: int) -> None:
        self.path = path
        self.file = file
        self._lock_fd = lock_fd

    def release(self) -> None:
        """Give up the claim (after the file is closed or replaced)."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def claim(path: Path) -> PathClaim:
    """Create and lock the recording file at ``path``: an existing finished file is replaced,
    one a live recorder holds raises ``PathInUse`` and stays as it is."""
    check_free(path)
    if path.is_file():
        path.unlink()  # a new inode: a log loaded from the old file keeps its memory mapping
    temporary = temporary_name(path)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            os.link(temporary, path)  # atomic: fails when another recorder got there first
        except FileExistsError:
            raise _in_use(path) from None
        except OSError:  # a file system without hard links: the path is created directly
            os.close(fd)
            fd = -1
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                raise _in_use(path) from None
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock_fd = os.dup(fd)  # the lock lasts while this descriptor is open, whatever closes the file
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
    return PathClaim(path, io.FileIO(fd, "w"), lock_fd)
