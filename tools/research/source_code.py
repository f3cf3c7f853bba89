"""The code of an indexed tree itself, for what the index's records do not hold: a file's syntax
tree and each node's parent, parsed once per file (`FlagIndex.root` is the tree the index was
loaded for; without it nothing is read)."""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path
from typing import Protocol

Parsed = tuple[ast.Module, dict[ast.AST, ast.AST]]


class Rooted(Protocol):
    """An index that knows its tree (`FlagIndex`; named so, the index can read its own code)."""

    root: Path | None


def parsed_source(index: Rooted, rel: str) -> Parsed | None:
    """The syntax tree of `rel` (a path relative to the tree root) and each node's parent, or None
    when the index has no tree or the file cannot be read or parsed."""
    return None if index.root is None else _parsed(Path(index.root) / rel)


@lru_cache(maxsize=256)
def _parsed(path: Path) -> Parsed | None:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, RecursionError, MemoryError, ValueError):
        return None
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    return tree, parents


def function_node(tree: ast.Module, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function defined at `line` (its `def`), or None."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.lineno == line:
            return node
    return None
