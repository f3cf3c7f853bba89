"""One source file walked once for the flag index: flag reads, calls, exits, locals, imports.

Every fact is kept as source text plus line numbers (cheap to pickle, re-parsed only when a guard is
evaluated). Guards are the conditions a statement runs under inside its function: enclosing
`if`/`while` tests (negated in `else`), and the negation of every earlier `if c: return|raise` in
the same block (an early exit). Exits are `raise`, failing `assert`, guarded fallbacks (a
warning followed by `return`, or a warning that switches a setting off) and overrides (a guarded
`return {"dest": value}` of an argument-resolution pass).

Its helpers are in `shapes.py` (a statement's or expression's shape), `bodies.py` (a body's uses
and stores) and `record.py` (what the walker records of a statement or expression).
"""

from __future__ import annotations

import ast
import math
import re
import time

from tools.research.flag_index.budget import MAX_DEPTH, MAX_FILE_ENTRIES, MAX_FILE_SECONDS, MAX_GUARDS
from tools.research.index_types import Exit, Func, ModuleFacts
from tools.research.walk import nodes
from tools.research.walk.bodies import is_none, local_store, param_uses, setter_stores, straight_reassigned
from tools.research.walk.names import (
    attribute_holders,
    implicit_init,
    loose_names,
    probed_tables,
    table_entries,
    table_of,
    tested_only,
    typed_only,
)
from tools.research.walk.nodes import src, walk
from tools.research.walk.record import Recorder
from tools.research.walk.shapes import CUT, FAILED, RAN_ON, exit_message, may_leave, neg

_EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)


class UnreadFile(Exception):
    """A file the index leaves unread, and why (`str(e)`): nested too deeply, or too slow to walk."""


class _Walker(Recorder):
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
            if time.monotonic() > _DEADLINE[0]:
                raise UnreadFile(f"over {MAX_FILE_SECONDS:g} s to walk")
            if len(self.m.funcs) + len(self.m.reads) > MAX_FILE_ENTRIES:
                raise UnreadFile(f"more than {MAX_FILE_ENTRIES:,} functions and reads in one file")
            self.stmt(st, _kept(guards + extra))
            if isinstance(st, ast.If) and not st.orelse and st.body and isinstance(st.body[-1], _EXITS):
                if self.func is not None and isinstance(st.body[-1], ast.Return):
                    test = [*guards, src(st.test)]  # an earlier early return also returns
                    self.func.gates.append(Exit("return", st.lineno, src(st.body[-1]), test))
                extra.append(neg(st.test))
            elif self.func is not None and isinstance(st, ast.If) and not st.orelse and may_leave(st):
                # `if c: ... return ...` nested: the rest runs when c fails, or when the branch did not return
                extra.append(f"{neg(st.test)} or {RAN_ON}")
            elif self.func is not None and may_leave(st) and RAN_ON not in extra:
                # after a loop/try/branch that can return, the rest runs only when it did not:
                # a runtime condition (why: `for ...: return x` then `raise "none found"`)
                extra.append(RAN_ON)
            if len(extra) > MAX_GUARDS:  # a thousand early returns in a row: one runtime condition
                extra[MAX_GUARDS - 1 :] = [CUT]

    def stmt(self, st: ast.stmt, guards: list[str]) -> None:
        """Walk one statement under `guards` (the conditions it runs on). One piece because it is one
        dispatch, one case per statement type, each passing its own guards down to its body."""
        if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef):
            self.function(st)
        elif isinstance(st, ast.ClassDef):
            outer, self.cls = self.cls, st.name
            fields = self.m.classes.setdefault(st.name, [])
            for s in st.body:
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                    fields.append(s.target.id)
                if (computed := computed_by(s)) is not None:
                    self.m.computed[computed[0]] = computed[1]
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
            if implicit_init(st) and outer is None and self.func is None:
                # built by calls of its name: its construction is followed like any constructor's
                end = st.end_lineno or st.lineno
                self.m.funcs.append(Func(f"{st.name}.__init__", self.m.path, st.lineno, end, ["self"]))
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
                self.body(h.body, [*guards, FAILED])  # runs only when something failed at runtime
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
                self.func.exits.append(Exit("raise", st.lineno, exit_message(st.exc), guards, exc))
            elif isinstance(st, ast.Assert) and self.func is not None:
                msg = exit_message(st.msg) or src(st.test)
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
        # an `assert` before the return changes no value it gives (`assert _PP is not None; return _PP`)
        body = (
            [s for s in body if not isinstance(s, ast.Assert)]
            if body and isinstance(body[-1], ast.Return)
            else body
        )
        if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
            f.value = src(body[0].value)
        f.gives = any(
            isinstance(n, ast.Return) and not (n.value is None or is_none(n.value)) for n in walk(st)
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
            f.stores = setter_stores(body, self.declared)
        f.uses = param_uses(st, [q for q in params if q not in ("self", "cls")])
        f.tested = tested_only(st)
        f.probed = probed_tables(st)
        f.typed, f.receivers = typed_only(st)
        f.entries = {self.real(name): e for name, e in table_entries(st).items()}
        first = len(self.m.reads)
        self.body(st.body, [])
        f.assigned = straight_reassigned(st, f.assigned)
        stores: dict[str, str | None] = {}  # one answer per local: a local read anew each line
        for read in self.m.reads[first:]:
            if read.local and read.store is None and read.func == qual:
                if read.local not in stores:
                    stores[read.local] = local_store(st, read.local, self.declared)
                read.store = stores[read.local]
        self.func, self.loaded, self.declared = outer, outer_loaded, outer_declared


def _kept(guards: list[str]) -> list[str]:
    """`guards`, or past `MAX_GUARDS` its first ones and `CUT` (unknown, as runtime state is)."""
    return guards if len(guards) <= MAX_GUARDS else [*guards[: MAX_GUARDS - 1], CUT]


_DEADLINE = [math.inf]
"""When the file being walked must be done (`MAX_FILE_SECONDS` from its start)."""


def walk_file(path: str, module: str, text: str, dests: frozenset[str], is_pkg: bool) -> ModuleFacts:
    """The index facts of one file (an unparsable file gives empty facts). Raises `UnreadFile` for
    a file nested more than `MAX_DEPTH` levels (the walker and the guard evaluator recurse: a
    1,000-term `a + a + ...` would exhaust Python's stack), too deeply for Python to parse, taking
    more than `MAX_FILE_SECONDS` to walk or giving more than `MAX_FILE_ENTRIES` functions and reads
    (both checked statement by statement: a generated file stops early, not after its whole walk)."""
    facts = ModuleFacts(path, module)
    _DEADLINE[0] = time.monotonic() + MAX_FILE_SECONDS
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return facts
    except (RecursionError, MemoryError):  # the parser's own limits: a very deep expression
        raise UnreadFile("nested too deeply to parse") from None
    try:
        if nodes.depth(tree) > MAX_DEPTH:
            raise UnreadFile(f"nested more than {MAX_DEPTH} levels deep")
        return _walk_tree(tree, facts, dests, is_pkg)
    except RecursionError:  # within the limit, yet too deep for the stack in hand
        raise UnreadFile("nested too deeply to walk") from None
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
    facts.held = {walker.real(name): attrs for name, attrs in attribute_holders(tree.body).items()}
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


def computed_by(st: ast.stmt) -> tuple[str, str] | None:
    """(field, dotted function) of a class-level field declared with the function computing it
    (`attn_tp_size = Derived(fn="sglang.srt.runtime_context.attn_tp_size_of", doc=...)`)."""
    if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)):
        return None
    if not isinstance(st.value, ast.Call):
        return None
    for k in st.value.keywords:
        value = k.value.value if isinstance(k.value, ast.Constant) else None
        if k.arg == "fn" and isinstance(value, str) and re.fullmatch(r"\w+(\.\w+)+", value):
            return st.targets[0].id, value
    return None
