"""Where a running reader's effect is cut off on this deployment, though the reader itself runs.

Two gates, both bounded and three-valued (an unknown condition is never a gate):

- caller gates: every call site of the reader's function (or, one level up, of its caller) is
  guarded off here: a failing `if`, or an earlier `if world_size <= 1: return` in the caller;
- idle work: the reader only steers a branch, and everything that branch calls returns early here
  before doing anything (`if world_size <= 1: return False` after a few queries), directly or
  through callees that only call such functions.

Overrides (`return {"dest": value}` in an argument-resolution pass): a reader whose effect is one
changes something only where the other passes writing that dest give another value without the
flag (`override_effect`); a pass that sets the flag's own trial value back makes it a no-op
(`overridden`).

A function used without being called (a callback, a dispatch table) has call sites nobody sees:
no caller gate then. Calls into libraries outside the tree count as work.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import Any

from tools.research.callers import MAX_SITES, caller_gate, env_of
from tools.research.flag_index.lookup import FlagIndex
from tools.research.guard_eval import evaluate, evaluate_all
from tools.research.guards.terms import Env, Outcome
from tools.research.index_types import Func, Read
from tools.research.platform_facts import UNKNOWN
from tools.research.reach import ExitPath, bind


def always_called(
    index: FlagIndex, func: Func, facts: dict[str, Any], flag: dict[str, Any], *, depth: int = 3
) -> bool:
    """Whether `func` surely runs here: nothing in the tree refers to it (an entry point such as
    `__post_init__`), or every call site's guards hold here and its caller surely runs (up to
    `depth` callers). A site behind an open condition (`if self.is_dflash():`) is not sure."""
    sites = index.call_sites(func, limit=MAX_SITES)
    cls, _, method = func.qual.partition(".")
    if sites is None or (method == "__init__" and index.subclasses(cls)):
        return False  # a base class's __init__ also runs where a subclass is built
    for caller, call in sites:
        if evaluate_all(call.guards, env_of(index, caller, facts, flag, {})).truth is not True:
            return False
        if depth > 1 and not always_called(index, caller, facts, flag, depth=depth - 1):
            return False
    return True


def idle_after(
    index: FlagIndex, func: Func, line: int, facts: dict[str, Any], flag: dict[str, Any]
) -> ExitPath | None:
    """The gate that makes all the work after `line` in `func` a no-op here, or None (`func` is
    the function of a reader that steers a branch; what it returns would be its callers' effect)."""
    if func.gives:
        return None
    return _idle(index, func, env_of(index, func, facts, flag, {}), facts, flag, after=line, depth=2)


def _idle(
    index: FlagIndex,
    func: Func,
    env: Env,
    facts: dict[str, Any],
    flag: dict[str, Any],
    *,
    after: int = 0,
    depth: int,
) -> ExitPath | None:
    calls = [c for c in [*func.calls, *func.outside] if c.line > after]
    live = [c for c in calls if evaluate_all(c.guards, env).truth is not False]
    if not after:
        for gate in func.gates:  # an early return here before any statement call
            o = evaluate_all(gate.guards, env)
            if o.truth is True:
                if any(c.bare for c in live if c.line < gate.line):
                    break
                test = gate.guards[-1]
                why = f"{func.qual} returns early when {test} ({', '.join(o.used)})"
                return ExitPath("gate", func.path, gate.line, why, "", truth=True, used=o.used)
    if depth <= 0 or not live or any(c in func.outside for c in live):
        return None
    first = None
    for call in live:
        if not call.bare and index.query(call.callee) is not None:
            continue  # a one-line query: its value feeds a test
        targets = index.resolve_call(func, call.callee) if call.bare else []
        if not targets:
            return None
        for target in targets:
            sub = env_of(index, target, facts, flag, bind(target, call.args, call.kwargs, env))
            gate = _idle(index, target, sub, facts, flag, depth=depth - 1)
            if gate is None:
                return None
            gate.via.insert(0, f"{func.path}:{call.line} {func.qual} -> {call.callee}()")
            first = first or gate
    return first


class _Runtime:
    def __repr__(self) -> str:
        return "decided at run time"


RUNTIME: Any = _Runtime()
"""A test's value without the flag when what the function is called with decides it (which batch)."""


def cond_change(read: Read, env: Env, now: Env, params: list[str] | None = None) -> tuple[Any, Any] | None:
    """(value now, value with the flag) of the test or boolean expression holding the read, when
    both are known, or when the flag fixes a test that without it is decided by what the function
    is called with (`params`: a batch, a request; not a configuration). Equal values: the flag
    changes nothing here; different: this is its effect, whichever way it turns
    (`if cfg.disable_x: return`, `enable = not cfg.disable_x`)."""
    if read.cond is None:
        return None
    after = evaluate(read.cond, env).value
    if after is UNKNOWN:
        return None
    before = evaluate(read.cond, now)
    if before.value is UNKNOWN and not before.missing and isinstance(after, bool) and _per_call(read, params):
        return RUNTIME, after  # `not cfg.disable_x and batch.is_extend()`: the flag fixes what batches decide
    return None if before.value is UNKNOWN else (before.value, after)


def _per_call(read: Read, params: list[str] | None) -> bool:
    """Whether the read's test names a value its function is called with that is not a
    configuration (`forward_batch`, `req`; not `server_args`, `model_config`)."""
    names = [p for p in params or [] if p not in ("self", "cls") and not re.search(r"config|args", p)]
    return any(re.search(rf"\b{re.escape(p)}\b", read.cond or "") for p in names)


def activation(read: Read, env: Env, *, turns: bool = False) -> Outcome:
    """Whether a reader's own guards and condition hold here (a read in an early exit's test acts
    when the exit is *not* taken). `turns`: the flag changes the value of the read's test
    (`cond_change`), which is its effect: only the guards are left to hold."""
    conds = list(read.guards)
    if read.cond is not None and not turns:
        o = evaluate(read.cond, env)
        if read.exit_body and o.truth is False:
            pass  # the exit is not taken: the function goes on with the flag's value
        elif read.exit_body and o.truth is True:
            conds.append("False")
        else:
            conds.append(read.cond)
    return evaluate_all(conds, env)


def override_effect(
    index: FlagIndex, ov: ExitPath, facts: dict[str, Any], flag: dict[str, Any]
) -> tuple[str, str]:
    """The state of a reader whose effect is an override (`return {"d": x}` in a resolution pass):
    it changes something only where `d` would be other than `x` without the flag. Without it, `d`
    is what the other passes writing `d` give here (evaluated with the flag at its default and `d`
    as the user set it), else the user's value or `d`'s default. (state, why); state is on, runtime
    (a pass writing `d` depends on something open) or off."""
    defaults = {f.dest: f.default for f in index.catalog}
    states = [
        _override_one(index, ov, dest, text, facts, flag, defaults)
        for dest, text in zip(ov.sets, ov.values, strict=True)
    ]
    return min(states, key=lambda s: ("on", "runtime", "off").index(s[0]))


def _override_one(
    index: FlagIndex,
    ov: ExitPath,
    dest: str,
    text: str,
    facts: dict[str, Any],
    flag: dict[str, Any],
    defaults: dict[str, Any],
) -> tuple[str, str]:
    value = _literal(text)
    user = facts.get(f"flag.{dest}", defaults.get(dest))
    sets = f"sets {dest} = {text} at {ov.location}"
    without = {**{d: defaults.get(d) for d in flag}, dest: user}
    open_pass, failing = "", ""
    for location, func, ex in _passes(index, dest):
        if location == ov.location:
            continue
        env = env_of(index, func, facts, without, {})
        o = evaluate_all(ex.guards, env)
        other = evaluate(ex.values[ex.sets.index(dest)], env).value
        where = f"{func.qual} at {location}"
        if o.truth is False:
            failing = failing or f"{where} does not fire: {', '.join(o.used) or 'its condition fails'}"
        elif o.truth and UNKNOWN not in (other, value) and other != value:
            return "on", f"{sets}; without the flag {where} sets it to {other!r} here"
        elif not open_pass:
            unknown = [n for n in [*o.missing, *o.runtime] if not n.startswith("__")] or ["its value"]
            held = "; ".join(o.used) or "nothing decided"
            open_pass = f"{sets}; without the flag {where} may set it ({held}; open: {', '.join(unknown)})"
    if open_pass:
        return "runtime", open_pass
    why = f"{sets}; without the flag it is {user!r} here" + (f" ({failing})" if failing else "")
    if value is UNKNOWN:
        return "runtime", why
    return ("off" if user == value else "on"), why


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return UNKNOWN


def overridden(
    index: FlagIndex, dest: str, facts: dict[str, Any], flag: dict[str, Any]
) -> tuple[str, str, str] | None:
    """Where and why the flag's trial value never takes effect here: a resolution pass whose guards
    hold with the flag set replaces it (`return {"dest": v}`) with `v`, the value the server runs
    with now. (location, function, why); None when no pass does (or it is open)."""
    running = facts.get(f"server.{dest}", UNKNOWN)
    for location, func, ex in _passes(index, dest) if running is not UNKNOWN else []:
        env = env_of(index, func, facts, flag, {})
        o = evaluate_all(ex.guards, env)
        value = evaluate(ex.values[ex.sets.index(dest)], env).value
        if o.truth is True and value is not UNKNOWN and value == running != flag.get(dest):
            held = f" ({', '.join(o.used)})" if o.used else ""
            return location, func.qual, f"sets {dest} back to {value!r}, its value now{held}"
    return None


def set_anyway(
    index: FlagIndex, dest: str, facts: dict[str, Any], flag: dict[str, Any]
) -> tuple[str, str, str, list[str]] | None:
    """Where argument resolution gives `dest` the trial value by itself here (`if not
    self.enable_x and <model and GPU hold>: self.enable_x = True`): a pass whose guards hold with
    the flag left as it is now sets it to the trial value, so setting the flag changes nothing.
    Its own condition must hold; an enclosing or earlier-return guard may be open at runtime only
    (`if parse_connector_type(self.model_path) == INSTANCE: return`), never for a missing fact: the
    why names it. (location, function, why, what is open at runtime); None when no pass does."""
    defaults = {f.dest: f.default for f in index.catalog}
    now = facts.get(f"flag.{dest}", defaults.get(dest))
    trial = flag.get(dest)
    if trial is None or trial == now:
        return None
    without = {**{d: defaults.get(d) for d in flag}, dest: now}
    for location, func, ex in _passes(index, dest):
        env = env_of(index, func, facts, without, {})
        if ex.kind != "assign" or evaluate(ex.values[0], env).value != trial or not ex.guards:
            continue
        own, rest = evaluate_all(ex.guards[-1:], env), evaluate_all(ex.guards[:-1], env)
        if own.truth is not True or rest.truth is False or rest.missing:
            continue
        if rest.truth is None and not rest.runtime:
            continue  # open on something the evaluator cannot read: not known to fire
        held = f" ({', '.join([*rest.used, *own.used])})" if rest.used or own.used else ""
        why = f"sets {dest} = {trial!r} without the flag{held}"
        if rest.truth is True:
            return location, func.qual, why, []
        return location, func.qual, f"{why}; open at runtime: {', '.join(rest.runtime)}", list(rest.runtime)
    return None


_PASSES = ("override", "assign")


def _passes(index: FlagIndex, dest: str) -> Iterator[tuple[str, Func, Any]]:
    """Every resolution pass that gives `dest` a value: (`path:line`, its function, its override
    exit or `self.dest = <constant>` assignment)."""
    for path, qual, line in index.overrides.get(dest, []):
        func = index.func(path, qual)
        every = [*func.exits, *func.sets] if func else []
        ex = next((e for e in every if e.line == line and dest in e.sets and e.kind in _PASSES), None)
        if func is not None and ex is not None:
            yield f"{path}:{line}", func, ex


def filled_in(index: FlagIndex, facts: dict[str, Any]) -> dict[str, Any]:
    """Settings start-up leaves unset (None) that the server fills in later, at model load
    (`if server_args.attention_backend is None: ... server_args.attention_backend = "fa3"`):
    `server.<dest>` = the value of the one fill-in whose guards hold here, UNKNOWN when a guard is
    open or two differ. A fill-in in a function no caller reaches here does not count."""
    out: dict[str, Any] = {}
    for dest, sites in index.fills.items():
        if f"server.{dest}" not in facts or facts[f"server.{dest}"] is not None:
            continue
        values: list[Any] = []
        for path, qual, line in sites:
            func = index.func(path, qual)
            fill = next((e for e in func.sets if e.line == line), None) if func else None
            if func is None or fill is None:
                continue
            env = env_of(index, func, facts, {}, {})
            held = evaluate_all(fill.guards, env).truth
            if held is False or caller_gate(index, func, facts, {}, depth=1) is not None:
                continue
            values.append(evaluate(fill.values[0], env).value if held else UNKNOWN)
        if values:
            out[f"server.{dest}"] = values[0] if all(v == values[0] for v in values) else UNKNOWN
    return out
