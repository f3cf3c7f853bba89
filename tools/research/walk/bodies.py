"""What a function body does with a value, for the file walker (`walk.file`): how it uses its
parameters, the stores that keep a value (attributes, declared globals), a local that only travels
into a module global, a branch that only logs, a setter's targets."""

from __future__ import annotations

import ast

from tools.research.walk.nodes import parents as parents_in
from tools.research.walk.nodes import src, walk
from tools.research.walk.shapes import LOG


def is_none(node: ast.expr) -> bool:
    """The literal `None`."""
    return isinstance(node, ast.Constant) and node.value is None


def is_stored(target: ast.expr, declared: set[str]) -> bool:
    """An assignment target that keeps the value for later: an attribute, a declared global."""
    return isinstance(target, ast.Attribute) or (isinstance(target, ast.Name) and target.id in declared)


def param_uses(func: ast.AST, params: list[str]) -> dict[str, list[tuple[str, str]]]:
    """How the body of `func` uses each of `params` (see `Func.uses`); up to 16 parameters."""
    if not params or len(params) > 16:
        return {}
    wanted = set(params)
    parents = parents_in(func)
    uses: dict[str, list[tuple[str, str]]] = {}
    for node in walk(func):
        if not (isinstance(node, ast.Name) and node.id in wanted and isinstance(node.ctx, ast.Load)):
            continue
        use, cur = ("other", ""), node
        while cur in parents:
            parent = parents[cur]
            if isinstance(parent, ast.If | ast.While | ast.IfExp) and cur is parent.test:
                use = ("test", src(parent.test))
                break
            if isinstance(parent, ast.Assign) and cur is parent.value:
                targets = parent.targets
                if (
                    len(targets) == 1
                    and isinstance(targets[0], ast.Attribute)
                    and src(targets[0].value) == "self"
                ):
                    use = ("store", targets[0].attr)
                break
            if isinstance(parent, ast.stmt | ast.Call | ast.Lambda | ast.comprehension):
                break
            cur = parent
        uses.setdefault(node.id, []).append(use)
    return uses


def only_logs(stmts: list[ast.stmt]) -> bool:
    """Whether a branch does nothing but log (or pass)."""
    return bool(stmts) and all(
        isinstance(st, ast.Pass)
        or (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and LOG.search(src(st.value.func)))
        for st in stmts
    )


def local_store(func: ast.AST, local: str, declared: set[str]) -> str | None:
    """The module global a local only travels into (`backend = cfg.x; if backend == "auto": backend
    = "cutlass"; X = Backend(backend)` with `global X`; a log line may say it on the way), or None
    when the local is used otherwise. A local that is itself a declared global (`global X; X =
    Backend(cfg.x)`) is where the value is stored, whatever reads it next (0.5.9's
    `SPECULATIVE_MOE_RUNNER_BACKEND = ... else MOE_RUNNER_BACKEND`)."""
    if local in declared:
        return local
    allowed: set[ast.AST] = set()
    target = None
    for node in walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name == local or name in declared:
                allowed |= set(walk(node.value))
                if name != local and any(isinstance(n, ast.Name) and n.id == local for n in walk(node.value)):
                    if target not in (None, name):
                        return None
                    target = name
        elif isinstance(node, ast.If) and _picks(node, local):
            allowed |= set(walk(node.test))  # a test that only picks the local's value
        elif isinstance(node, ast.Call) and LOG.search(src(node.func)):
            allowed |= set(walk(node))  # `logger.warning(f"... {backend} ...")` only says it
    loads = [
        n for n in walk(func) if isinstance(n, ast.Name) and n.id == local and isinstance(n.ctx, ast.Load)
    ]
    return target if target and all(n in allowed for n in loads) else None


def _picks(node: ast.If, local: str) -> bool:
    """Whether an `if`/`elif` chain only assigns `local` in each branch (a branch may also log, or
    hold such a chain of its own: `if x == "auto": if env_a: x = "a" / else: if env_a: log(...)`)."""

    def picks(b: ast.stmt) -> bool:
        return (
            (isinstance(b, ast.Assign) and [src(t) for t in b.targets] == [local])
            or only_logs([b])
            or (isinstance(b, ast.If) and _picks(b, local))
        )

    return all(picks(b) for b in [*node.body, *node.orelse])


def setter_stores(body: list[ast.stmt], declared: set[str]) -> list[tuple[str, int]]:
    """The targets of a body that only stores (globals, attributes; values without calls), else []."""
    stores: list[tuple[str, int]] = []
    for st in body:
        if isinstance(st, ast.Global | ast.Pass):
            continue
        if not isinstance(st, ast.Assign | ast.AnnAssign) or st.value is None:
            return []
        if any(isinstance(n, ast.Call | ast.Await | ast.Yield | ast.YieldFrom) for n in walk(st.value)):
            return []
        targets = st.targets if isinstance(st, ast.Assign) else [st.target]
        if not all(is_stored(t, declared) for t in targets):
            return []
        stores += [(src(t), st.lineno) for t in targets]
    return stores


def straight_reassigned(
    func: ast.AST, assigned: dict[str, list[tuple[int, list[str], str]]]
) -> dict[str, list[tuple[int, list[str], str]]]:
    """Of `assigned` (each plain `x = <expr>` of a function), the names bound more than once, every
    binding one of those assignments and none in a loop: their values follow from the enclosing
    tests line by line. A name also bound otherwise (`for x in`, `x += 1`, `(x, y) = ...`, a nested
    function's own `x`) or in a loop's body is left out: its value at a line is not one of them."""
    bound: dict[str, int] = {}
    looped: set[str] = set()
    for node in walk(func):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):  # `x += 1` too
            bound[node.id] = bound.get(node.id, 0) + 1
        elif isinstance(node, ast.For | ast.AsyncFor | ast.While):
            looped |= {
                n.id
                for s in node.body + node.orelse
                for n in ast.walk(s)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
            }
    return {
        name: found
        for name, found in assigned.items()
        if len(found) > 1 and bound.get(name) == len(found) and name not in looped
    }
