"""The per-version flag index: every flag's readers, guards, call edges and exits, built once.

Building walks every serving-path file of an SGLang tree once (`walk.file.walk_file`, two
worker processes) and stores the result in an SQLite file of pickled records under
`<cache>/flag-index/`, one per tree, keyed by the version, an index format number and a digest of
the files' names, sizes and mtimes; a changed tree rebuilds. Later calls open that file (and keep
it in memory for the process).

Serving path (issue 10, item 4): `srt/**` plus the package's top-level modules, without tests,
benchmarks, examples, `multimodal_gen/` (another product), the `lang/` frontend and `bench_*.py`.

The index's reader (`FlagIndex`), writer and serving-path rules are in `flag_index/`.
"""

from __future__ import annotations

import ast
import hashlib
import os
import pickle
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from tools.research.cache import cache_folder, cache_lock
from tools.research.catalog import flag_catalog
from tools.research.flag_index.budget import (
    MAX_BUILD_SECONDS,
    MAX_FILE_RECORDS,
    MAX_TREE_RECORDS,
    Unread,
    within_budget,
)
from tools.research.flag_index.lookup import FlagIndex
from tools.research.flag_index.serving_path import (
    MAX_FILE_BYTES,
    is_config_path,
    off_path_reason,
    python_files,
)
from tools.research.flag_index.write import write_index
from tools.research.source import SourceTree
from tools.research.walk.file import UnreadFile, walk_file

INDEX_FORMAT = 43


def _files(tree: SourceTree, unread: Unread) -> list[tuple[str, str, bool]]:
    """Serving-path Python files within the tree's budget, in read order (`budget.read_order`):
    (path relative to the tree root, dotted module, is a package). The rest go to `unread`."""
    pkg = tree.package_dir
    found = [
        (tree.rel(full), size)
        for full, size in python_files(pkg)
        if size <= MAX_FILE_BYTES and not off_path_reason(full.relative_to(pkg).as_posix())
    ]
    out = []
    for i in within_budget(found, unread):
        rel = found[i][0]
        parts = [pkg.name, *rel[len(tree.rel(pkg)) + 1 : -3].split("/")]
        is_pkg = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_pkg else parts)
        out.append((rel, module, is_pkg))
    return out


def _digest(tree: SourceTree) -> str:
    """The cache key: version, location, and the stats of the package, `srt/` and the flag
    definitions. Why not every file: stat-ing ~5000 files costs ~1 s per call; an edited checkout is
    re-indexed with `load_index(..., rebuild=True)` (`optagent research --rebuild-index`)."""
    h = hashlib.sha256(f"{INDEX_FORMAT}\0{tree.version}\0{tree.root.resolve()}".encode())
    pkg = tree.package_dir
    marks = [pkg, pkg / "srt", pkg / "srt" / "server_args.py", pkg / "srt" / "arg_groups" / "fields"]
    marks += sorted((pkg / "srt" / "arg_groups" / "fields").glob("*.py"))
    for p in marks:
        if p.exists():
            st = p.stat()
            h.update(f"{p.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


_WORK: dict[str, Any] = {}
"""What every file's walk shares in one process (`_start`): the tree root, the dests, the deadline."""


def _start(root: str, dests: frozenset[str], deadline: float) -> None:
    _WORK.update(root=root, dests=dests, deadline=deadline)


def _walk_one(file: tuple[str, str, bool]) -> bytes | str:
    """One file's facts, pickled; or why it is left unread (past the deadline, nested too deeply,
    more records than one file may give)."""
    rel, module, is_pkg = file
    if time.monotonic() > _WORK["deadline"]:
        return f"over the build's budget of {MAX_BUILD_SECONDS:g} s"
    text = (Path(_WORK["root"]) / rel).read_text(errors="replace")
    try:
        facts = walk_file(rel, module, text, _WORK["dests"], is_pkg)
    except UnreadFile as e:
        return str(e)
    blob = pickle.dumps(facts, protocol=pickle.HIGHEST_PROTOCOL)
    if len(blob) > MAX_FILE_RECORDS:
        return f"over {MAX_FILE_RECORDS / 2**20:g} MiB of records for one file"
    return blob


def _walk(
    root: str, files: list[tuple[str, str, bool]], dests: frozenset[str], workers: int, unread: Unread
) -> list[bytes]:
    """Every file's pickled facts, in read order, within the build's time and the tree's records;
    the rest go to `unread`. Facts are held pickled until written (`write_index` unpickles them a file at a
    time)."""
    deadline = time.monotonic() + MAX_BUILD_SECONDS
    out: list[bytes] = []

    def keep(results: Iterator[bytes | str]) -> None:
        total = 0
        for n, ((rel, _, _), got) in enumerate(zip(files, results, strict=False)):
            if isinstance(got, str):
                unread.add(rel, got)
                continue
            if total + len(got) > MAX_TREE_RECORDS:
                for later, _, _ in files[n:]:  # this one and every later one: the budget is spent
                    unread.add(
                        later, f"over the tree's budget of {MAX_TREE_RECORDS / 2**20:g} MiB of records"
                    )
                return
            out.append(got)
            total += len(got)

    if workers > 1:
        with ProcessPoolExecutor(workers, initializer=_start, initargs=(root, dests, deadline)) as pool:
            keep(pool.map(_walk_one, files, chunksize=8))
            pool.shutdown(cancel_futures=True)  # files not started once the records are spent
    else:
        _start(root, dests, deadline)
        keep(map(_walk_one, files))
    return out


def _private_fields(
    tree: SourceTree, files: list[tuple[str, str, bool]], dests: frozenset[str]
) -> frozenset[str]:
    """Settings argument resolution keeps beside the flags (`_x_explicitly_set`, declared in a class
    of argument code that declares flags too): resolution may change them with a flag, and what
    reads them decides (their reads are indexed like a flag's)."""
    out: set[str] = set()
    for rel, _, _ in files:
        if not is_config_path(rel):
            continue
        try:
            module = ast.parse((tree.root / rel).read_text(errors="replace"))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for cls in (n for n in ast.walk(module) if isinstance(n, ast.ClassDef)):
            names = [
                s.target.id
                for s in cls.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            ]
            if any(n in dests for n in names):
                out |= {n for n in names if n.startswith("_") and not n.startswith("__")}
    return frozenset(out)


def build_index(tree: SourceTree, db: Path, *, workers: int = 2) -> FlagIndex:
    """Walk every serving-path file of `tree` (in `workers` processes) into a new index at `db`,
    within the tree's budgets (`flag_index.budget`): what is left unread is named in the index."""
    catalog = flag_catalog(tree)
    unread = Unread()
    files = _files(tree, unread)
    dests = frozenset(f.dest for f in catalog)
    dests |= _private_fields(tree, files, dests)
    if workers > 1 and threading.active_count() > 1:
        # forking a multi-threaded process (the agent researches from worker threads) can deadlock
        # on a lock another thread holds, and spawn re-runs the caller's __main__: build in a fresh
        # interpreter instead (`python -m tools.research.index ROOT VERSION DB`), which may fork freely
        argv = [sys.executable, "-m", "tools.research.index", str(tree.root), tree.version, str(db)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode == 0 and db.is_file():
            return FlagIndex(db)
        workers = 1  # the subprocess failed (e.g. no `tools` on its path): walk in this process
    blobs = _walk(str(tree.root), files, dests, workers, unread)
    tmp = db.with_suffix(f".tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)
    db.parent.mkdir(parents=True, exist_ok=True)
    write_index(tmp, tree, catalog, blobs, unread)
    os.replace(tmp, db)  # readers never see a half-written index
    prefix = db.name.rsplit("-", 1)[0] + "-"
    for old in db.parent.glob(prefix + "*"):  # earlier builds of this tree, their status caches
        if old != db and old.name.startswith(prefix) and not old.name.startswith(db.stem):
            old.unlink(missing_ok=True)
    return FlagIndex(db)


_LOADED: dict[tuple[str, str], FlagIndex] = {}


def index_path(tree: SourceTree, cache_dir: Path | None = None) -> Path:
    """Where the index of `tree` lives on disk: `<version>-<tree>-<digest>.sqlite`. The tree part
    keeps two trees (or installs) of one version apart, so a rebuild replaces only its own tree's
    older indexes (see `build_index`)."""
    digest = _digest(tree)
    safe = "".join(c if c.isalnum() or c in ".-_" else "_" for c in tree.version or "unknown")
    where = hashlib.sha256(str(tree.root.resolve()).encode()).hexdigest()[:8]
    name = f"{safe.replace('-', '_')}-{where}-{digest}.sqlite"
    return cache_folder("flag-index", cache_dir) / name  # the cache checked first: this process unpickles it


BUILD_SECONDS = 150.0
"""A first build of a version's code index: ~2 minutes for SGLang 0.5.23 on two cores (the README)."""


def index_ready(tree: SourceTree, *, cache_dir: Path | None = None) -> bool:
    """Whether the index of `tree` is in memory or on disk (`load_index` then builds nothing)."""
    return _loaded_key(tree) in _LOADED or index_path(tree, cache_dir).is_file()


def _loaded_key(tree: SourceTree) -> tuple[str, str]:
    """The key of `tree`'s index among those this process has opened (`_LOADED`)."""
    return str(tree.root.resolve()), tree.version


def load_index(
    tree: SourceTree,
    *,
    cache_dir: Path | None = None,
    rebuild: bool = False,
    progress: Callable[[str], None] | None = None,
) -> FlagIndex:
    """The index of `tree`: from memory, else from disk, else built and saved. `progress(text)` is
    called once before a build (a minute or two; the caller shows it)."""
    key = _loaded_key(tree)
    if not rebuild and key in _LOADED:
        return _LOADED[key]
    path = index_path(tree, cache_dir)
    with cache_lock(path):  # another process building this tree's index: wait for it, then read it
        index: FlagIndex | None = None
        if path.is_file() and not rebuild:
            try:
                index = FlagIndex(path)
            except (sqlite3.Error, KeyError, pickle.UnpicklingError):
                index = None  # a damaged file is rebuilt
        if index is None:
            if progress is not None:
                progress(f"building the code index of SGLang {tree.version} (once per source tree)")
            index = build_index(tree, path)
    index.root = tree.root  # the code itself, for what the records do not hold (`alike.acts_alike`)
    _LOADED[key] = index
    return index


# `python -m tools.research.index ROOT VERSION DB`: build one index (see build_index)
if __name__ == "__main__":
    from tools.research.source import local_source

    build_index(local_source(Path(sys.argv[1]), version=sys.argv[2]), Path(sys.argv[3]))
