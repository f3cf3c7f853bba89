"""A reader whose value is only stored in a module global: what reads that global decides.

A running reader that assigns the flag's value to a module global (`global X; X = cfg.x`), or
passes it to a setter whose whole body only stores (`set_x(cfg.x is not None)` with `global X;
X = enable`), has no effect by itself. The module's reads of that global (`path::X` in the index)
are followed one step, each with a reader's usual conditions and gates (`tools.research.gates`):

- one runs and uses the value (a local, a call, a branch with work after it): the store runs;
- every one is off here: the store is off;
- otherwise (none found, or they only steer stores again): its effect is unknown, "not followed".

A read in a getter (`def get_backend(): ...; return _BACKEND`) is followed one step further, to
the getter's callers (`through_getter`): a caller that runs here and keeps the value in a local
(`backend = get_backend()`) is a reader of the flag, with that local holding what the setter stored
in the flag's terms (`Fp8GemmRunnerBackend(server_args.fp8_gemm_runner_backend)`, `stored_value`);
a refusal it reaches fires for the flag (0.5.9's flashinfer_trtllm FP8 GEMM off Blackwell), and
when no caller runs here the getter's reads are off.

Attributes (`self.x = cfg.x`) are not treated as stores: the object's own methods read them back
under names the index does not track, and calling them unknown turns true verdicts into unknown
(`--triton-attention-num-kv-splits` through `self.max_kv_splits`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from tools.research.callers import caller_gate, env_of, idle_here
from tools.research.dispatch import module_status
from tools.research.flag_index.lookup import FlagIndex
from tools.research.flag_index.serving_path import is_config_path
from tools.research.gates import activation, idle_after
from tools.research.guard_eval import evaluate, evaluate_all
from tools.research.guards.terms import Env
from tools.research.index_types import Func, Read
from tools.research.reach import ExitPath, in_place, locals_of, reach_exits, value_at
from tools.research.source_code import parsed_source


@dataclass
class Store:
    """Where a reader's value is stored: `file:line (target)` and the global's index key."""

    where: str
    key: str
    name: str


def store_of(index: FlagIndex, read: Read, func: Func | None) -> Store | None:
    """The module global a running reader's value only goes into, or None."""
    if is_config_path(read.path):
        return None  # resolution code: what it stores is server args, read by the flag's readers
    if read.store and read.store.isidentifier():
        return Store(f"{read.path}:{read.line} ({read.store})", f"{read.path}::{read.store}", read.store)
    if read.passed_to and func is not None:
        targets = index.resolve_call(func, read.passed_to)
        if len(targets) != 1:
            return None
        t = targets[0]
        names = [(name, line) for name, line in t.stores if name.isidentifier()]
        if names:
            name, line = names[0]
            return Store(f"{t.path}:{line} ({name} in {t.qual})", f"{t.path}::{name}", name)
    return None


def follow_store(
    index: FlagIndex, store: Store, facts: dict[str, Any], flag: dict[str, Any], setter: Func | None = None
) -> tuple[str, str, ExitPath | None, list[ExitPath]]:
    """The store's state (on / runtime / off / unknown), why, the gate that keeps it off if any, and
    the exits reached where a getter hands the stored value out (`setter`: the function storing it)."""
    reads = index.reads(store.key)
    if not reads:
        return (
            "unknown",
            f"stores the value at {store.where} (not followed: its module never reads it)",
            None,
            [],
        )
    dests = frozenset(f.dest for f in index.catalog)
    offs: list[tuple[Read, str, ExitPath | None]] = []
    getters: dict[str, str | None] = {}  # a getter of the global -> why its callers are off (None: open)
    for r in reads:
        loc = f"{r.path}:{r.line}"
        func = index.func(r.path, r.func)
        if func is None:
            continue  # module-level code runs at import, before any setter
        if setter is not None and index.returned_global(func) == store.name:
            if func.qual not in getters:
                got = through_getter(index, func, store, setter, facts, flag)
                if got is not None and got[0] == "on":
                    return got[0], got[1], None, got[2]
                getters[func.qual] = got[1] if got is not None else None
            if (why := getters[func.qual]) is not None:
                offs.append((r, why, None))
                continue
        module = index.modules.get(r.path)
        consts = module.consts if module else {}
        local = frozenset({r.local} if r.local else ())
        env = Env(
            facts, flag, dests, locals_of(func, module), {}, consts, local, f"{r.path}::{r.func}", index.query
        )
        if r.inert:
            offs.append((r, r.effect or "nothing follows", None))
        elif activation(r, env).truth is False:
            offs.append((r, "its condition fails here", None))
        elif gate := caller_gate(index, func, facts, flag) or (
            idle_after(index, func, r.line, facts, flag) if r.effect == "controls a branch" else None
        ):
            offs.append((r, f"gated at {gate.location}: {gate.message}", gate))
        elif r.effect == "controls a branch" and not _works_after(func, r.line):
            continue  # steers only assignments: stored again, not followed further
        elif why := passed_on_off(index, func, r.local, facts, flag):
            offs.append((r, why, None))
        else:
            return (
                "runtime",
                f"stores the value at {store.where}; read back at {loc} ({r.effect or 'read'})",
                None,
                [],
            )
    if offs and len(offs) == len(reads):
        r, why, gate = offs[0]
        return (
            "off",
            f"stores the value at {store.where}; every read of {store.name} is off here, e.g. {r.path}:{r.line}: {why}",
            gate,
            [],
        )
    return (
        "unknown",
        f"stores the value at {store.where} (not followed: read back only to store it again)",
        None,
        [],
    )


MAX_GETTER_SITES = 64
"""Call sites of a getter of the stored value followed (0.5.9's `get_fp8_gemm_runner_backend`: 1,
`get_moe_runner_backend`: 50)."""


def through_getter(
    index: FlagIndex, getter: Func, store: Store, setter: Func, facts: dict[str, Any], flag: dict[str, Any]
) -> tuple[str, str, list[ExitPath]] | None:
    """Follow the value through a getter of the global (`def get_backend(): return _BACKEND`) to its
    callers: each caller that runs here and keeps the value in a local (`backend = get_backend()`) is
    a reader of it, its exits reached with that local holding the stored value in the flag's terms.
    ("on", why, exits) when one reaches a refusal that fires; ("off", why, []) when no caller runs
    here; None when that is not settled (a caller uses it in place, one runs without refusing)."""
    value = stored_value(index, setter, store.name, facts, flag)
    sites = index.call_sites(getter, limit=MAX_GETTER_SITES, uses=True) if value else None
    if not sites:
        return None
    status = module_status(index, facts)
    offs = []
    open_ = False
    for caller, call in sites:
        if why := idle_here(index, caller, facts, flag):
            offs.append(f"{caller.qual} ({why})")
            continue
        local = next((n for n, text in caller.locals.items() if text == f"{getter.qual}()"), None)
        if call is None or local is None or status.get(caller.path) is not True:
            open_ = True
            continue
        env = env_of(index, caller, facts, flag, {})
        if evaluate_all(call.guards, env).truth is not True:
            open_ = True
            continue
        read = Read(
            store.key, caller.path, call.line, caller.qual, None, "", call.guards, None, local, None, False
        )
        exits = reach_exits(index, read, facts, flag, held={local: value})
        fired = [e for e in exits if e.kind in ("raise", "assert") and e.truth is True]
        if fired:
            why = (
                f"stores the value at {store.where}; {getter.qual}() hands it out to {caller.qual} "
                f"({caller.path}:{call.line}: {local} = {value})"
            )
            return "on", why, fired
        open_ = True
    if open_ or not offs:
        return None
    more = f" (+{len(offs) - 1} more)" if len(offs) > 1 else ""
    return "off", f"read back through {getter.qual}(), whose callers do not run here: {offs[0]}{more}", []


def stored_value(
    index: FlagIndex, setter: Func, name: str, facts: dict[str, Any], flag: dict[str, Any]
) -> str | None:
    """What `setter` stores in the global `name`, in the flag's terms (`Mode(args.backend)`), from
    its locals at the line of the store; None when that is not one plain assignment or not known."""
    text = setter.locals.get(name)
    line = _store_line(index, setter, name)
    if text is None or line is None:
        return None
    env = env_of(index, setter, facts, flag, {})
    for local in setter.assigned:
        text = in_place(text, local, value_at(setter, local, line, env)) if text is not None else None
    for local, held in setter.locals.items():
        if text is not None and local != name and held and local not in setter.assigned:
            text = in_place(text, local, held)
    return text


def _store_line(index: FlagIndex, setter: Func, name: str) -> int | None:
    """The line of `setter`'s one assignment to the global `name`, read in its source."""
    parsed = parsed_source(index, setter.path)
    if parsed is None:
        return None
    lines = [
        node.lineno
        for node in ast.walk(parsed[0])
        if isinstance(node, ast.Assign)
        and setter.line <= node.lineno <= setter.end
        and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    ]
    return lines[0] if len(lines) == 1 else None


def passed_on_off(
    index: FlagIndex, func: Func, local: str | None, facts: dict[str, Any], flag: dict[str, Any]
) -> str | None:
    """Why a local that holds the value acts nowhere here, or None: it is passed to calls only
    (`GroupCoordinator(..., use_custom_allreduce=use_custom_allreduce)`), and in each callee the
    parameter is used only in tests that fail here whatever its value (`if use_custom_allreduce
    and self.world_size > 1:` on one rank) or stored in an attribute nothing in the tree reads."""
    if not local:
        return None
    sites = [
        (c, i, k)
        for c in func.calls
        for i, k in [
            *((i, None) for i, a in enumerate(c.args) if a == local),
            *((None, k) for k, a in c.kwargs.items() if a == local),
        ]
    ]
    if not sites or any(local in a for c in func.outside for a in [*c.args, *c.kwargs.values()]):
        return None
    word = re.compile(rf"\b{re.escape(local)}\b")
    steps = [*func.calls, *func.outside, *func.exits, *func.gates]
    guards = {g for step in steps for g in step.guards}
    if any(word.search(g) and g not in (f"{local} is None", f"not ({local} is None)") for g in guards):
        return None  # it also steers this function's own work
    reasons = []
    for call, pos, key in sites:
        targets = index.resolve_call(func, call.callee)
        if not targets:
            return None
        for target in targets:
            params = [p for p in target.params if p not in ("self", "cls")]
            name = (
                key if key is not None else (params[pos] if pos is not None and pos < len(params) else None)
            )
            if name is None or name not in target.params:
                return None
            env = env_of(index, target, facts, flag, {})
            for kind, text in target.uses.get(name, []):
                if kind == "store" and text not in index.loads:
                    continue  # `self.x = param`, and nothing in the tree reads `.x`
                if kind != "test" or evaluate(text, env).truth is not False:
                    return None
                reasons.append(f"{target.qual} uses {name} only where `{text}` fails here")
    return f"passes {local} on: {'; '.join(dict.fromkeys(reasons))}" if reasons else None


def _works_after(func: Func, line: int) -> bool:
    """Whether `func` calls anything or returns a value after `line` (else it only assigns)."""
    return func.gives or any(c.line > line for c in [*func.calls, *func.outside])
