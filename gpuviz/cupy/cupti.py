"""Ground-truth copies from CUPTI's activity API (package ``cupti-python``), as transfer events.

CUPTI's memcpy records carry the copy kind, bytes, device-side start and end (ns) and the
device; they also see copies that bypass CuPy's Python entry points. Needs a driver that
matches the installed ``cupti-python``; ``cupti_status()`` says whether it can run here.
"""

from __future__ import annotations

import time
from typing import Any

from gpuviz.capture.events import record_transfer
from gpuviz.log.eventlog import EventLog
from gpuviz.log.schema import Direction

__all__ = ["cupti_status", "CuptiTransfers", "COPY_KINDS"]

# CUpti_ActivityMemcpyKind: HTOD 1, DTOH 2, DTOD 8, PTOP 10
COPY_KINDS = {1: Direction.H2D, 2: Direction.D2H, 8: Direction.D2D, 10: Direction.D2D}


def cupti_status() -> tuple[bool, str]:
    """(usable, why): whether CUPTI activity records can be collected on this machine."""
    try:
        from cupti import cupti
    except ImportError:
        return False, "cupti-python is not installed (pip install cupti-python)"
    try:
        cupti.get_timestamp()
    except Exception as error:  # NotSupportedError without a driver, cuptiError otherwise
        return False, f"CUPTI cannot run here: {error}"
    return True, "CUPTI activity records available"


class CuptiTransfers:
    """Collects CUPTI memcpy activity into ``log`` between ``start()`` and ``stop()``."""

    def __init__(self, log: EventLog) -> None:
        usable, why = cupti_status()
        if not usable:
            raise RuntimeError(why)
        from cupti import cupti

        self._cupti = cupti
        self.log = log
        self._offset = 0
        self.records = 0

    def start(self) -> None:
        cupti = self._cupti
        cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        cupti.activity_enable(cupti.ActivityKind.MEMCPY)
        self._offset = time.perf_counter_ns() - int(cupti.get_timestamp())

    def flush(self) -> None:
        self._cupti.activity_flush_all(1)

    def stop(self) -> None:
        self.flush()
        self._cupti.activity_disable(self._cupti.ActivityKind.MEMCPY)

    @staticmethod
    def _buffer_requested() -> tuple[int, int]:
        return 8 * 1024 * 1024, 0

    def _buffer_completed(self, activities: list[Any]) -> None:
        memcpy = self._cupti.ActivityKind.MEMCPY
        for activity in activities:
            if activity.kind != memcpy or (activity.start == 0 and activity.end == 0):
                continue
            direction = COPY_KINDS.get(int(activity.copy_kind))
            if direction is None:
                continue
            gpu = self.log.add_device(f"GPU:{int(activity.device_id)}")
            host = self.log.add_device("CPU:0")
            source, destination = (gpu, host) if direction == Direction.D2H else (host, gpu)
            if direction == Direction.D2D:
                source = destination = gpu
            record_transfer(
                self.log, direction=direction, source=source, destination=destination, nbytes=int(activity.bytes),
                start_ns=int(activity.start) + self._offset, duration_ns=int(activity.end) - int(activity.start),
                tag="cupti",
            )  # fmt: skip
            self.records += 1
