"""A flag value that acts only through tests answering alike with and without it (issue 53).

`backend = args.x; if backend == "auto" and sm100: ...; b = Backend(backend); if b.is_cutedsl():
...; _BACKEND = b` with the default `auto` and the trial `torch` on an SM120 GPU: every test the
code makes of the value (the `if`s, the enum's predicates, here and where a getter hands the stored
member out) gives the same answer for both values, so nothing the server does changes. Read from
the reader function's source (the index keeps records, not code): every use of the local holding
the flag, of an enum member built from it, and of a module global it is stored in, must sit in a
branch that runs with neither value, in a test that answers alike, or be such a predicate's call.
Anything else (an argument, a format, a return, a test left open) keeps the reader running."""

from __future__ import annotations

import ast
from typing import Any

from tools.research.callers import idle_here
from tools.research.flag_index.lookup import FlagIndex
from tools.research.guard_eval import evaluate
from tools.research.guards.terms import UNKNOWN, Env, Member
from tools.research.index_types import Func, Read
from tools.research.reach import env_at
from tools.research.source_code import function_node, parsed_source

ALIKE = "every test of its value answers alike with it and without it here"
"""How a reader's `Finding.why` starts when its value acts only through such tests."""
MAX_GETTER_SITES = 40
"""Call sites of a getter of the stored member examined (0.5.23's `get_bf16_gemm_backend`: 4)."""
_TESTS = (ast.If, ast.While, ast.IfExp, ast.Assert)


class _Uses:
    """The uses of the flag's value in one function, each asked whether it answers alike."""

    def __init__(self, index: FlagIndex, func: Func, envs: tuple[Env, Env]):
        self.index, self.func, self.envs = index, func, envs
        self.enums = index.enums
        self.tests: list[str] = []
        self.idle_callers: list[str] = []
        self.dependent = False
        """Some answer with the flag came from its value (else the value was never seen)."""

    def env_at(self, env: Env, line: int) -> Env:
        return env_at(self.func, set(self.func.assigned), line, env)

    def both(self, text: str, line: int) -> tuple[Any, Any]:
        """`text`'s value at `line` with the flag and without it."""
        with_, without = (evaluate(text, self.env_at(env, line)) for env in self.envs)
        self.dependent |= with_.flag_dependent
        return with_.value, without.value

    def runs_with_neither(self, node: ast.AST, parents: dict[ast.AST, ast.AST], top: ast.AST) -> bool:
        """`node` sits in a branch whose test fails (or, in an `else`, holds) with either value."""
        child, up = node, parents.get(node)
        while up is not None and up is not top:
            if isinstance(up, ast.If | ast.While | ast.IfExp) and child is not up.test:
                with_, without = self.both(ast.unparse(up.test), up.lineno)
                if with_ is not UNKNOWN and with_ == without:
                    taken = bool(with_)
                    in_body = child in up.body if isinstance(up.body, list) else child is up.body
                    if in_body != taken:
                        return True
            child, up = up, parents.get(up)
        return False

    def test_of(self, node: ast.AST, parents: dict[ast.AST, ast.AST], top: ast.AST) -> ast.AST | None:
        """The whole test `node` is part of (an `if`/`while`/`assert` test, a conditional's), or None."""
        child, up = node, parents.get(node)
        while up is not None and up is not top:
            if isinstance(up, _TESTS) and child is up.test:
                return up.test
            if not isinstance(up, ast.expr):
                return None
            child, up = up, parents.get(up)
        return None

    def alike(self, test: ast.AST) -> bool:
        with_, without = self.both(ast.unparse(test), test.lineno)
        if with_ is UNKNOWN or without is UNKNOWN or bool(with_) != bool(without):
            return False
        self.tests.append(f"`{ast.unparse(test)}` ({bool(with_)})")
        return True

    def check(self, fnode: ast.AST, parents: dict[ast.AST, ast.AST], local: str) -> bool:
        """Every use of `local` (and of enum members built from it) in `fnode` answers alike."""
        tracked = {local}
        globals_ = {n for st in ast.walk(fnode) if isinstance(st, ast.Global) for n in st.names}
        names = sorted(
            (n for n in ast.walk(fnode) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)),
            key=lambda n: (n.lineno, n.col_offset),
        )
        for name in names:
            if name.id not in tracked or self.runs_with_neither(name, parents, fnode):
                continue
            up = parents.get(name)
            if (test := self.test_of(name, parents, fnode)) is not None:
                if not self.alike(test):
                    return False
                continue
            stmt = parents.get(up) if up is not None else None
            built = (
                isinstance(up, ast.Call)
                and ast.unparse(up.func) in self.enums
                and up.args == [name]
                and isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
            )
            if built:
                tracked.add(stmt.targets[0].id)  # type: ignore[union-attr]
                continue
            stored = (
                isinstance(up, ast.Assign)
                and len(up.targets) == 1
                and isinstance(up.targets[0], ast.Name)
                and up.targets[0].id in globals_
            )
            if stored and self.stored_alike(up.targets[0].id, name, self.func.path):  # type: ignore[union-attr]
                continue
            return False
        return True

    def stored_alike(self, global_name: str, name: ast.Name, rel: str) -> bool:
        """A member stored in a module global: the two members (with and without the flag) answer
        every predicate the global's getters are asked alike, and nothing else reads the global."""
        members = self.both(name.id, name.lineno)
        if not all(isinstance(m, Member) for m in members):
            return False
        owner = str(members[0]).partition(".")[0]
        parsed = parsed_source(self.index, rel)
        if parsed is None or str(members[1]).partition(".")[0] != owner:
            return False
        module = self.index.modules.get(rel)
        dotted = f"{module.module}.{global_name}" if module else None
        if dotted is None or any(dotted in m.imports for m in self.index.modules.values()):
            return False  # `from x import _BACKEND`: read where this module cannot see
        tree, parents = parsed
        getters = []
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Name) and node.id == global_name and isinstance(node.ctx, ast.Load)):
                continue
            fn = parents.get(node)
            while fn is not None and not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                fn = parents.get(fn)
            up = parents.get(node)
            if isinstance(up, ast.Compare) and ast.unparse(up).endswith("is None"):
                continue  # `if _X is None:` (set before use)
            if isinstance(up, ast.Attribute) and isinstance(parents.get(up), ast.Call):
                if self.predicate_alike(owner, up.attr, members):
                    continue
                return False
            if isinstance(up, ast.Return) and fn is not None and not fn.args.args:
                getters.append(fn.name)
                continue
            return False
        return all(self.getter_alike(g, owner, members, rel) for g in getters)

    def predicate_alike(self, owner: str, method: str, members: tuple[Any, Any]) -> bool:
        """`member.method()` answers alike for both members (a method of the enum without arguments)."""
        answers = [evaluate(f"{m}.{method}()", self.envs[0]).value for m in members]
        if any(a is UNKNOWN for a in answers) or answers[0] != answers[1]:
            return False
        self.tests.append(f"`.{method}()` of {members[0]} and {members[1]} ({answers[0]})")
        return True

    def getter_alike(self, getter: str, owner: str, members: tuple[Any, Any], module: str) -> bool:
        """Every call of `getter()` that can run here is the receiver of a predicate answering alike
        for both members."""
        func = next((f for f in self.index.funcs_in(module) if f.qual == getter), None)
        sites = self.index.call_sites(func, limit=MAX_GETTER_SITES, uses=True) if func else None
        if sites is None:
            return False
        for caller, call in sites:
            if why := idle_here(self.index, caller, self.envs[0].facts, self.envs[0].flag):
                self.idle_callers.append(f"`{getter}()` in {caller.qual} does not run here ({why})")
                continue
            parsed = parsed_source(self.index, caller.path) if call is not None else None
            if parsed is None or call is None:
                return False
            tree, parents = parsed
            calls = [
                node
                for node in ast.walk(tree)
                if isinstance(node, ast.Call)
                and node.lineno == call.line
                and ast.unparse(node.func).rsplit(".", 1)[-1] == getter
            ]
            for node in calls or [None]:
                up = parents.get(node) if node is not None else None
                if not (isinstance(up, ast.Attribute) and isinstance(parents.get(up), ast.Call)):
                    return False
                if not self.predicate_alike(owner, up.attr, members):
                    return False
        return True


def acts_alike(index: FlagIndex, read: Read, func: Func, envs: tuple[Env, Env]) -> str | None:
    """Why the flag's value, held in `read.local`, acts only through tests answering alike with it
    and without it here (`envs`: with the flag, without it), or None."""
    parsed = parsed_source(index, read.path) if read.local is not None else None
    fnode = function_node(parsed[0], func.line) if parsed is not None else None
    if fnode is None or parsed is None or read.local is None:
        return None
    uses = _Uses(index, func, envs)
    if not uses.check(fnode, parsed[1], read.local) or not uses.tests or not uses.dependent:
        return None
    idle = uses.idle_callers
    more = f" (+{len(idle) - 1} more such callers)" if len(idle) > 1 else ""
    return f"{ALIKE}: " + "; ".join([", ".join(uses.tests[:4]), *idle[:1]]) + more
