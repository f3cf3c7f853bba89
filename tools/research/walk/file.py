"""One source file walked once for the flag index: flag reads, calls, exits, locals, imports.

Every fact is kept as source text plus line numbers (cheap to pickle, re-parsed only when a guard is
evaluated). Guards are the conditions a statement runs under inside its function: enclosing
`if`/`while` tests (negated in `else`), and the negation of every earlier `if c: return|raise` in
the same block (an early exit). Exits are `raise`, failing `assert`, guarded fallbacks (a
warning followed by `return`, or a warning that switches a setting off) and overrides (a guarded
`return {"dest": value}` of an argument-resolution pass).
"""

from __future__ import annotations

import ast
import re

from tools.research.index_types import Call, Exit, Func, ModuleFacts, Read
from tools.research.walk import nodes
from tools.research.walk.names import loose_names, probed_tables, table_of, tested_only, typed_only
from tools.research.walk.nodes import parents as parents_in
from tools.research.walk.nodes import src, walk

_SERVER_ARGS = re.compile(r"(self\.)?server_args")
"""The receivers a later fill-in of a server argument is written through."""
LOG = re.compile(r"(^|\.)(warning|warn|error|info|debug|exception|print_warning|warning_once|info_once)$")
_EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)
_FAILED = "__an_exception_was_raised__"
_RAN_ON = "__no_earlier_return__"
"""Guards naming runtime conditions: they evaluate unknown, never true."""


def _may_leave(st: ast.stmt) -> bool:
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


def _message(node: ast.AST | None) -> str:
    if node is None:
        return ""
    for sub in walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and len(sub.value) > 3:
            parts = [s.value for s in walk(node) if isinstance(s, ast.Constant) and isinstance(s.value, str)]
            return " ".join("".join(parts).split())[:200]
    return src(node)[:200]


def _bare_exit(body: list[ast.stmt]) -> bool:
    """A block that only leaves: ends in `raise`/`continue`/`break`/`return` without a value (or
    `return None`); `return 1` is the branch's result, not an early exit."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, ast.Return):
        return last.value is None or (isinstance(last.value, ast.Constant) and last.value.value is None)
    return isinstance(last, ast.Raise | ast.Continue | ast.Break)


def _absolute(module: str, level: int, name: str | None, is_pkg: bool) -> str:
    if not level:
        return name or ""
    parts = module.split(".")
    base = parts if is_pkg else parts[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, name] if name else base)


def _short_circuit(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[str]:
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


class _Walker:
    """Walks one module; `dests` limits which attribute names count as flag reads."""

    def __init__(self, facts: ModuleFacts, dests: frozenset[str], is_pkg: bool):
        self.m, self.dests, self.is_pkg = facts, dests, is_pkg
        self.func: Func | None = None
        self.cls: str | None = None
        self.loaded: set[str] = set()
        self.declared: set[str] = set()
        """Module globals the current function declares `global` (assigning them stores)."""
        self.twice: set[str] = set()
        """Module names assigned in two places outside an `except` (no constant)."""
        self.follow: frozenset[str] = frozenset()
        """Module globals whose loads count as reads (of `path::name`): a flag's value stored there."""
        self.aliases: dict[str, str] = {}
        """`from x import Name as Alias`: Alias -> Name (calls, uses and bases under the real name)."""

    # ---- statements --------------------------------------------------------------------------
    def body(self, stmts: list[ast.stmt], guards: list[str]) -> None:
        extra: list[str] = []
        for st in stmts:
            self.stmt(st, guards + extra)
            if isinstance(st, ast.If) and not st.orelse and st.body and isinstance(st.body[-1], _EXITS):
                if self.func is not None and isinstance(st.body[-1], ast.Return):
                    test = [*guards, src(st.test)]  # an earlier early return also returns
                    self.func.gates.append(Exit("return", st.lineno, src(st.body[-1]), test))
                extra.append(neg(st.test))
            elif self.func is not None and isinstance(st, ast.If) and not st.orelse and _may_leave(st):
                # `if c: ... return ...` nested: the rest runs when c fails, or when the branch did not return
                extra.append(f"{neg(st.test)} or {_RAN_ON}")
            elif self.func is not None and _may_leave(st) and _RAN_ON not in extra:
                # after a loop/try/branch that can return, the rest runs only when it did not:
                # a runtime condition (why: `for ...: return x` then `raise "none found"`)
                extra.append(_RAN_ON)

    def stmt(self, st: ast.stmt, guards: list[str]) -> None:
        if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef):
            self.function(st)
        elif isinstance(st, ast.ClassDef):
            outer, self.cls = self.cls, st.name
            fields = self.m.classes.setdefault(st.name, [])
            for s in st.body:
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                    fields.append(s.target.id)
            if any("Enum" in src(b) for b in st.bases):  # `class Mode(Enum): DECODE = "decode"`
                self.m.enums[st.name] = {  # a member without a constant (`auto()`) equals no raw value
                    t.id: s.value.value if isinstance(s.value, ast.Constant) else f"\x00{st.name}.{t.id}"
                    for s in st.body
                    if isinstance(s, ast.Assign)
                    for t in s.targets
                    if isinstance(t, ast.Name) and not t.id.startswith("_")
                }
            for d in st.decorator_list:
                self.expr(d, guards, st)
            # a subclass runs the base's methods: `FlagIndex.subclasses` follows its construction
            self.m.bases[st.name] = [self.real(src(b).rsplit(".", 1)[-1]) for b in st.bases]
            self.body(st.body, [])
            self.cls = outer
        elif isinstance(st, ast.If | ast.While):
            self.expr(st.test, guards, st)
            self.body(st.body, [*guards, src(st.test)])
            self.body(st.orelse, [*guards, neg(st.test)])
            if isinstance(st, ast.If):
                self.fallback(st, guards)
        elif isinstance(st, ast.For | ast.AsyncFor | ast.With | ast.AsyncWith):
            for e in [getattr(st, "iter", None), *(i.context_expr for i in getattr(st, "items", []))]:
                if e is not None:
                    self.expr(e, guards, st)
            self.body(st.body, guards)
            self.body(getattr(st, "orelse", []), guards)
        elif isinstance(st, ast.Try) or type(st).__name__ == "TryStar":
            self.body(st.body, guards)
            for h in st.handlers:
                self.body(h.body, [*guards, _FAILED])  # runs only when something failed at runtime
            self.body(st.orelse, guards)
            self.body(st.finalbody, guards)
        elif isinstance(st, ast.Import | ast.ImportFrom):
            self.imports(st, guards)
        elif self.func is None and self.cls is None and (table := table_of(st)) is not None:
            self.m.tables.setdefault(table[0], []).extend(table[1])
            if isinstance(st.value, ast.Dict):  # type: ignore[union-attr]
                self.m.keyed.add(table[0])
            self.assign(st, guards)
        else:
            if isinstance(st, ast.Raise) and self.func is not None:
                exc = src(st.exc.func if isinstance(st.exc, ast.Call) else st.exc) if st.exc else "re-raise"
                self.func.exits.append(Exit("raise", st.lineno, _message(st.exc), guards, exc))
            elif isinstance(st, ast.Assert) and self.func is not None:
                msg = _message(st.msg) or src(st.test)
                self.func.exits.append(
                    Exit("assert", st.lineno, msg, [*guards, neg(st.test)], "AssertionError")
                )
            self.assign(st, guards)
            self.self_set(st, guards)
            for child in ast.iter_child_nodes(st):
                if isinstance(child, ast.expr) and not (
                    isinstance(st, ast.AnnAssign) and child is st.annotation
                ):
                    self.expr(child, guards, st)

    def function(self, st: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer, outer_loaded, outer_declared = self.func, self.loaded, self.declared
        qual = f"{self.cls}.{st.name}" if self.cls and outer is None else st.name
        if outer is not None:
            qual = f"{outer.qual}.{st.name}"
        a = st.args
        params = [p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]]
        f = Func(qual, self.m.path, st.lineno, st.end_lineno or st.lineno, params)
        for d in st.decorator_list:
            if isinstance(d, ast.Call) and d.args and isinstance(d.args[0], ast.Constant):
                name = src(d.func).rsplit(".", 1)[-1]
                if name.lstrip("_").startswith("register") and isinstance(d.args[0].value, str):
                    f.keys.append((name, d.args[0].value))
        body = st.body[1:] if ast.get_docstring(st) is not None else st.body
        body = [s for s in body if not isinstance(s, ast.Import | ast.ImportFrom)]  # lazy imports
        if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
            f.value = src(body[0].value)
        f.gives = any(
            isinstance(n, ast.Return) and not (n.value is None or _is_none(n.value)) for n in walk(st)
        )
        self.m.funcs.append(f)
        self.func = f
        self.loaded = {n.id for n in walk(st) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        self.declared = set()
        for node in walk(st):
            if isinstance(node, ast.Global):  # a module global rebound at runtime is no constant
                self.m.rebound.update(node.names)
                self.declared.update(node.names)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                f.locals[node.target.id] = None  # `x += 1`: not a single assignment
        if [p for p in params if p not in ("self", "cls")]:
            f.stores = _setter_stores(body, self.declared)
        f.uses = _param_uses(st, [q for q in params if q not in ("self", "cls")])
        f.tested = tested_only(st)
        f.probed = probed_tables(st)
        f.typed, f.receivers = typed_only(st)
        first = len(self.m.reads)
        self.body(st.body, [])
        for read in self.m.reads[first:]:
            if read.local and read.store is None and read.func == qual:
                read.store = _local_store(st, read.local, self.declared)
        self.func, self.loaded, self.declared = outer, outer_loaded, outer_declared

    def assign(self, st: ast.stmt, guards: list[str]) -> None:
        if not isinstance(st, ast.Assign | ast.AnnAssign) or st.value is None:
            return
        targets = st.targets if isinstance(st, ast.Assign) else [st.target]
        for t in targets:
            if (
                isinstance(t, ast.Tuple)
                and self.func is not None
                and not any(isinstance(e, ast.Starred) for e in t.elts)
            ):  # `major, minor = get_device_capability()`: each name is an item of the value
                for i, e in enumerate(t.elts):
                    if isinstance(e, ast.Name):
                        seen = e.id in self.func.locals
                        self.func.locals[e.id] = None if seen else f"({src(st.value)})[{i}]"
            if (
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
                and self.cls is not None
            ):
                self.m.attrs.append((self.cls, t.attr, src(st.value)))
                if self.func is not None:  # `self.mode = Mode(cfg.x)` then `if self.mode == ...:`
                    seen = f"self.{t.attr}" in self.func.locals
                    self.func.locals[f"self.{t.attr}"] = None if seen else src(st.value)
            if isinstance(t, ast.Name):
                if self.func is None and t.id in self.m.consts:
                    # `try: import zmq; ok = True / except ImportError: ok = False`: the value
                    # where the import worked; two values otherwise (if/else): no constant
                    if _FAILED not in guards:
                        self.twice.add(t.id)
                elif self.func is None:
                    self.m.consts[t.id] = src(st.value)
                else:
                    seen = t.id in self.func.locals
                    self.func.locals[t.id] = None if seen else src(st.value)

    def self_set(self, st: ast.stmt, guards: list[str]) -> None:
        """`self.<dest> = <constant>` in a method: a value the code gives a flag by itself;
        `server_args.<dest> = <value>` outside argument code: a value it fills in later (`fill`)."""
        if self.func is None or not isinstance(st, ast.Assign):
            return
        for t in st.targets:
            if not isinstance(t, ast.Attribute) or t.attr not in self.dests:
                continue
            value = src(st.value)
            if src(t.value) == "self" and isinstance(st.value, ast.Constant):
                self.func.sets.append(
                    Exit("assign", st.lineno, src(st), list(guards), sets=[t.attr], values=[value])
                )
            elif _SERVER_ARGS.fullmatch(src(t.value)):
                self.func.sets.append(
                    Exit("fill", st.lineno, src(st), list(guards), sets=[t.attr], values=[value])
                )

    def fallback(self, st: ast.If, guards: list[str]) -> None:
        """`if c: logger.warning(...); return` or `...; self.x = False`: a guarded fallback;
        `if c: return {"dest": value}`: an override of other arguments (a resolution pass)."""
        if self.func is None:
            return
        logs = [n for s in st.body for n in walk(s) if isinstance(n, ast.Call) and LOG.search(src(n.func))]
        last = st.body[-1]
        if isinstance(last, ast.Return) and isinstance(last.value, ast.Dict) and last.value.keys:
            keys = [k.value if isinstance(k, ast.Constant) else None for k in last.value.keys]
            if all(k in self.dests for k in keys):
                message = _message(logs[0]) if logs else f"returns {src(last.value)}"
                values = [src(v) for v in last.value.values]
                guard = [*guards, src(st.test)]
                self.func.exits.append(Exit("override", st.lineno, message, guard, sets=keys, values=values))
                return
        if not logs:
            return
        sets = [
            t.attr
            for s in st.body
            if isinstance(s, ast.Assign)
            and isinstance(s.value, ast.Constant)
            and s.value.value in (False, None)
            for t in s.targets
            if isinstance(t, ast.Attribute)
        ]
        if sets or isinstance(st.body[-1], ast.Return):
            self.func.exits.append(
                Exit("fallback", st.lineno, _message(logs[0]), [*guards, src(st.test)], sets=sets)
            )

    def imports(self, st: ast.Import | ast.ImportFrom, guards: list[str]) -> None:
        if isinstance(st, ast.Import):
            names = [a.name for a in st.names]
        else:
            base = _absolute(self.m.module, st.level, st.module, self.is_pkg)
            names = [base] + [f"{base}.{a.name}" for a in st.names]
        (self.func.imports if self.func is not None else self.m.imports).extend(names)
        keys = tuple(self.func.keys) if self.func is not None else ()
        self.m.edges.extend((n, tuple(guards), keys) for n in names)

    # ---- expressions -------------------------------------------------------------------------
    def expr(self, root: ast.expr, guards: list[str], st: ast.AST) -> None:
        parents = parents_in(root)
        called: set[ast.AST] = set()
        refs = self.func.refs if self.func is not None else self.m.refs
        for node in walk(root):
            dest = self.read_dest(node)
            if dest is not None:
                self.read(node, dest, parents, guards, st, root)
            elif isinstance(node, ast.Call):
                called.add(node.func)
                name = src(node.func).rsplit(".", 1)[-1]
                name = self.real(name) if isinstance(node.func, ast.Name) else name
                builtin = src(node.func).startswith("object.")  # `object.__setattr__(self, ...)`
                if self.func is not None and name and name.isidentifier() and not builtin:
                    self.func.calls.append(
                        Call(
                            name,
                            node.lineno,
                            [*guards, *_short_circuit(node, parents)],
                            [src(a) for a in node.args],
                            {k.arg: src(k.value) for k in node.keywords if k.arg},
                            isinstance(st, ast.Expr) and st.value is node,
                        )
                    )
            elif (
                isinstance(node, ast.Name | ast.Attribute)
                and node not in called
                and isinstance(node.ctx, ast.Load)
            ):
                # a function passed on (`partial(f, x)`) is called somewhere no call edge shows
                refs.append(self.real(node.id) if isinstance(node, ast.Name) else node.attr)

    def real(self, name: str) -> str:
        """The imported name behind an alias (`BaseController` for `Controller`), else `name`."""
        return self.aliases.get(name, name)

    def read_dest(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in self.follow:
            return f"{self.m.path}::{node.id}"
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in self.dests:
            return node.attr
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
            if isinstance(key, ast.Constant) and key.value in self.dests:
                return key.value
        if isinstance(node, ast.Call) and node.args:
            name = src(node.func).rsplit(".", 1)[-1]
            if name in ("getattr", "hasattr", "get"):
                key = node.args[1] if name != "get" and len(node.args) > 1 else node.args[0]
                if isinstance(key, ast.Constant) and key.value in self.dests:
                    return key.value
        return None

    def read(self, node, dest, parents, guards, st, root) -> None:  # noqa: ANN001
        chain, cur = [node], node
        while cur in parents:
            cur = parents[cur]
            chain.append(cur)
        if any(isinstance(c, ast.Call) and src(c.func).rsplit(".", 1)[-1] == "add_argument" for c in chain):
            return
        extra, cond = [], None
        for child, parent in zip(chain, chain[1:], strict=False):
            if isinstance(parent, ast.IfExp) and child is not parent.test:
                extra.append(src(parent.test) if child is parent.body else neg(parent.test))
            if isinstance(parent, ast.BoolOp | ast.UnaryOp | ast.Compare) or (
                isinstance(parent, ast.IfExp) and child is parent.test
            ):
                cond = src(parent.test if isinstance(parent, ast.IfExp) else parent)
        if isinstance(st, ast.If | ast.While) and node in walk(st.test):
            cond = src(st.test)
        effect, inert, local = self.effect(chain, st, dest)
        store, passed_to = self.sink(node, chain, st)
        receiver = src(node.value) if isinstance(node, ast.Attribute | ast.Subscript) else src(node)
        self.m.reads.append(
            Read(
                dest,
                self.m.path,
                node.lineno,
                self.func.qual if self.func else "<module>",
                self.cls,
                receiver,
                [*guards, *extra],
                cond,
                local,
                effect,
                inert,
                isinstance(st, ast.If) and not st.orelse and _bare_exit(st.body),
                store,
                passed_to,
            )
        )

    def sink(self, node: ast.AST, chain: list[ast.AST], st: ast.AST) -> tuple[str | None, str | None]:
        """Where the read's value goes when it only moves on: the target it is stored in (another
        object's attribute, a `global`), or the function it is passed to as an argument."""
        for child, parent in zip(chain, chain[1:], strict=False):
            if isinstance(parent, ast.Call):
                if child is parent.func:
                    return None, None  # `cfg.x.method()`: the value is the receiver, not an argument
                return None, src(parent.func).rsplit(".", 1)[-1] or None
            if isinstance(parent, ast.Lambda | ast.comprehension | ast.Subscript):
                return None, None
        if not isinstance(st, ast.Assign | ast.AnnAssign) or st.value is None or node not in walk(st.value):
            return None, None
        targets = st.targets if isinstance(st, ast.Assign) else [st.target]
        if targets and all(_stored(t, self.declared if self.func else set()) for t in targets):
            return ", ".join(src(t) for t in targets), None
        return None, None

    def effect(self, chain: list[ast.AST], st: ast.AST, dest: str) -> tuple[str | None, bool, str | None]:
        for c in chain:
            if isinstance(c, ast.Call) and LOG.search(src(c.func)):
                return "only logged", True, None
        if isinstance(st, ast.Assign | ast.AnnAssign):
            targets = st.targets if isinstance(st, ast.Assign) else [st.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if names and len(names) == len(targets):
                if self.func is not None and not any(n in self.loaded for n in names):
                    return f"assigned to {', '.join(names)}, never used", True, None
                return f"assigned to {', '.join(names)}", False, names[0]
            return f"assigned to {', '.join(src(t) for t in targets)}", False, None
        if isinstance(st, ast.If | ast.While):
            if _only_logs([*st.body, *st.orelse]):
                return "only logged", True, None  # `if not cfg.x: logger.info("x is on")`
            return "controls a branch", False, None
        calls = [c for c in chain[1:] if isinstance(c, ast.Call)]
        if calls:
            return f"passed to {src(calls[0].func)}()", False, None
        return None, False, None


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _stored(target: ast.expr, declared: set[str]) -> bool:
    """An assignment target that keeps the value for later: an attribute, a declared global."""
    return isinstance(target, ast.Attribute) or (isinstance(target, ast.Name) and target.id in declared)


def _param_uses(func: ast.AST, params: list[str]) -> dict[str, list[tuple[str, str]]]:
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


def _only_logs(stmts: list[ast.stmt]) -> bool:
    """Whether a branch does nothing but log (or pass)."""
    return bool(stmts) and all(
        isinstance(st, ast.Pass)
        or (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and LOG.search(src(st.value.func)))
        for st in stmts
    )


def _local_store(func: ast.AST, local: str, declared: set[str]) -> str | None:
    """The module global a local only travels into (`backend = cfg.x; if backend == "auto": backend
    = "cutlass"; X = Backend(backend)` with `global X`), or None when the local is used otherwise."""
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
    loads = [
        n for n in walk(func) if isinstance(n, ast.Name) and n.id == local and isinstance(n.ctx, ast.Load)
    ]
    return target if target and all(n in allowed for n in loads) else None


def _picks(node: ast.If, local: str) -> bool:
    """Whether an `if`/`elif` chain only assigns `local` in each branch."""

    def assigns(b: ast.stmt) -> bool:
        return isinstance(b, ast.Assign) and [src(t) for t in b.targets] == [local]

    orelse = node.orelse
    tail = len(orelse) == 1 and isinstance(orelse[0], ast.If) and _picks(orelse[0], local)
    return all(assigns(b) for b in node.body) and (tail or all(assigns(b) for b in orelse))


def _setter_stores(body: list[ast.stmt], declared: set[str]) -> list[tuple[str, int]]:
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
        if not all(_stored(t, declared) for t in targets):
            return []
        stores += [(src(t), st.lineno) for t in targets]
    return stores


def walk_file(path: str, module: str, text: str, dests: frozenset[str], is_pkg: bool) -> ModuleFacts:
    """The index facts of one file (an unparsable file gives empty facts)."""
    facts = ModuleFacts(path, module)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return facts
    try:
        return _walk_tree(tree, facts, dests, is_pkg)
    finally:
        nodes.forget()


def _walk_tree(tree: ast.Module, facts: ModuleFacts, dests: frozenset[str], is_pkg: bool) -> ModuleFacts:
    path, module = facts.path, facts.module
    walker = _Walker(facts, dests, is_pkg)
    walker.aliases = {
        a.asname: a.name
        for n in walk(tree)
        if isinstance(n, ast.ImportFrom)
        for a in n.names
        if a.asname and a.asname != a.name
    }
    walker.body(tree.body, [])
    facts.loose = loose_names(tree.body)
    facts.loads = {n.attr for n in walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)}
    for name in walker.twice:
        facts.consts.pop(name, None)
    stored = {t for f in facts.funcs for t, _ in f.stores} | {r.store or "" for r in facts.reads}
    stored = {t for t in stored if t.isidentifier() and t in facts.rebound}
    if stored:  # where the module reads what a flag's value was stored in (`path::name` reads)
        scratch = ModuleFacts(path, module)
        follower = _Walker(scratch, frozenset(), is_pkg)
        follower.follow = frozenset(stored)
        follower.body(tree.body, [])
        facts.reads += scratch.reads
    for name in facts.rebound:
        facts.consts.pop(name, None)
    return facts
