"""Which files of an SGLang tree the flag index (`tools.research.index`) reads: the serving path,
its argument code, and the files left out for their size."""

from __future__ import annotations

from pathlib import PurePosixPath

from tools.research.source import SourceTree

MAX_FILE_BYTES = 4 * 2**20
"""A Python file larger than this is not indexed (the index notes it: `FlagIndex.skipped`)."""
_OFF_PATH_DIRS = frozenset(
    {
        "test",
        "tests",
        "benchmark",
        "benchmarks",
        "bench",
        "examples",
        "example",
        "multimodal_gen",
        "lang",
        "eval",
    }
)
_TOP_LEVEL_OFF = ("bench_", "check_env", "profiler", "compile_deep_gemm")
_CONFIG_PATHS = ("srt/server_args.py", "srt/arg_groups/")


def off_path_reason(rel: str) -> str | None:
    """Why a file (relative to the `sglang/` package) is not on the serving path, or None if it is."""
    parts = PurePosixPath(rel).parts
    name = parts[-1]
    if any(p in _OFF_PATH_DIRS for p in parts[:-1]):
        hit = next(p for p in parts[:-1] if p in _OFF_PATH_DIRS)
        return f"under {hit}/"
    if name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py":
        return "test code"
    if len(parts) == 1 and name.startswith(_TOP_LEVEL_OFF):
        return "a tool, not the server"
    if len(parts) > 1 and parts[0] != "srt":
        return f"outside srt/ ({parts[0]}/)"
    return None


def is_config_path(path: str) -> bool:
    """Argument definition and resolution code (`server_args.py`, `arg_groups/`)."""
    return any(p in path for p in _CONFIG_PATHS)


def too_big(tree: SourceTree) -> list[str]:
    """Serving-path files left out of the index because they are over `MAX_FILE_BYTES` (generated
    tables, vendored blobs: no flag handling reads like that, and one would cost minutes and GBs)."""
    big = [p for p in tree.package_dir.rglob("*.py") if p.stat().st_size > MAX_FILE_BYTES]
    return [
        f"{tree.rel(p)} ({p.stat().st_size / 2**20:.0f} MB)"
        for p in sorted(big)
        if not off_path_reason(p.relative_to(tree.package_dir).as_posix())
    ]
