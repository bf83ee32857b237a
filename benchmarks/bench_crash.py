"""What a recorder killed at a random moment loses: events, and how recently they were recorded.

Run by hand:  .venv/bin/python benchmarks/bench_crash.py [--kills 60]

Recorders (the C row writer, the Python recorder, and a slow one that pauses 0.2 ms between
operations) record to a file with the defaults (flush_rows=4096, flush_interval_s=0.1) and are
killed with SIGKILL at random moments. For each mode this prints the most events lost and how
long before the recorder's last operation the first lost event was recorded (ms). The count is
bounded by design (at most 4096; tests/test_eventlog.py asserts it); the time is within the flush
interval where the file's writer thread gets a core, which a loaded machine may not give it: the
load average is printed with the results.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from gpuviz import load

# One recording child forked per kill; after every operation it writes the log's length and
# the time into the progress file: [operations done, start time, then (events, time) each].
ZYGOTE = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    from gpuviz import BFCAllocator, EventLog, SimUpstream
    for line in sys.stdin:
        path, progress_path, mode = line.split()
        pid = os.fork()
        if pid:
            print(pid, flush=True)
            print(os.waitpid(pid, 0)[1], flush=True)
            continue
        os.environ["GPUVIZ_NATIVE"] = "0" if mode == "python" else "1"
        progress = np.memmap(progress_path, dtype=np.int64, mode="r+")
        slots = (len(progress) - 2) // 2
        log = EventLog(path)
        alloc = BFCAllocator(SimUpstream("1GiB"), log=log)
        live, i = [], 0
        progress[1] = time.perf_counter_ns()
        while True:
            live.append(alloc.allocate(1000 + i % 5000))
            if len(live) > 20:
                alloc.free(live.pop(0))
            if i < slots:
                progress[2 + 2 * i], progress[3 + 2 * i] = len(log), time.perf_counter_ns()
                progress[0] = i + 1
            if mode == "slow":
                time.sleep(0.0002)
            i += 1
    """
)
MODES = ("native", "python", "slow")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=60, help="recorders killed in all (modes in turn)")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    zygote = subprocess.Popen(
        [sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
    )
    assert zygote.stdin is not None and zygote.stdout is not None
    rng = np.random.default_rng(11)
    slots = 1 << 20
    worst: dict[str, tuple[int, float]] = dict.fromkeys(MODES, (0, 0.0))
    with tempfile.TemporaryDirectory() as folder:
        try:
            for case in range(args.kills):
                mode = MODES[case % 3]
                path, progress_path = Path(folder) / f"kill{case}.arrow", Path(folder) / f"progress{case}"
                progress_path.write_bytes(bytes(8 * (2 + 2 * slots)))
                zygote.stdin.write(f"{path} {progress_path} {mode}\n")
                pid = int(zygote.stdout.readline())
                progress = np.memmap(progress_path, dtype=np.int64, mode="r")
                while progress[0] == 0:
                    time.sleep(0.001)
                time.sleep(float(rng.uniform(0, 0.3)))
                os.kill(pid, signal.SIGKILL)
                zygote.stdout.readline()
                loaded = load(path)
                steps = int(progress[0])
                counts, times = progress[2 : 2 + 2 * steps : 2], progress[3 : 3 + 2 * steps : 2]
                lost, recorded_ms = int(counts[-1]) - len(loaded), 0.0
                if lost > 0:  # the first lost event came after the last operation whose events all loaded
                    step = int(np.searchsorted(counts, len(loaded), side="right"))
                    since_ns = int(times[step - 1]) if step else int(progress[1])
                    recorded_ms = (int(times[-1]) - since_ns) / 1e6
                worst[mode] = (max(worst[mode][0], lost), max(worst[mode][1], recorded_ms))
                del progress
                path.unlink()
                progress_path.unlink()
        finally:
            zygote.stdin.close()
            zygote.kill()
            zygote.wait()
    for mode, (lost, ms) in worst.items():
        print(f"{mode:>7}: at most {lost} events lost, recorded in the last {ms:.1f} ms (bounds: 4096 events, 100 ms)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
