"""A run as one Parquet dataset, partitioned by host and rank, for DuckDB, Dask DataFrame,
Spark, pandas or pyarrow.

``export_run_parquet(run, out_dir)`` writes each rank's log (one log in memory at a time) as
``out_dir/host=<host>/rank=<rank>/part-0.parquet`` (Hive-style partitions: ``host`` and
``rank`` are columns of the dataset, read from the folder names; a host name is
percent-encoded there as pyarrow writes partition values). Each file holds the rank's events
as ``EventLog.to_parquet`` writes them, one row per event, in log order:

- ``seq`` (position in the rank's log), ``time_ns`` (that rank's monotonic clock, ns: clocks
  of different hosts are not comparable), ``thread``, ``address``, ``size``, ``requested``,
  ``segment``, ``largest_free``, ``duration_ns`` (bytes and ns as in ``gpuviz.log.schema``),
  ``flags`` (mark phase / transfer direction / soft placement code), ``stack`` (id);
- ``kind`` as its name (``"alloc"``, ``"free"``, ``"segment_alloc"``, ..., dictionary-encoded);
- ``device`` and ``peer`` as the run's device names (``node3/rank12/GPU:4``), null where the
  log has none; ``tag`` as its text, null where none;
- the file's metadata: the log format version and its devices (with their options).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from urllib.parse import quote

from gpuviz.analysis.run import Run

__all__ = ["export_run_parquet", "partition_path"]


def partition_path(host: str, rank: int) -> Path:
    """The part file of one rank inside the dataset: ``host=<host>/rank=<rank>/part-0.parquet``."""
    return Path(f"host={quote(host, safe='')}") / f"rank={rank}" / "part-0.parquet"


def export_run_parquet(run: Run, out_dir: str | Path) -> list[Path]:
    """Write ``run`` as a Parquet dataset in ``out_dir`` (see the module docstring); returns the
    part files written, in the run's file order.

    ``out_dir`` must not exist or be an empty directory. The dataset is written beside it
    and moved into place when complete, so an error leaves no partial dataset. Raises
    ``FileExistsError`` for a non-empty ``out_dir``, ``ValueError`` when two files claim the
    same rank on the same host, and the loading error of a file that cannot be read.
    """
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty directory; name a new one for the dataset")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        written: list[Path] = []
        seen: dict[Path, str] = {}
        for rank_log in run:
            part = partition_path(rank_log.info.host, rank_log.info.rank)
            if part in seen:
                first, second = sorted((seen[part], rank_log.path.name))
                raise ValueError(
                    f"{second} and {first} are both rank {rank_log.info.rank} on host {rank_log.info.host}"
                )
            seen[part] = rank_log.path.name
            (staging / part).parent.mkdir(parents=True)
            rank_log.log.to_parquet(staging / part)
            written.append(out / part)
        if out.exists():
            out.rmdir()  # empty, checked above
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return written
