"""The workloads of ``benchmarks/bench_native.py``, one file per layer of csrc/."""
