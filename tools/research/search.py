"""Code search over a `SourceTree`: ripgrep when available, a pure-Python twin otherwise.

Both engines walk the tree in the same order (path components compared one by one, like
`rg --sort path`), skip hidden files, and stop after `max_results` matching lines, saying so.
Every path is relative to the tree root, so a match reads as `path:line`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from tools.research.source import SourceTree


class SearchError(Exception):
    """A bad pattern, glob or path."""


@dataclass(frozen=True)
class Match:
    """One matching line: `path` relative to the tree root, 1-based `line`."""

    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text.strip()}"


@dataclass
class SearchResult:
    """Matches in path order; `truncated` when more matched than `max_results`."""

    matches: list[Match] = field(default_factory=list)
    truncated: bool = False
    engine: str = "python"


@lru_cache(maxsize=1)
def rg_binary() -> str | None:
    """The `rg` of this venv (the `ripgrep` PyPI package) or on PATH, else None."""
    beside = Path(sys.executable).parent / "rg"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("rg")


def glob_regex(glob: str) -> re.Pattern[str]:
    """A gitignore-style glob as a regex: without `/` it matches the file name at any depth."""
    if "/" not in glob.strip("/"):
        glob = "**/" + glob.strip("/")
    out, i = [], 0
    glob = glob.lstrip("/")
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob[i] == "[" and "]" in glob[i + 1 :]:
            end = glob.index("]", i + 1)
            inner = glob[i + 1 : end].replace("\\", "\\\\")
            out.append("[" + ("^" + inner[1:] if inner.startswith("!") else inner) + "]")
            i = end + 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def list_files(tree: SourceTree, glob: str = "*") -> list[str]:
    """Files under the tree root matching `glob`, relative, in path order (hidden files skipped)."""
    rx = glob_regex(glob)
    found: list[str] = []

    def walk(directory: Path, prefix: str) -> None:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name.encode())
        except OSError:
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            rel = prefix + entry.name
            if entry.is_dir(follow_symlinks=False):
                walk(Path(entry.path), rel + "/")
            elif entry.is_file() and rx.match(rel):
                found.append(rel)

    walk(tree.root, "")
    return found


def grep(
    tree: SourceTree,
    pattern: str,
    *,
    glob: str | None = None,
    max_results: int = 200,
    fixed: bool = False,
    ignore_case: bool = False,
    engine: str | None = None,
) -> SearchResult:
    """Lines matching the regex `pattern` (a literal when `fixed`), at most `max_results` of them.

    `engine` forces "rg" or "python"; by default ripgrep is used when installed.
    """
    if max_results < 1:
        raise SearchError("max_results must be at least 1")
    try:
        rx = re.compile(re.escape(pattern) if fixed else pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as e:
        raise SearchError(f"bad pattern {pattern!r}: {e}") from e
    use_rg = engine == "rg" or (engine is None and rg_binary() is not None)
    if use_rg:
        return _grep_rg(tree, pattern, glob, max_results, fixed, ignore_case)
    return _grep_python(tree, rx, glob, max_results)


def _grep_python(tree: SourceTree, rx: re.Pattern[str], glob: str | None, limit: int) -> SearchResult:
    result = SearchResult(engine="python")
    for rel in list_files(tree, glob or "*"):
        data = (tree.root / rel).read_bytes()
        if b"\0" in data[:8192]:
            continue
        for number, raw in enumerate(data.split(b"\n"), start=1):
            text = raw.decode("utf-8", errors="replace")
            if rx.search(text):
                if len(result.matches) == limit:
                    result.truncated = True
                    return result
                result.matches.append(Match(rel, number, text))
    return result


def _grep_rg(
    tree: SourceTree, pattern: str, glob: str | None, limit: int, fixed: bool, ignore_case: bool
) -> SearchResult:
    binary = rg_binary()
    if binary is None:
        raise SearchError("ripgrep (rg) is not installed")
    argv = [binary, "--no-config", "--no-ignore", "--sort", "path", "--line-number", "--with-filename"]
    argv += ["--no-heading", "--color", "never", "--null"]
    argv += ["--fixed-strings"] if fixed else []
    argv += ["--ignore-case"] if ignore_case else []
    argv += ["--glob", glob] if glob else []
    # An explicit path and a closed stdin: with a piped stdin and no path, rg searches stdin instead.
    argv += ["--regexp", pattern, "."]
    result = SearchResult(engine="rg")
    popen_kw = {
        "cwd": tree.root,
        "stdin": subprocess.DEVNULL,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
    }
    with subprocess.Popen(argv, **popen_kw) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            path, _, rest = raw.rstrip(b"\n").partition(b"\0")
            path = path.removeprefix(b"./")
            number, _, text = rest.partition(b":")
            if len(result.matches) == limit:
                result.truncated = True
                proc.kill()
                break
            result.matches.append(
                Match(path.decode("utf-8", "replace"), int(number), text.decode("utf-8", errors="replace"))
            )
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode == 2 and not result.matches and "No files were searched" not in stderr:
        raise SearchError(f"rg failed: {stderr.strip()[:300]}")
    return result


def read_range(tree: SourceTree, path: str, start: int, end: int) -> str:
    """Lines `start`..`end` (1-based, inclusive) of `path`, each prefixed with its number."""
    target = (tree.root / path).resolve()
    if not target.is_relative_to(tree.root.resolve()) or not target.is_file():
        raise SearchError(f"{path}: no such file in the source tree")
    if start < 1 or end < start:
        raise SearchError(f"bad range {start}-{end}")
    lines = target.read_text(errors="replace").split("\n")
    width = len(str(min(end, len(lines))))
    return "\n".join(f"{n:>{width}}  {lines[n - 1]}" for n in range(start, min(end, len(lines)) + 1))
