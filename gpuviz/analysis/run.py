"""A distributed run: a directory (or glob) of per-process logs, opened one at a time.

Every file is read with ``gpuviz.load``, so gpuviz logs and imported traces (per-rank
PyTorch snapshots, XPlane files) join alike. A file's rank and host come from its
``meta["run"]`` (written by ``GPUVIZ_LOG_DIR`` / ``gpuviz.record_run``); a file without one
(an imported trace) is rank = its position in the sorted file list, host = its name up to
the first dot, world size = the number of files.

Device names carry host and rank once a run opens a log (``node3/rank12/GPU:4``): the
prefix is applied when the log is loaded, not when it is recorded, so the runtime's own
device names (``GPU:0``, placement, ``gpuviz.device``) are unchanged and a single log
opened with ``gpuviz.load`` reads as before.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuviz.base.ranks import RankInfo, device_prefix
from gpuviz.importers import load
from gpuviz.log.eventlog import DeviceInfo, EventLog

__all__ = ["RUN_EXTENSION", "Run", "RankLog", "RunOutsideRoot", "load_run"]


class RunOutsideRoot(ValueError):
    """A run names files outside the directory it is confined to (``load_run(within=...)``)."""


@dataclass(frozen=True)
class RankLog:
    """One process's log of a run, with its identity and file."""

    info: RankInfo
    path: Path
    log: EventLog

    @property
    def prefix(self) -> str:
        """What the run put before this log's device names, e.g. ``node3/rank12/``."""
        return device_prefix(self.info)


@dataclass(frozen=True)
class Run:
    """The files of a run, in sorted order; ``run.open(i)`` / ``for rank_log in run`` load one at a time."""

    paths: tuple[Path, ...]

    def __len__(self) -> int:
        return len(self.paths)

    def open(self, position: int) -> RankLog:
        """Load file ``position`` (0-based) with its devices named ``host/rankN/DEVICE``."""
        path = self.paths[position]
        log = load(path, progress=False)
        meta = log.meta.get("run")
        if meta is not None:
            info = RankInfo.from_meta(meta)
        else:
            info = RankInfo(position, position, len(self.paths), path.name.split(".")[0] or "host")
        prefix = device_prefix(info)
        log.devices = [
            d if d.name.startswith(prefix) else DeviceInfo(prefix + d.name, dict(d.options)) for d in log.devices
        ]
        return RankLog(info, path, log)

    def __iter__(self) -> Iterator[RankLog]:
        """Each rank's log in turn; only the current one is held by the run."""
        for position in range(len(self.paths)):
            yield self.open(position)


RUN_EXTENSION = ".gpuviz-run"
"""A run manifest: a file naming a run, what JupyterLab opens (a folder cannot be opened as a
document). Its text is empty (the run is the folder the manifest lies in) or JSON
``{"logs": "DIR_OR_GLOB"}``, relative to the manifest's folder."""


def _manifest_source(manifest: Path) -> str:
    """The directory or glob a run manifest names (see ``RUN_EXTENSION``)."""
    text = manifest.read_text(encoding="utf-8").strip()
    if not text:
        return str(manifest.parent)
    try:
        logs = json.loads(text)["logs"]
    except (ValueError, TypeError, KeyError):
        raise ValueError(
            f'{manifest}: a run manifest is empty or JSON {{"logs": "DIR_OR_GLOB"}}, not {text[:80]!r}'
        ) from None
    if not isinstance(logs, str) or not logs:
        raise ValueError(f'{manifest}: "logs" must name a directory or glob, not {logs!r}')
    return str(manifest.parent / logs)


def _inside(path: Path, root: str) -> bool:
    """Whether ``path`` resolves (links followed) inside the directory ``root`` (itself resolved)."""
    real = os.path.realpath(path)
    return os.path.commonpath([root, real]) == root


def load_run(source: str | Path, *, within: str | Path | None = None) -> Run:
    """The run in directory ``source`` (every regular file not starting with ``.``, run
    manifests aside), matched by the glob pattern ``source`` (e.g. ``"logs/*.arrow"``), or
    named by the run manifest ``source`` (a ``*.gpuviz-run`` file, see ``RUN_EXTENSION``).

    ``within``: a directory every file of the run must resolve inside (links followed), as a
    server confines what a manifest in its root may name; a run naming anything outside it
    is refused without listing, opening or naming those files.

    Files are only listed here; ``Run.open`` loads them. Raises ``FileNotFoundError`` when
    the directory or pattern names no file, ``ValueError`` for a malformed manifest,
    ``RunOutsideRoot`` (a ``ValueError``) for a run reaching outside ``within``.
    """
    text = str(source)
    root = None if within is None else os.path.realpath(within)
    if root is not None and not _inside(Path(text), root):
        raise RunOutsideRoot(f"{text}: outside the directory the run is confined to")
    if text.endswith(RUN_EXTENSION) and Path(text).is_file():
        text = _manifest_source(Path(text))
    folder = Path(text)
    if root is not None and (folder.is_dir() or folder.is_file()) and not _inside(folder, root):
        raise RunOutsideRoot(f"{source}: the run's logs must lie inside the directory it is confined to")
    if folder.is_dir():
        paths = sorted(
            p for p in folder.iterdir()
            if p.is_file() and not p.name.startswith(".") and not p.name.endswith(RUN_EXTENSION)
        )  # fmt: skip
    elif folder.is_file():
        paths = [folder]
    else:
        paths = sorted(Path(p) for p in glob.glob(text) if Path(p).is_file())
    if root is not None and any(not _inside(p, root) for p in paths):
        raise RunOutsideRoot(f"{source}: the run's logs must lie inside the directory it is confined to")
    if not paths:
        raise FileNotFoundError(f"{text}: no log files (a run is a directory of logs or a glob pattern)")
    return Run(tuple(paths))
