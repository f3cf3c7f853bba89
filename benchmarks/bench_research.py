"""Research speed on the full SGLang trees: catalog extraction, and one flag's definition+readers+guards.

Usage: python benchmarks/bench_research.py [--source DIR ...]
Without --source it uses the cached 0.5.23 and 0.5.9 trees (fetching them once from the index).
Targets on a 2-core machine: catalog < 3 s, one flag's research < 1 s once the tree is cached.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from tools.flag_catalog import _catalog_cached
from tools.flag_readers import _parsed_block, _source
from tools.flags import flag_catalog, research_flag
from tools.source import get_source, local_source

FLAGS = [
    "--enable-fused-moe-sum-all-reduce",
    "--enable-flashinfer-allreduce-fusion",
    "--triton-attention-reduce-in-fp32",
    "--num-continuous-decode-steps",
    "--attention-backend",
    "--mem-fraction-static",
    "--cuda-graph-max-bs",
    "--moe-runner-backend",
    "--enable-torch-compile",
    "--tp-size",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, action="append", help="SGLang tree(s) instead of the cache.")
    args = parser.parse_args()
    trees = (
        [local_source(p) for p in args.source]
        if args.source
        else [get_source(v) for v in ("0.5.23", "0.5.9")]
    )
    for tree in trees:
        _catalog_cached.cache_clear()
        t0 = time.perf_counter()
        catalog = flag_catalog(tree)
        catalog_s = time.perf_counter() - t0
        print(f"sglang {tree.version}: catalog of {len(catalog)} flags in {catalog_s:.3f} s (cold)")
        _parsed_block.cache_clear()
        _source.cache_clear()
        cold, warm = [], []
        for flag in FLAGS:
            t0 = time.perf_counter()
            report = research_flag(tree, flag, catalog=catalog)
            cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            research_flag(tree, flag, catalog=catalog)
            warm.append(time.perf_counter() - t0)
            state = "dead" if report.dead else f"{len(report.readers)} readers"
            print(f"  {flag:42} {cold[-1]:.3f} s cold, {warm[-1]:.3f} s warm  ({state})")
        print(
            f"  research per flag: median {statistics.median(cold):.3f} s, max {max(cold):.3f} s cold; "
            f"median {statistics.median(warm):.3f} s warm (ASTs cached in-process)"
        )


if __name__ == "__main__":
    main()
