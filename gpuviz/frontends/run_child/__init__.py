"""What a Python process started by a program under ``gpuviz run`` does at startup.

``gpuviz run`` puts this folder first on the children's ``PYTHONPATH``, so Python runs its
``sitecustomize`` when each starts; with ``GPUVIZ_RUN_CHILDREN`` set (by ``gpuviz run``), it
calls ``start_child``: the process records as its parent does (the framework, once the
process imports it; gpuviz's runtime with ``--gpuviz``) and, at exit, writes its log into
the run directory when it recorded anything (``gpuviz.frontends.run.write_process_log``).
SIGTERM (how launchers such as ``torchrun`` stop their workers) exits through Python, so the
log is written then too. The ``sitecustomize`` that this one hides runs afterwards.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
from pathlib import Path
from types import FrameType

__all__ = ["start_child"]


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    sys.exit(128 + signum)


def start_child() -> None:
    """Record this process for ``gpuviz run`` (nothing when it is the run's own process)."""
    from gpuviz.frontends.run import CHILD_VARIABLE, write_process_log
    from gpuviz.frontends.run_recorder import ProcessRecorder

    config = json.loads(os.environ[CHILD_VARIABLE])
    if config.get("parent") == os.getpid():
        return
    recorder = ProcessRecorder(str(config.get("framework", "auto")), watch=True)
    recorder.start()
    folder = Path(config["dir"])

    def finish() -> None:
        log = recorder.stop()
        if len(log):  # a process that recorded nothing (a helper, a launcher) leaves no file
            log.meta["recorded_by"] = {"framework": recorder.framework, "reason": recorder.reason}
            log.meta["run_end"] = {"how": "child process exit", "argv": list(sys.argv)}
            write_process_log(log, folder)

    atexit.register(finish)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
