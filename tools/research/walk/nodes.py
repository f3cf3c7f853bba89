"""One file's syntax tree, asked the same questions many times, answered once (`walk.file`).

The index asks of every function its nodes several times over (its loads, its globals, its
parameters' uses, its type tests, each local's store), and of every expression its parents and its
source text: `ast.walk` and `ast.unparse` again and again were two thirds of a cold index build. A
node's answers are kept until `forget()`, which `walk_file` calls after each file.
"""

from __future__ import annotations

import ast

_NODES: dict[ast.AST, list[ast.AST]] = {}
_PARENTS: dict[ast.AST, dict[ast.AST, ast.AST]] = {}
_TEXT: dict[ast.AST, str] = {}


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


def src(node: ast.AST) -> str:
    """One-line source text of a node (never clipped: guards are parsed again when evaluated)."""
    got = _TEXT.get(node)
    if got is None:
        got = _TEXT[node] = _plain(node) or " ".join(ast.unparse(node).split())
    return got


def _plain(node: ast.AST) -> str | None:
    """`ast.unparse`'s text of the commonest small nodes (names, dotted names, plain constants,
    calls of those), written without the unparser; None for any other node."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _plain(node.value) if isinstance(node.value, ast.Name | ast.Attribute | ast.Call) else None
        return None if inner is None else f"{inner}.{node.attr}"
    if isinstance(node, ast.Constant):
        v = node.value
        if v is None or isinstance(v, bool | int):
            return repr(v)
        plain = v.isprintable() and "'" not in v and "\\" not in v if isinstance(v, str) else False
        if plain and " ".join(v.split()) == v:  # src() folds runs of spaces, strings' too
            return repr(v)
        return None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
        parts = [_plain(node.func)]
        parts += [_plain(a) if not isinstance(a, ast.Call) else None for a in node.args]
        for k in node.keywords:
            value = None if isinstance(k.value, ast.Call) else _plain(k.value)
            parts.append(None if value is None else f"{k.arg}={value}" if k.arg else f"**{value}")
        if None in parts:
            return None
        return f"{parts[0]}({', '.join(parts[1:])})"  # type: ignore[arg-type]
    return None


def forget() -> None:
    """Drop every kept answer (the file's tree is done with)."""
    _NODES.clear()
    _PARENTS.clear()
    _TEXT.clear()
