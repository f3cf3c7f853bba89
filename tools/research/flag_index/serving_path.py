"""Which files of an SGLang tree the flag index (`tools.research.index`) reads: the serving path,
its argument code, and the files left out for their size."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

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


def python_files(package_dir: Path) -> Iterator[tuple[Path, int]]:
    """Every `.py` file under `package_dir` and its size, a directory's files (by name) before its
    subdirectories (by name), hidden ones and `__pycache__` skipped, symlinked directories not
    followed. Without recursion: `os.walk` and `rglob` exhaust Python's stack on directories
    nested a thousand deep, which a path of 4,096 characters allows."""
    todo = [package_dir]
    while todo:
        directory = todo.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            if entry.name.startswith(".") or entry.name == "__pycache__":
                continue
            if entry.is_dir(follow_symlinks=False):
                subdirs.append(Path(entry.path))
            elif entry.name.endswith(".py") and entry.is_file():
                yield Path(entry.path), entry.stat().st_size
        todo += reversed(subdirs)


def too_big(tree: SourceTree) -> list[str]:
    """Serving-path files left out of the index because they are over `MAX_FILE_BYTES` (generated
    tables, vendored blobs: no flag handling reads like that, and one would cost minutes and GBs)."""
    return [
        f"{tree.rel(p)} ({size / 2**20:.0f} MB)"
        for p, size in sorted(python_files(tree.package_dir))
        if size > MAX_FILE_BYTES and not off_path_reason(p.relative_to(tree.package_dir).as_posix())
    ]
