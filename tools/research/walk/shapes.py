"""The shape of a statement or an expression as the file walker (`walk.file`) asks it: a log call,
a block that can leave early or only leaves, an exit's message, a relative import made absolute,
the conditions under which a node of an expression is evaluated at all, and the two guards that
name runtime conditions."""

from __future__ import annotations

import ast
import re

from tools.research.walk.nodes import src, walk

LOG = re.compile(r"(^|\.)(warning|warn|error|info|debug|exception|print_warning|warning_once|info_once)$")
FAILED = "__an_exception_was_raised__"
RAN_ON = "__no_earlier_return__"
CUT = "__guards_past_the_cap__"
"""Guards naming runtime conditions: they evaluate unknown, never true."""


def may_leave(st: ast.stmt) -> bool:
    """A compound statement with a `return` somewhere inside (nested functions aside)."""
    if not isinstance(st, ast.For | ast.AsyncFor | ast.While | ast.Try | ast.With | ast.AsyncWith | ast.If):
        return False
    return _returns(st)


def _returns(node: ast.AST) -> bool:
    """A `return` in the statements under `node` (a return is a statement: expressions need no look)."""
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, field, ()):
            if isinstance(child, ast.Return):
                return True
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and _returns(
                child
            ):
                return True
    return False


def neg(node: ast.expr) -> str:
    """`not (test)` as text."""
    return f"not ({src(node)})"


def exit_message(node: ast.AST | None) -> str:
    """The message of an exit (a raise's or a log call's argument): its string constants joined when
    one is longer than 3 characters, else its source; at most 200 characters."""
    if node is None:
        return ""
    for sub in walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and len(sub.value) > 3:
            parts = [s.value for s in walk(node) if isinstance(s, ast.Constant) and isinstance(s.value, str)]
            return " ".join("".join(parts).split())[:200]
    return src(node)[:200]


def bare_exit(body: list[ast.stmt]) -> bool:
    """A block that only leaves: ends in `raise`/`continue`/`break`/`return` without a value (or
    `return None`); `return 1` is the branch's result, not an early exit."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, ast.Return):
        return last.value is None or (isinstance(last.value, ast.Constant) and last.value.value is None)
    return isinstance(last, ast.Raise | ast.Continue | ast.Break)


def absolute_import(module: str, level: int, name: str | None, is_pkg: bool) -> str:
    """The dotted module a relative import (`from ..x import y` in `module`) names."""
    if not level:
        return name or ""
    parts = module.split(".")
    base = parts if is_pkg else parts[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, name] if name else base)


def short_circuit(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[str]:
    """What must hold for `node` to be evaluated inside its expression: the operands before it in
    `a and b and f()` (`not a` in `a or f()`), the test of the `x if t else y` branch it is in."""
    out: list[str] = []
    while node in parents:
        parent = parents[node]
        if isinstance(parent, ast.BoolOp):
            before = parent.values[: parent.values.index(node)]  # its operands are its only children
            out += [src(v) if isinstance(parent.op, ast.And) else neg(v) for v in before]
        elif isinstance(parent, ast.IfExp) and node is not parent.test:
            out.append(src(parent.test) if node is parent.body else neg(parent.test))
        elif isinstance(parent, ast.Lambda | ast.comprehension):
            break
        node = parent
    return out
