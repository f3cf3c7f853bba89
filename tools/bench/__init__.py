"""Benchmark engine: load generator, result model, statistics, correctness probe and plots.

Submodules are imported directly (`from tools.bench.loadgen import run_sweep`) so that importing
the package stays cheap; scipy and matplotlib load only in `stats` and `plot`.
"""
