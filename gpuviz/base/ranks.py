"""Which process of a distributed run this is: rank, local rank, world size and host.

Read from the environment the usual launchers set (torchrun / torch.distributed:
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``; SLURM: ``SLURM_PROCID``, ``SLURM_LOCALID``,
``SLURM_NTASKS``; Open MPI: ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_LOCAL_RANK``,
``OMPI_COMM_WORLD_SIZE``; MPICH / Intel MPI: ``PMI_RANK``, ``MPI_LOCALRANKID``, ``PMI_SIZE``),
first match wins in that order. The host is ``socket.gethostname()``.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["CLOCK_OFFSET", "LOG_DIR_VARIABLE", "RankInfo", "clock_offset_ns", "rank_from_env", "rank_file_name"]
__all__ += ["device_prefix"]

LOG_DIR_VARIABLE = "GPUVIZ_LOG_DIR"
"""The environment variable naming the directory every process of a run records into."""

_LAUNCHERS = (  # (rank, local rank, world size) variables, by launcher
    ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
)


@dataclass(frozen=True)
class RankInfo:
    """One process of a run: global ``rank``, ``local_rank`` on its host, ``world_size``, ``host``."""

    rank: int
    local_rank: int
    world_size: int
    host: str

    def as_meta(self) -> dict[str, Any]:
        """The ``log.meta["run"]`` form."""
        return asdict(self)

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> RankInfo:
        """Inverse of ``as_meta``; raises ``ValueError`` naming a missing or bad field."""
        try:
            return cls(int(meta["rank"]), int(meta["local_rank"]), int(meta["world_size"]), str(meta["host"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"log.meta['run'] is not a run identity ({type(exc).__name__}: {exc}): {meta!r}") from None


def _integer(env: Mapping[str, str], name: str) -> int:
    text = env[name]
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} is not an integer") from None
    if value < 0:
        raise ValueError(f"environment variable {name}={text!r} is negative")
    return value


def rank_from_env(env: Mapping[str, str] | None = None, *, host: str | None = None) -> RankInfo:
    """This process's ``RankInfo`` from ``env`` (default ``os.environ``).

    Without any launcher variable the process is rank 0 of 1. A local rank or world size
    the launcher does not set defaults to the rank and to rank + 1.
    """
    env = os.environ if env is None else env
    hostname = host if host is not None else socket.gethostname()
    for rank_name, local_name, size_name in _LAUNCHERS:
        if rank_name in env:
            rank = _integer(env, rank_name)
            local = _integer(env, local_name) if local_name in env else rank
            size = _integer(env, size_name) if size_name in env else rank + 1
            if rank >= size:
                raise ValueError(f"environment variable {rank_name}={rank} is not below {size_name}={size}")
            return RankInfo(rank, local, size, hostname)
    return RankInfo(0, 0, 1, hostname)


def rank_file_name(info: RankInfo) -> str:
    """The log file of one process in a run directory, e.g. ``node3-rank12.arrow``."""
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in info.host) or "host"
    return f"{host}-rank{info.rank}.arrow"


def device_prefix(info: RankInfo) -> str:
    """What a run puts before a device name of this process, e.g. ``node3/rank12/`` (``node3/rank12/GPU:4``)."""
    return f"{info.host}/rank{info.rank}/"


CLOCK_OFFSET = "clock_offset_ns"
"""The ``meta["run"]`` key of a log's wall-clock anchor: ``time_ns + meta["run"]["clock_offset_ns"]``
is an event's wall-clock time (ns since the Unix epoch), so ranks on different hosts line up
as far as the hosts' clocks agree (NTP: about a millisecond; PTP: microseconds)."""


def clock_offset_ns() -> int:
    """This process's wall clock minus the clock events are stamped with (``time.perf_counter_ns``), in ns."""
    return time.time_ns() - time.perf_counter_ns()
