"""One file's syntax tree, asked the same questions many times, answered once (`walk.file`).

The index asks of every function its nodes several times over (its loads, its globals, its
parameters' uses, its type tests, each local's store), and of every expression its parents and its
source text: `ast.walk` and `ast.unparse` again and again were two thirds of a cold index build. A
node's answers are kept until `forget()`, which `walk_file` calls after each file.
"""

from __future__ import annotations

import ast
import math
import types

_NODES: dict[ast.AST, list[ast.AST]] = {}
_PARENTS: dict[ast.AST, dict[ast.AST, ast.AST]] = {}
_TEXT: dict[ast.AST, str] = {}
_ANNOTATIONS: dict[ast.AST, set[ast.AST]] = {}


def walk(root: ast.AST) -> list[ast.AST]:
    """`root` and every node under it, in `ast.walk`'s order (breadth first). Do not modify."""
    got = _NODES.get(root)
    if got is None:
        _index(root)
        got = _NODES[root]
    return got


def parents(root: ast.AST) -> dict[ast.AST, ast.AST]:
    """Every node under `root` -> its parent (`root` itself has none). Do not modify."""
    got = _PARENTS.get(root)
    if got is None:
        _index(root)
        got = _PARENTS[root]
    return got


def _index(root: ast.AST) -> None:
    """`walk(root)` and `parents(root)` in one pass."""
    order: list[ast.AST] = [root]
    up: dict[ast.AST, ast.AST] = {}
    for node in order:  # the list grows while it is read: breadth first
        for name in node._fields:
            value = getattr(node, name, None)
            if type(value) is list:
                for v in value:
                    if isinstance(v, ast.AST):
                        order.append(v)
                        up[v] = node
            elif isinstance(value, ast.AST):
                order.append(value)
                up[value] = node
    _NODES[root], _PARENTS[root] = order, up


def depth(root: ast.AST) -> int:
    """Levels from `root` down to its deepest node (`root` alone: 1), without recursion: `walk` is
    breadth first, so its last node is a deepest one; its parents are counted up to `root`."""
    up, node, levels = parents(root), walk(root)[-1], 1
    while node in up:
        node, levels = up[node], levels + 1
    return levels


def annotation_nodes(root: ast.AST) -> set[ast.AST]:
    """The nodes of every type annotation under `root` (parameters, returns, `x: T = ...`): naming a
    class there builds nothing and tests nothing. Do not modify."""
    got = _ANNOTATIONS.get(root)
    if got is None:
        todo: list[ast.AST] = []
        for node in walk(root):
            if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
                todo.append(node.annotation)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
                todo.append(node.returns)
        got = _ANNOTATIONS[root] = set()
        while todo:  # not `walk`: an annotation's pieces are never asked about again
            node = todo.pop()
            got.add(node)
            todo.extend(ast.iter_child_nodes(node))
    return got


def src(node: ast.AST) -> str:
    """One-line source text of a node (never clipped: guards are parsed again when evaluated)."""
    got = _TEXT.get(node)
    if got is None:
        got = _TEXT[node] = _plain(node) or " ".join(ast.unparse(node).split())
    return got


_ATOMS = ast.Name | ast.Attribute | ast.Constant | ast.Call | ast.Subscript
"""Nodes whose text never needs parentheses around it as an operand."""
_RANK = {ast.Or: 0, ast.And: 1, ast.UnaryOp: 2, ast.Compare: 3, ast.Constant: 99}
"""How tightly each binds, in the unparser's order (or, and, not, comparison; an atom tightest)."""
_COMPARE = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
            ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}  # fmt: skip


def _plain(node: ast.AST) -> str | None:
    """`ast.unparse`'s text of the commonest small nodes (names, dotted names, plain constants,
    subscripts, calls, comparisons and `and`/`or`/`not` of those), written without the unparser;
    None for any other node (tests/test_walk_nodes.py holds it to the unparser's text)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant):
        return _constant(node.value)
    if isinstance(node, ast.Attribute):
        inner = (
            _plain(node.value)
            if isinstance(node.value, ast.Name | ast.Attribute | ast.Call | ast.Subscript)
            else None
        )
        return None if inner is None else f"{inner}.{node.attr}"
    if isinstance(node, ast.Subscript):
        value = (
            _plain(node.value)
            if isinstance(node.value, ast.Name | ast.Attribute | ast.Call | ast.Subscript)
            else None
        )
        index = _operand(node.slice, ast.Name | ast.Attribute | ast.Constant)
        return None if value is None or index is None else f"{value}[{index}]"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
        parts = [_plain(node.func), *(_operand(a, _ATOMS) for a in node.args)]
        for k in node.keywords:
            value = _operand(k.value, _ATOMS)
            parts.append(None if value is None else f"{k.arg}={value}" if k.arg else f"**{value}")
        return None if None in parts else f"{parts[0]}({', '.join(parts[1:])})"  # type: ignore[arg-type]
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        parts = [_operand(node.left, _ATOMS), *(_operand(c, _ATOMS) for c in node.comparators)]
        if None in parts:
            return None
        text = parts[0] or ""
        for op, right in zip(node.ops, parts[1:], strict=True):
            text += f" {_COMPARE[type(op)]} {right}"
        return text
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        operand = _operand(node.operand, _ATOMS | ast.Compare)
        return None if operand is None else f"not {operand}"
    if isinstance(node, ast.BoolOp):
        # the unparser asks each later operand for a tighter binding (`a and not b == c and (d > e)`)
        parts, rank = [], _RANK[type(node.op)]
        for i, v in enumerate(node.values, start=1):
            text = _operand(v, _ATOMS | ast.Compare | ast.UnaryOp)
            own = _RANK.get(type(v), _RANK[ast.Constant])
            parts.append(None if text is None else f"({text})" if own < rank + i else text)
        joiner = " and " if isinstance(node.op, ast.And) else " or "
        return None if None in parts else joiner.join(parts)  # type: ignore[arg-type]
    return None


def _operand(node: ast.AST, kinds: type | types.UnionType) -> str | None:
    return _plain(node) if isinstance(node, kinds) else None


def _constant(value: object) -> str | None:
    if value is None or isinstance(value, bool | int):
        return repr(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    if isinstance(value, str) and value.isprintable() and "'" not in value and "\\" not in value:
        return repr(value) if " ".join(value.split()) == value else None  # src() folds runs of spaces
    return None


def forget() -> None:
    """Drop every kept answer (the file's tree is done with)."""
    _NODES.clear()
    _PARENTS.clear()
    _TEXT.clear()
    _ANNOTATIONS.clear()
