"""Interprocedural reachability from a flag's reader to the exits it can trigger (issue 10, item 1).

From the reader's function, every `raise`, failing `assert` and guarded fallback at or after the
read whose path condition depends on the flag is an exit of the flag; so is every exit inside a
function called (at or after the read) under a flag-dependent guard or with a flag-dependent
argument, followed across modules to a bounded depth. Arguments are bound to the callee's
parameters, so `_resolve_backend(backend, ...)` evaluates the callee's `backend == "cutedsl"` with
the flag's value. The path condition is evaluated three-valued (`tools.research.guard_eval`).
"""

from __future__ import annotations

import ast
import copy
import re
from dataclasses import dataclass, field, replace
from typing import Any

from tools.research.flag_index.lookup import FlagIndex
from tools.research.guard_eval import UNKNOWN, evaluate, evaluate_all
from tools.research.guards.terms import Env, parse_guard
from tools.research.index_types import Func, Read

MAX_DEPTH = 3
MAX_FUNCS = 40
_IGNORED_EXC = ("NotImplementedError", "StopIteration", "KeyboardInterrupt", "re-raise")


@dataclass
class ExitPath:
    """An exit the flag can reach: where, what it says, through which calls, and whether it fires."""

    kind: str
    path: str
    line: int
    message: str
    exc: str
    via: list[str] = field(default_factory=list)
    truth: bool | None = None
    """True: fires on this deployment; False: cannot; None: depends on something unknown."""
    used: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    sets: list[str] = field(default_factory=list)
    values: list[str] = field(default_factory=list)
    """An override's values for `sets` (source text)."""

    @property
    def location(self) -> str:
        """`path:line`."""
        return f"{self.path}:{self.line}"


def locals_of(func: Func, module: Any) -> dict[str, str | None]:
    """The function's single-assigned locals, without module globals it rebinds (`global x; x = True`
    is no local constant: `if x: raise "ran twice"` must stay runtime state)."""
    rebound = getattr(module, "rebound", set()) if module is not None else set()
    return {k: v for k, v in func.locals.items() if k not in rebound} if rebound else func.locals


def _where(func: Func) -> str:
    return f"{func.path}::{func.qual}"


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _mentions(text: str, names: set[str]) -> bool:
    """Whether `text` uses one of `names` as a word (a substring test first: it is much cheaper)."""
    return any(n in text and re.search(rf"\b{re.escape(n)}\b", text) for n in names)


def value_at(func: Func, name: str, line: int, env: Env) -> str | None:
    """The value (source text) a local assigned several times (`Func.assigned`) holds when `line`
    runs: each assignment before it, in order, replaces the value where its tests hold and is
    skipped where they fail; a test left open leaves the value open (None). Why: `backend =
    args.backend; if backend == "auto": backend = pick()` keeps the flag's value when it is set."""
    current: str | None = None
    for at, guards, text in func.assigned.get(name, ()):
        if at >= line:
            break
        truth = evaluate_all(guards, replace(env, locals={**env.locals, name: current})).truth
        if truth is not False:
            current = in_place(text, name, current) if truth is True else None
    return current


def in_place(text: str, name: str, before: str | None) -> str | None:
    """`text` with the value `name` held before put in its place (`b = Mode(b)`: `Mode(args.b)`);
    None when it uses `name` and that value is open."""
    if not _mentions(text, {name}):
        return text
    if before is None:
        return None
    node, value = parse_guard(text), parse_guard(before)
    if node is None or value is None:
        return None

    class _Put(ast.NodeTransformer):
        def visit_Name(self, n: ast.Name) -> ast.AST:
            return copy.deepcopy(value) if n.id == name else n

    return ast.unparse(_Put().visit(copy.deepcopy(node)))


def env_at(func: Func, names: set[str], line: int, env: Env) -> Env:
    """`env` with the values the re-assigned locals among `names` hold at `line`."""
    again = [n for n in names if n in func.assigned]
    if not again:
        return env
    return replace(env, locals={**env.locals, **{n: value_at(func, n, line, env) for n in again}})


def reach_exits(
    index: FlagIndex,
    read: Read,
    facts: dict[str, Any],
    flag: dict[str, Any],
    *,
    seen: set[str] | None = None,
    held: dict[str, str] | None = None,
) -> list[ExitPath]:
    """The exits reachable from `read` with the flag set (`flag`: dest -> trial value).

    `seen` is shared by the readers of one flag: a callee walked for an earlier reader is not walked
    again (why: `--tp-size` has ~300 running readers calling the same helpers; the first binding of
    a helper's parameters stands for the rest, a bounded approximation). `held`: locals whose value
    is the flag's by another way than the read itself (`backend = get_backend()`, a getter of the
    module global the flag was stored in: `Mode(args.backend)`)."""
    func = index.func(read.path, read.func)
    if func is None:
        return []
    dests = frozenset(f.dest for f in index.catalog)
    module = index.modules.get(func.path)
    consts = module.consts if module else {}
    flag_names = set(flag)
    tracked = {read.local} if read.local else set()
    tracked |= {name for name, text in func.locals.items() if text and _mentions(text, flag_names)}
    tracked |= {n for n, found in func.assigned.items() if any(_mentions(t, flag_names) for _, _, t in found)}
    tracked |= set(held or ())
    env = Env(
        facts, flag, dests, {**locals_of(func, module), **(held or {})}, {}, consts, frozenset(tracked),
        _where(func), index.query,
    )  # fmt: skip
    found: list[ExitPath] = []
    visited = seen if seen is not None else set()
    visited.add(f"{func.path}::{func.qual}")
    names = set(flag) | tracked
    budget = [MAX_FUNCS]  # functions this reader may still walk
    for ex in func.exits:
        if ex.line < read.line or ex.exc.endswith(_IGNORED_EXC):
            continue
        o = evaluate_all(ex.guards, env_at(func, tracked, ex.line, env))
        if o.flag_dependent and o.truth is not False:
            found.append(_exit(ex, func, [], o.truth, o.used, o.missing))
    for call in func.calls:
        if call.line < read.line:
            continue
        here = env_at(func, tracked, call.line, env)
        o = evaluate_all(call.guards, here)
        argtext = " ".join([*call.args, *call.kwargs.values()])
        if o.truth is False or not (o.flag_dependent or _mentions(argtext, names)):
            continue
        step = f"{func.path}:{call.line} {func.qual} -> {call.callee}()"
        for target in index.resolve_call(func, call.callee):
            params = bind(target, call.args, call.kwargs, here)
            _walk(
                index, target, params, facts, flag, dests, [step], o.truth, o.used, found, visited, 1, budget
            )
    return found


def exits_of(
    index: FlagIndex, func: Func, facts: dict[str, Any], flag: dict[str, Any], *, seen: set[str] | None = None
) -> list[ExitPath]:
    """The exits of `func` and its callees when `func` itself runs (e.g. the registry entry the flag
    selects: `@register_attention_backend("fa3")`)."""
    found: list[ExitPath] = []
    dests = frozenset(f.dest for f in index.catalog)
    visited = seen if seen is not None else set()
    _walk(index, func, {}, facts, flag, dests, [], True, [], found, visited, 0, [MAX_FUNCS])
    return found


def bind(target: Func, args: list[str], kwargs: dict[str, str], env: Env) -> dict[str, Any]:
    """Callee parameter -> the caller's argument value, where it is known."""
    params = [p for p in target.params if p not in ("self", "cls")]
    out: dict[str, Any] = {}
    pairs = list(zip(params, args, strict=False)) + [(k, v) for k, v in kwargs.items() if k in params]
    for name, text in pairs:
        if text.startswith("*"):
            break
        value = evaluate(text, env).value
        if value is not UNKNOWN:
            out[name] = value
    return out


def _walk(  # noqa: PLR0913 - the walk's state, passed down one level at a time
    index: FlagIndex,
    func: Func,
    params: dict[str, Any],
    facts: dict[str, Any],
    flag: dict[str, Any],
    dests: frozenset[str],
    via: list[str],
    reached: bool | None,
    used: list[str],
    found: list[ExitPath],
    visited: set[str],
    depth: int,
    budget: list[int],
) -> None:
    key = f"{func.path}::{func.qual}"
    if key in visited or budget[0] <= 0:
        return
    visited.add(key)
    budget[0] -= 1
    module = index.modules.get(func.path)
    consts = module.consts if module else {}
    env = Env(
        facts, flag, dests, locals_of(func, module), params, consts, frozenset(), _where(func), index.query
    )
    for ex in func.exits:
        if ex.exc.endswith(_IGNORED_EXC):
            continue
        o = evaluate_all(ex.guards, env)
        truth = _and(reached, o.truth)
        if truth is not False:
            found.append(_exit(ex, func, via, truth, [*used, *o.used], o.missing))
    if depth >= MAX_DEPTH:
        return
    for call in func.calls:
        o = evaluate_all(call.guards, env)
        truth = _and(reached, o.truth)
        if truth is False:
            continue
        step = f"{func.path}:{call.line} {func.qual} -> {call.callee}()"
        for target in index.resolve_call(func, call.callee):
            sub = bind(target, call.args, call.kwargs, env)
            _walk(
                index,
                target,
                sub,
                facts,
                flag,
                dests,
                [*via, step],
                truth,
                [*used, *o.used],
                found,
                visited,
                depth + 1,
                budget,
            )


def _exit(
    ex: Any, func: Func, via: list[str], truth: bool | None, used: list[str], missing: list[str]
) -> ExitPath:
    return ExitPath(
        ex.kind,
        func.path,
        ex.line,
        ex.message,
        ex.exc,
        list(via),
        truth,
        list(dict.fromkeys(used)),
        list(dict.fromkeys(missing)),
        list(ex.sets),
        list(ex.values),
    )
