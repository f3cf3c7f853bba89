"""The bounds of one index build, per tree: which files are read and in what order, and what is left
unread and why (`tools.research.index.build_index` keeps them; the verdict's notes name the files).

A file is bounded by its size (`serving_path.MAX_FILE_BYTES`), its nesting, its walk's time and its
records; a record by its guards; a tree by the bytes and files read, the wall time of the walk and
the records kept; a setting by its reads. Each limit is several times what SGLang 0.5.23 needs (the
figure beside each is that tree's): a real tree is never cut, a hostile one is cut where a limit is
reached, and the files left unread are named (benchmarks/bench_research_bounds.py measures both).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tools.research.flag_index.serving_path import is_config_path

MAX_TREE_BYTES = 96 * 2**20
"""Source bytes read per tree. SGLang 0.5.23's serving path is 2,140 files, 34.7 MiB (36.4 MB); it
grows fast (0.5.9: 12.9 MiB, 0.5.15: 22.8 MiB), hence the room."""
MAX_TREE_FILES = 8_000
"""Files read per tree (0.5.23: 2,140)."""
MAX_BUILD_SECONDS = 600.0
"""Wall time of the walk; files not started by then are left unread. 0.5.23's whole cold build
takes 50-70 s with two workers on a loaded 2-core machine, ~35 s of it walking."""
MAX_DEPTH = 100
"""Levels of one file's syntax tree (0.5.23's deepest: 39, `parser/conversation.py`). The walker's
recursion breaks near 350 levels (a 350-term `a + a + ...`); a deeper file is left unread."""
MAX_FILE_SECONDS = 30.0
"""Wall time of one file's walk (0.5.23's slowest: 0.44 s, `model_loader/weight_utils.py`); a
slower file is left unread. A file's statements are checked as they are walked."""
MAX_GUARDS = 128
"""Guards kept on one record, a read, a call or an exit (0.5.23's most: 29); past it the first
ones and one runtime condition that stands for the rest (unknown, never true)."""
MAX_FILE_ENTRIES = 5_000
"""Functions and reads one file may give (0.5.23's most: 552, `mem_cache/memory_pool.py`); counted
as the file is walked, so a generated file of thousands is left unread early."""
MAX_FILE_RECORDS = 4 * 2**20
"""Pickled bytes of what one file contributes (0.5.23's most: 0.43 MiB, `managers/scheduler.py`)."""
MAX_TREE_RECORDS = 160 * 2**20
"""Pickled bytes of what the whole tree contributes (0.5.23: 46.5 MiB)."""
MAX_READS = 16_000
"""Reads kept per setting, in read order (0.5.23's most: 4,345 of `device`, a name many objects'
attributes share; `page_size` has 1,699, `tp_size` 767)."""
MAX_NAMED = 12
"""Files a note names before it counts the rest."""
TYPICAL_FILE_BYTES = 2**20
"""Files up to this size are read in path order, larger ones after them, smallest first (0.5.23's
largest: 0.27 MiB): a tree padded with big generated files reads its own code first."""


def read_order(files: list[tuple[str, int]]) -> list[int]:
    """The order `files` ((path, size) pairs) are read in, as indexes: argument code first (the flags'
    definitions and resolution), then files of a typical size in path order, then larger ones by size."""

    def key(i: int) -> tuple[int, int, str]:
        path, size = files[i]
        if is_config_path(path):
            return (0, 0, path)
        return (1, 0, path) if size <= TYPICAL_FILE_BYTES else (2, size, path)

    return sorted(range(len(files)), key=key)


@dataclass
class Unread:
    """Files left out of an index, by reason (`over the tree's 96 MiB budget`, `nested 1003 levels
    deep`, ...): the reason -> the files, in read order."""

    by_reason: dict[str, list[str]] = field(default_factory=dict)

    def add(self, path: str, reason: str) -> None:
        self.by_reason.setdefault(reason, []).append(path)

    def notes(self) -> list[str]:
        """One line per reason: `not read (<reason>): a, b and 3 more`."""
        return [f"not read ({reason}): {named(paths)}" for reason, paths in self.by_reason.items()]

    def __len__(self) -> int:
        return sum(len(p) for p in self.by_reason.values())


def named(paths: list[str], limit: int = MAX_NAMED) -> str:
    """`a, b, c` or, past `limit`, the first ones `and N more`."""
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def within_budget(files: list[tuple[str, int]], unread: Unread) -> list[int]:
    """The indexes of `files` ((path, size) pairs) read, in read order, within the tree's bytes and
    files; the rest are added to `unread`."""
    kept: list[int] = []
    total = 0
    spent = ""  # once a budget is spent, every later file is left unread for it
    for i in read_order(files):
        path, size = files[i]
        if not spent and len(kept) >= MAX_TREE_FILES:
            spent = f"over the tree's budget of {MAX_TREE_FILES:,} files"
        elif not spent and total + size > MAX_TREE_BYTES:
            spent = f"over the tree's budget of {MAX_TREE_BYTES / 2**20:g} MiB of source"
        if spent:
            unread.add(path, spent)
            continue
        kept.append(i)
        total += size
    return kept
