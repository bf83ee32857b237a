"""Instructions per allocate+free pair, counted by valgrind (callgrind): a noise-free view of
the recording overhead on a shared machine, where timings move by 2x from hour to hour.

Run by hand:  .venv/bin/python benchmarks/instructions.py [--pairs 10000]
Needs valgrind (Debian: apt-get install valgrind). Each mode runs twice in a child process,
once running ``--pairs`` pairs and once running none (after the same set-up: the same
workload generated, the same 1000 live buffers), and the difference is divided by
``--pairs``, so interpreter start-up and set-up cancel out.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# mode: (record, GPUVIZ_NATIVE, native core); the Python allocator's modes first
MODES = {
    "off": (False, "1", False),
    "on": (True, "1", False),
    "on, Python recorder": (True, "0", False),
    "native core, off": (False, "1", True),
    "native core, on": (True, "1", True),
}


def child(mode: str, pairs: int, run: bool) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_core import mixed_workload, run_pairs

    from gpuviz import BFCAllocator, SimUpstream
    from gpuviz.capture.native import NativeBFCAllocator

    record, _, native = MODES[mode]
    alloc = (NativeBFCAllocator if native else BFCAllocator)(SimUpstream("64GiB"), growth=True, record=record)
    ops = mixed_workload(pairs)
    run_pairs(alloc, ops if run else [])


def count(mode: str, pairs: int, *, run: bool) -> int:
    # one BLAS thread (idle BLAS workers spin, and valgrind counts spinning) and a fixed hash seed
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    env["GPUVIZ_NATIVE"] = MODES[mode][1]
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__]
    proc = subprocess.run(
        [*command, "--child", mode, "--pairs", str(pairs), *(["--run"] if run else [])],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    match = re.search(r"refs:\s+([\d,]+)", proc.stderr)
    if match is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{proc.stderr[-2000:]}")
    return int(match.group(1).replace(",", ""))


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script too
    from benchmarks._results import Results, add_json_option

    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=5_000)
    parser.add_argument("--child", choices=list(MODES))
    parser.add_argument("--run", action="store_true")
    add_json_option(parser)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.pairs, args.run)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    n = args.pairs
    results = Results("instructions", "Instructions per allocate+free pair (valgrind callgrind).", vars(args))
    per_pair = {mode: (count(mode, n, run=True) - count(mode, n, run=False)) / n for mode in MODES}
    for mode, instructions in per_pair.items():
        line = f"recording {mode:20s}: {instructions:8.0f} instructions per allocate+free pair"
        off = "native core, off" if MODES[mode][2] else "off"
        if mode != off:
            line += f", overhead {(instructions / per_pair[off] - 1) * 100:.1f} %"
        print(line)
        results.add(f"allocate+free pair, recording {mode}", instructions, "instructions")
    results.write(args.json)


if __name__ == "__main__":
    main()
