"""The counts written in the docs are the tree's: docs/architecture.md cannot drift, README.md stays short.

The fenced block under "## The tree" in docs/architecture.md has one row per package:
`├── name/   FILES   LINES   what it holds`, nested by indentation. A row counts the `.py` files
under its folder, its own and those of any subfolder that has no row of its own (`tests/fixtures/`,
`tools/research/startup/worker/`); `__pycache__` and hidden folders are skipped. FILES must match
exactly. LINES (`wc -l`: newline characters) must lie within 15% of the real figure, so an ordinary
edit does not fail the suite but a real change of size does. The "reads all N modules" sentence
must name the number of modules `tests/test_architecture.py` reads (every `.py` file under its
`PACKAGES`). On a failure the message lists the figures to write.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_architecture import PACKAGES

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
README = ROOT / "README.md"
README_MAX_LINES = 200
LINES_TOLERANCE = 0.15

ROW = re.compile(r"^(?P<indent>[│ ]*)[├└]── (?P<name>[\w.-]+)/\s+(?P<files>\d+)\s+(?P<lines>\d+)\b")


def tree_rows(text: str) -> dict[Path, tuple[int, int]]:
    """Folder (relative to the root) -> (files, lines) as written in the tree block."""
    block = text.split("## The tree", 1)[1].split("```", 2)[1]
    rows: dict[Path, tuple[int, int]] = {}
    parents: list[Path] = []
    for line in block.splitlines():
        m = ROW.match(line)
        if not m:
            continue
        depth = len(m["indent"]) // 4
        del parents[depth:]
        folder = (parents[-1] if parents else Path()) / m["name"]
        parents.append(folder)
        rows[folder] = (int(m["files"]), int(m["lines"]))
    return rows


def py_files(folder: Path) -> list[Path]:
    return [
        p
        for p in folder.rglob("*.py")
        if not any(part == "__pycache__" or part.startswith(".") for part in p.relative_to(ROOT).parts)
    ]


def counted(folder: Path, rows: dict[Path, tuple[int, int]]) -> tuple[int, int]:
    """(files, lines) of the `.py` files under `folder`, less the subfolders with a row of their own."""
    own = [
        p
        for p in py_files(ROOT / folder)
        if not any(
            other != folder and other in p.relative_to(ROOT).parents and folder in other.parents
            for other in rows
        )
    ]
    return len(own), sum(p.read_text(encoding="utf-8").count("\n") for p in own)


def test_tree_block_parses() -> None:
    rows = tree_rows(ARCHITECTURE.read_text(encoding="utf-8"))
    for folder in (Path("agent"), Path("tools/research/startup"), Path("sim"), Path("tests")):
        assert folder in rows, f"no row for {folder}/ in the tree block of {ARCHITECTURE.name}"


def test_tree_counts_match_the_tree() -> None:
    rows = tree_rows(ARCHITECTURE.read_text(encoding="utf-8"))
    wrong = []
    for folder, (files, lines) in rows.items():
        real_files, real_lines = counted(folder, rows)
        if files != real_files or abs(lines - real_lines) > LINES_TOLERANCE * real_lines:
            wrong.append(
                f"{folder}/: written {files} files {lines} lines, real {real_files} files {real_lines} lines"
            )
    assert not wrong, "docs/architecture.md's tree block is stale:\n" + "\n".join(wrong)


def test_module_count_matches_the_architecture_test() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    written = re.search(r"reads all (\d+) modules", text)
    assert written, "docs/architecture.md no longer says how many modules test_architecture.py reads"
    real = sum(len(py_files(ROOT / pkg)) for pkg in PACKAGES)
    assert int(written[1]) == real, (
        f"docs/architecture.md says 'reads all {written[1]} modules': it is {real}"
    )


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"
