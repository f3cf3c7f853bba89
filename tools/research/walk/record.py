"""What the file walker (`walk.file._Walker`) records of a statement (assignments, the values a
method gives a flag, guarded fallbacks and overrides, imports) and of an expression (calls, flag
reads, what a read feeds and where its value goes). `_Walker` inherits these methods; they read
and fill its module facts and current function."""

from __future__ import annotations

import ast
import re

from tools.research.index_types import Call, Exit, Read
from tools.research.walk.bodies import is_stored, only_logs
from tools.research.walk.nodes import parents as parents_in
from tools.research.walk.nodes import src, walk
from tools.research.walk.shapes import (
    FAILED,
    LOG,
    absolute_import,
    bare_exit,
    exit_message,
    neg,
    short_circuit,
)

_SERVER_ARGS = re.compile(r"(self\.)?server_args")
"""The receivers a later fill-in of a server argument is written through."""


class Recorder:
    """`_Walker`'s recording methods (see `walk.file._Walker` for the attributes they read)."""

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
                    if FAILED not in guards:
                        self.twice.add(t.id)
                elif self.func is None:
                    self.m.consts[t.id] = src(st.value)
                else:
                    seen = t.id in self.func.locals
                    self.func.locals[t.id] = None if seen else src(st.value)
                    self.func.assigned.setdefault(t.id, []).append((st.lineno, list(guards), src(st.value)))

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
                message = exit_message(logs[0]) if logs else f"returns {src(last.value)}"
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
                Exit("fallback", st.lineno, exit_message(logs[0]), [*guards, src(st.test)], sets=sets)
            )

    def imports(self, st: ast.Import | ast.ImportFrom, guards: list[str]) -> None:
        if isinstance(st, ast.Import):
            names = [a.name for a in st.names]
        else:
            base = absolute_import(self.m.module, st.level, st.module, self.is_pkg)
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
                            [*guards, *short_circuit(node, parents)],
                            [src(a) for a in node.args],
                            {k.arg: src(k.value) for k in node.keywords if k.arg},
                            isinstance(st, ast.Expr) and st.value is node,
                            _receiver(node.func),
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
                isinstance(st, ast.If) and not st.orelse and bare_exit(st.body),
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
        if targets and all(is_stored(t, self.declared if self.func else set()) for t in targets):
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
            if only_logs([*st.body, *st.orelse]):
                return "only logged", True, None  # `if not cfg.x: logger.info("x is on")`
            return "controls a branch", False, None
        calls = [c for c in chain[1:] if isinstance(c, ast.Call)]
        if calls:
            return f"passed to {src(calls[0].func)}()", False, None
        return None, False, None


def _receiver(func: ast.expr) -> str | None:
    """`self` of `self.f(...)`, `Fn` of `Fn.get_fn(...)`; None for a plain or deeper call."""
    return func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
