"""The demo workload: a small training-like loop on the default device.

It runs on the device runtime (a simulated GPU when there is none): it copies weights
and batches to the GPU, computes, reads a loss back every step, keeps a small result per
step (so free memory fragments between them), runs one op on a device that does not exist
(soft placement) and one on the CPU, and ends with a request that fails although enough
bytes are free in total.
"""

from __future__ import annotations

import numpy as np

from gpuviz.base.errors import OutOfMemoryError
from gpuviz.base.units import MiB
from gpuviz.capture.marks import span
from gpuviz.log.eventlog import EventLog
from gpuviz.runtime import config
from gpuviz.runtime.array import DeviceArray, asarray, empty
from gpuviz.runtime.context import Session, device, get_runtime

__all__ = ["run_demo"]


def run_demo(log: EventLog, *, gpu_memory: str = "1GiB", steps: int = 6) -> None:
    """Run the workload, recording into ``log``.

    When the runtime is not initialised yet, it gets one simulated GPU of ``gpu_memory``.
    """
    if not config.current().initialized:
        config.set_simulated_gpus(1, gpu_memory)
    rng = np.random.default_rng(0)
    with Session(log):
        with span("load weights"):
            weights = [asarray(rng.standard_normal((512, 512)).astype(np.float32)) for _ in range(4)]
        kept: list[DeviceArray] = []
        for step in range(steps):
            with span(f"step {step}"):
                batch = asarray(rng.standard_normal((256, 512)))  # float64: twice the memory it needs
                activations = batch.astype(np.float32)
                scratch = [empty((1 + i) * 4 * MiB // 4, np.float32) for i in range(6)]
                for w in weights:
                    activations = np.maximum(activations @ w, 0)
                loss = float(activations.mean())  # a device-to-host read every step
                kept.append(empty(MiB // 4, np.float32))  # small and long-lived: fragments the pool
                del batch, scratch
                log.meta.setdefault("losses", []).append(loss)
        with device("/GPU:3"):  # no such device: soft placement runs it on GPU:0
            total = sum(k.sum() for k in kept[:2])
        with device("/CPU:0"):
            on_host = total * 2  # runs on the CPU: the operand is copied back
        gpu = get_runtime().devices["GPU:0"].allocator.stats()
        try:
            empty(gpu.largest_free_block_bytes + MiB, np.uint8)
        except OutOfMemoryError as error:
            log.meta["demo_oom"] = str(error)
        del on_host, weights, kept
