"""What surrounds one read of a flag, for the reader scan (`tools.research.readers`): the conditions
it runs under (guards) and its function, what follows from it (its effect), and whether it is part of
an `add_argument` call."""

from __future__ import annotations

import ast
import re

_LOG_CALLS = re.compile(
    r"(^|\.)(debug|info|warning|warn|error|exception|print|print_warning|print_deprecated_warning)$"
)
_MAX_GUARD = 240


def _clip(node: ast.expr, *, negate: bool = False) -> str:
    """A condition as one short line; `or`-expressions parenthesized so guards can be and-joined."""
    text = " ".join(ast.unparse(node).split())
    if negate:
        text = f"not ({text})" if isinstance(node, ast.BoolOp | ast.Compare | ast.IfExp) else f"not {text}"
    elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) or isinstance(node, ast.IfExp):
        text = f"({text})"
    return text if len(text) <= _MAX_GUARD else text[: _MAX_GUARD - 3] + "..."


def _guards(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> tuple[list[str], str, ast.AST]:
    """Conditions around `node`, its function's name, and the statement that holds it."""
    guards: list[str] = []
    statement: ast.AST | None = None
    child, parent = node, parents.get(node)
    while parent is not None and not isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        if statement is None and isinstance(parent, ast.stmt):
            statement = parent
        if isinstance(parent, ast.BoolOp):
            idx = parent.values.index(child)
            if isinstance(parent.op, ast.And):
                guards += [_clip(v) for v in parent.values if v is not child]
            else:
                guards += [_clip(v, negate=True) for v in parent.values[:idx]]
        elif isinstance(parent, ast.If | ast.While | ast.IfExp) and child is not parent.test:
            in_else = child in (parent.orelse if isinstance(parent.orelse, list) else [parent.orelse])
            guards.append(_clip(parent.test, negate=in_else))
        elif isinstance(parent, ast.ClassDef):
            break
        child, parent = parent, parents.get(parent)
    function = parent.name if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef) else "<module>"
    return guards, function, statement or node


def _effect(
    node: ast.AST, statement: ast.AST, parents: dict[ast.AST, ast.AST], dest: str
) -> tuple[str | None, bool]:
    """What follows from the read, and whether nothing does (only logged, or stored and never used)."""
    chain, current = [], node
    while current is not statement and current in parents:
        chain.append(current)
        current = parents[current]
    for inner in chain:
        if isinstance(inner, ast.Call) and _LOG_CALLS.search(ast.unparse(inner.func)):
            return "only logged", True
    if isinstance(statement, ast.Assign | ast.AnnAssign):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        names = [ast.unparse(t) for t in targets]
        if all(isinstance(t, ast.Name) for t in targets):
            scope = statement
            while scope in parents and not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
                scope = parents[scope]
            used = [
                n.lineno
                for n in ast.walk(scope)
                if isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load)
            ]
            if not used and scope is not statement:
                return f"assigned to {', '.join(names)}, never used", True
            return (
                f"assigned to {', '.join(names)} (used at lines {', '.join(map(str, sorted(set(used))[:8]))})",
                False,
            )
        return f"assigned to {', '.join(names)}", False
    if isinstance(statement, ast.If | ast.While) and (node is statement.test or statement.test in chain):
        writes = sorted(_writes(statement.body) - {dest})
        return (f"sets {', '.join(writes)}" if writes else "controls a branch"), False
    if calls := [c for c in chain if isinstance(c, ast.Call) and c.func not in chain]:
        return (
            f"passed to {ast.unparse(calls[0].func)}()",
            False,
        )  # forwarded, e.g. `_set(phase, "max_bs", x)`
    return None, False


def _writes(body: list[ast.stmt]) -> set[str]:
    """Config names a block assigns: `x.name = ...`, `f(..., name=...)`, `return {"name": ...}`."""
    out: set[str] = set()
    for node in (n for stmt in body for n in ast.walk(stmt)):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.Call) and not _LOG_CALLS.search(ast.unparse(node.func)):
            out.update(k.arg for k in node.keywords if k.arg)
        elif isinstance(node, ast.Return) and isinstance(node.value, ast.Dict):
            out.update(
                k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
            )
    return out


def _in_add_argument(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            return True
        if isinstance(node, ast.stmt):
            return False
    return False
