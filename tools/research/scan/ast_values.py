"""Values of a flag definition read with `ast` for the catalog (`tools.research.catalog`): a parsed
file with its module-level constants, literal values, a dataclass's field defaults and the type an
annotation names."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from tools.research.source import SourceTree


class ParsedModule:
    """A parsed file plus its module-level constants, for resolving `choices=SOME_LIST`."""

    def __init__(self, tree: SourceTree, path: Path):
        self.rel = tree.rel(path)
        try:
            self.node = ast.parse(path.read_text(errors="replace"), filename=str(path))
        except (RecursionError, MemoryError):  # the parser's own limits, as a syntax error is
            raise SyntaxError(f"{self.rel}: nested too deeply for Python to parse") from None
        self.constants: dict[str, ast.expr] = {}
        for stmt in self.node.body:
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
            ):
                self.constants[stmt.targets[0].id] = stmt.value
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
                self.constants[stmt.target.id] = stmt.value


def literal_value(node: ast.expr | None, names: dict[str, ast.expr] | None = None) -> Any:
    """A literal value, a resolved module constant, or the source text of the expression."""
    if node is None:
        return None
    if isinstance(node, ast.Name) and names and node.id in names:
        return literal_value(names[node.id])
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.JoinedStr | ast.BinOp):
        parts = []
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                parts.append(sub.value)
        if parts:
            return "".join(parts)
    return node_text(node)


def node_text(node: ast.AST) -> str | None:
    """`ast.unparse(node)`, or None for a node nested past Python's stack (its value is not known)."""
    try:
        return ast.unparse(node)
    except RecursionError:
        return None


def as_list(value: Any) -> list[Any] | None:
    """A choices value as a list (a set sorted by text, a scalar as a one-item list; None stays None)."""
    if value is None:
        return None
    if isinstance(value, list | tuple | set | frozenset):
        return sorted(value, key=str) if isinstance(value, set | frozenset) else list(value)
    return [value]


def dataclass_defaults(mod: ParsedModule, class_name: str) -> dict[str, Any]:
    """Field defaults of `class_name` in a module: literal values, or source text when computed."""
    out: dict[str, Any] = {}
    for node in ast.walk(mod.node):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    out[stmt.target.id] = literal_value(stmt.value, mod.constants)
    return out


def unwrap_type(node: ast.expr) -> tuple[str | None, list[Any] | None]:
    """`Optional[Literal["a", "b"]]` → ("str", ["a", "b"]); `List[int]` → ("list[int]", None);
    (None, None) for an annotation nested past Python's stack."""
    try:
        return _unwrap(node)
    except RecursionError:
        return None, None


def _unwrap(node: ast.expr) -> tuple[str, list[Any] | None]:
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value).split(".")[-1]
        inner = node.slice
        if head == "Optional":
            return _unwrap(inner)
        if head == "Union" and isinstance(inner, ast.Tuple):
            rest = [e for e in inner.elts if ast.unparse(e) != "None"]
            return _unwrap(rest[0]) if len(rest) == 1 else (ast.unparse(node), None)
        if head == "Literal":
            values = [literal_value(e) for e in (inner.elts if isinstance(inner, ast.Tuple) else [inner])]
            return (type(values[0]).__name__ if values else "str"), values
        if head in ("List", "list"):
            return f"list[{_unwrap(inner)[0]}]", None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [s for s in (node.left, node.right) if ast.unparse(s) != "None"]
        if len(sides) == 1:
            return _unwrap(sides[0])
    return ast.unparse(node), None
