"""Whether a function can run here: its call sites, the modules and registry entries they sit in,
and the construction of the class a method belongs to (issue 25, item 2).

A site is off here when its guard fails, when the calling function sits in a module this deployment
does not load, when the caller is a registry entry that is not selected (`@register_attention_backend
("triton")` with attention_backend fa3), or when the caller is a method of a class that is never
built here. A method runs only where its class is built: every `Class(...)` of the tree must be
off, and so must the construction of every subclass (building one runs the base's `__init__` and
methods). A class used as a value (`return EagleWorker` in `create_worker`) is built where that
use runs. Callers are followed `DEPTH` steps up. Any site that is open keeps the function running;
so does a class built in ways no edge shows (a decorated subclass without an `__init__` of its
own; a plain one gets an implicit `__init__` in the index, `walk.names.implicit_init`). A class
its own classmethods build (`cls(...)`) is reached through whoever holds the class: a caller naming
it, a module-level table read by a function (`QUANTIZATION_METHODS[name]`); its own methods are
never where it is first built. A chain of callers that comes back to the function being decided
starts nothing (`Fp8Config.get_quant_method` builds `Fp8LinearMethod`, which names `Fp8Config`).
Taking a class's attributes (`forward = DeepseekV4AttnBackend.forward` in another backend's class
body) or listing it for an `isinstance` test builds nothing; a function held in a dispatch table
keyed like a registry (`{"dsv4": self._create_dsv4_decode_backend}`) runs only when that
registry's setting selects its key. All three-valued: an unknown condition is never a gate.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from tools.research.dispatch import module_reason, module_status, registry_status
from tools.research.flag_index.lookup import TABLE_READ, FlagIndex
from tools.research.guard_eval import evaluate, evaluate_all
from tools.research.guards.terms import Env
from tools.research.index_types import Call, Func
from tools.research.reach import ExitPath, locals_of

MAX_SITES = 100
"""A function whose name more functions than this call is not examined (each site is evaluated;
0.5.9's FusedMoE: 66, a cap of 24 left every MoE reader open on a dense model)."""
MAX_UNLOADED_SITES = 200
"""Past `MAX_SITES`, the callers only asked whether their modules are loaded (a cheap question)."""
DEPTH = 10
"""Callers followed up from a reader: a draft worker's attention backend is built five steps below
the scheduler's `if spec_algorithm.is_none(): return`; 0.5.23's FP8 GEMM backend getter is read six
helper calls below `Fp8LinearMethod.__init__`. A class's construction is asked anew with the whole
depth; call cycles end at the function being decided (`_through_itself`), not at the depth."""


def env_of(
    index: FlagIndex, func: Func, facts: dict[str, Any], flag: dict[str, Any], params: dict[str, Any]
) -> Env:
    """The environment guards inside `func` are evaluated in."""
    module = index.modules.get(func.path)
    consts = module.consts if module else {}
    dests = frozenset(f.dest for f in index.catalog)
    where = f"{func.path}::{func.qual}"
    return Env(facts, flag, dests, locals_of(func, module), params, consts, frozenset(), where, index.query)


_LOCAL = threading.local()
"""Per thread (researchers run in parallel threads): `memo`, caller gates for `memo_for`, the
index, facts and flag they hold for (held, so their ids are not reused)."""


def caller_gate(
    index: FlagIndex, func: Func, facts: dict[str, Any], flag: dict[str, Any], *, depth: int = DEPTH
) -> ExitPath | None:
    """The gate that keeps every caller of `func` from calling it here, or None (callers followed
    `depth` levels up; answers kept for the facts and flag in hand: readers share their callers)."""
    held = getattr(_LOCAL, "memo_for", (None, None, None))
    if not (held[0] is index and held[1] is facts and held[2] is flag):
        _LOCAL.memo, _LOCAL.memo_for, _LOCAL.open, _LOCAL.assumed = {}, (index, facts, flag), set(), []
    memo: dict[tuple[int, str, str], ExitPath | None] = _LOCAL.memo
    key = (depth, func.path, func.qual)
    if key in memo:
        gate = memo[key]
    elif (func.path, func.qual) in _LOCAL.open:
        gate = _through_itself(func)
        _LOCAL.assumed[-1].add((func.path, func.qual))
    else:
        gate = _settled(index, func, facts, flag, depth, key)
    return None if gate is None else replace(gate, via=list(gate.via))


def _through_itself(func: Func) -> ExitPath:
    """The gate of a caller chain that comes back to `func` while `func` is being decided: a cycle
    (`Fp8Config.get_quant_method` builds `Fp8LinearMethod`, whose `__init__` names `Fp8Config`)
    starts nothing that does not already run, so that way in is off; the other ways decide."""
    why = f"{func.qual} is reached here only through itself"
    return ExitPath("gate", func.path, func.line, why, "", [f"{func.path}::{func.qual}"], True)


def _settled(
    index: FlagIndex, func: Func, facts: dict[str, Any], flag: dict[str, Any], depth: int, key: tuple
) -> ExitPath | None:
    """`_caller_gate` with `func` open: a gate that rests on a function still being decided (a
    cycle) holds only if that function turns out off, so it is kept in the memo only once no
    such function is left; "runs" holds whatever the cycle gives (an open way only adds ways)."""
    name = (func.path, func.qual)
    _LOCAL.open.add(name)
    _LOCAL.assumed.append(set())
    try:
        gate = _caller_gate(index, func, facts, flag, depth=depth)
    finally:
        _LOCAL.open.discard(name)
        rests_on = _LOCAL.assumed.pop() - {name}
    if gate is None or not rests_on:
        _LOCAL.memo[key] = gate
    elif _LOCAL.assumed:
        _LOCAL.assumed[-1] |= rests_on
    return gate


def _caller_gate(
    index: FlagIndex, func: Func, facts: dict[str, Any], flag: dict[str, Any], *, depth: int
) -> ExitPath | None:
    sites = index.call_sites(func, limit=MAX_SITES, uses=True)
    subs = _subclass_inits(index, func)
    # an instance method runs only on an instance: where its class is not built, whoever calls a
    # method of that name (`quant_config.get_quant_method(...)`) does not reach it. Whether a class
    # is built is a question of its own, asked with the whole depth however deep the method was
    # reached (`Fp8LinearMethod` is built ten calls below where a model's quantization decides)
    method = _init_class(func.qual) is None and func.params[:1] == ["self"]
    if method and ((built := construction_gate(index, func, facts, flag)) or sites is None):
        return built
    if sites is None and subs is not None:
        return _unloaded_callers(index, func, facts, flag, subs, depth=depth)
    if sites is None or subs is None or not (sites or subs):
        return None
    gates: list[ExitPath] = []
    for init in subs:  # building a subclass runs this class's __init__ and methods too
        gate = caller_gate(index, init, facts, flag, depth=depth)
        if gate is None:
            return None
        gates.append(gate)
    name = _init_class(func.qual) or func.qual.rsplit(".", 1)[-1]
    for caller, call in sites:
        if (caller.path, caller.qual) == (func.path, func.qual):
            continue  # calling itself: it runs only if it already runs
        if call is None and (
            name in caller.typed or _own_method(caller, func) or _helper_call(index, caller, func)
        ):
            continue  # `isinstance(x, Class)`, `Class.is_applicable(x)`, its own methods: build nothing
        if call is None or call is TABLE_READ:  # used without a call: runs if its user does
            gate = _unselected_entry(index, caller, func, facts) if call is None else None
            gate = gate or _caller_off(index, caller, None, facts, flag, depth=depth)
            if gate is None and depth > 1:
                gate = caller_gate(index, caller, facts, flag, depth=depth - 1)
            if gate is None:
                return None
            gates.append(gate)
            continue
        env = env_of(index, caller, facts, flag, {})
        gate = _failing(caller, call, env) or _caller_off(index, caller, call, facts, flag, depth=depth)
        if gate is None and depth > 1:
            gate = caller_gate(index, caller, facts, flag, depth=depth - 1)
        if gate is None:
            return None
        gates.append(gate)
    return _joined(gates)


def _unloaded_callers(
    index: FlagIndex, func: Func, facts: dict[str, Any], flag: dict[str, Any], subs: list[Func], *, depth: int
) -> ExitPath | None:
    """For a function more than `MAX_SITES` functions call: a gate when every one of them is in a
    module this deployment does not load and no subclass is built (24 model files build 0.5.9's
    LayerCommunicator; a Llama server loads none of them). None otherwise."""
    sites = index.call_sites(func, limit=MAX_UNLOADED_SITES, uses=True)
    if not sites:
        return None
    status = module_status(index, facts)
    if any(status.get(caller.path) is not False for caller, _ in sites):
        return None
    for init in subs:
        if caller_gate(index, init, facts, flag, depth=depth) is None:
            return None
    caller = sites[0][0]
    name = _init_class(func.qual) or func.qual
    why = (
        f"all {len(sites)} callers of {name} are in modules not loaded here, "
        f"e.g. {caller.qual}: {module_reason(index, facts, caller.path, status)}"
    )
    return ExitPath(
        "gate", caller.path, caller.line, why, "", [f"{caller.path}:{caller.line} {caller.qual}"], True
    )


def _joined(gates: list[ExitPath]) -> ExitPath | None:
    """The first gate, its message naming a second, different reason when several ways lead here
    (a backend the registry would build, and draft workers only speculative decoding builds)."""
    if not gates:
        return None
    first, reasons = gates[0], list(dict.fromkeys(g.message.split("; and ")[0] for g in gates))
    if len(reasons) == 1:
        return first
    more = f"; and {reasons[1]}" + (f" (+{len(reasons) - 2} more)" if len(reasons) > 2 else "")
    return replace(first, message=first.message + more, via=list(first.via))


def _helper_call(index: FlagIndex, caller: Func, func: Func) -> bool:
    """Whether `caller` only takes attributes of the class `func` constructs (`Cls.is_applicable(x)`,
    `Cls.forward`) and no method of that class builds it (`cls(...)`): a static helper builds nothing."""
    cls = _init_class(func.qual)
    return cls is not None and cls in caller.receivers and not index.builds_itself(func.path, cls)


REGISTRY_SHARE = 0.5
"""A dispatch table is keyed like a registry when more than this share of its keys are that
registry's keys (0.5.23's draft backend tables: 14 of 16 are attention backends)."""


def _unselected_entry(index: FlagIndex, caller: Func, func: Func, facts: dict[str, Any]) -> ExitPath | None:
    """The gate of a function `caller` holds only in dispatch tables keyed like a registry, under
    keys that registry does not select here: `{"triton": self._create_triton_decode_backend,
    "dsv4": self._create_dsv4_decode_backend}[backend]()` in 0.5.23's draft_utils.py builds the
    backend of the attention setting, as `@register_attention_backend("dsv4")` runs only when that
    setting is "dsv4". None when some entry may be selected, or a table is keyed otherwise."""
    name = _init_class(func.qual) or func.qual.rsplit(".", 1)[-1]
    uses = caller.entries.get(name)
    if not uses:
        return None
    selected = registry_status(index, facts)
    registered: dict[str, set[str]] = {}
    for deco, key, _path, _imports in index.registries:
        registered.setdefault(deco, set()).add(key)
    settings = []
    for key, keys, _line in uses:
        decos = [d for d, ks in registered.items() if len(ks & set(keys)) > REGISTRY_SHARE * len(keys)]
        if not decos or any(selected.get((d, key)) is not False for d in decos):
            return None
        settings.append(decos[0].removeprefix("register_"))
    (key, _keys, line), setting = uses[0], settings[0]
    why = f"{caller.qual} holds {name} under {key!r} in a table keyed by {setting}, not {key!r} here"
    return ExitPath("gate", caller.path, line, why, "", [f"{caller.path}:{line} {caller.qual}"], True)


def _own_method(caller: Func, func: Func) -> bool:
    """Whether `caller` is a method of the class whose constructor `func` is: it is not where the
    class is first built. An instance method runs once the class is built; a classmethod or
    staticmethod (`from_config`: `return cls(...)`) is called only by code that holds the class
    (`QUANTIZATION_METHODS[name].from_config(...)`), and that code is among the class's own uses."""
    cls = _init_class(func.qual)
    return cls is not None and caller.path == func.path and caller.qual.startswith(f"{cls}.")


def _subclass_inits(index: FlagIndex, func: Func) -> list[Func] | None:
    """For a constructor: the constructors of the tree's subclasses of its class; None when a
    subclass has none of its own (it is built by calls of its name, which the index does not keep)."""
    cls = _init_class(func.qual)
    if cls is None:
        return []
    inits = [index.func(path, f"{sub}.__init__") for path, sub in index.subclasses(cls)]
    return None if None in inits else inits


def construction_gate(
    index: FlagIndex, func: Func, facts: dict[str, Any], flag: dict[str, Any], *, depth: int = DEPTH
) -> ExitPath | None:
    """For a method: the gate that keeps its class from being built here, or None."""
    cls = class_of(index, func)
    if cls is None:
        return None
    init = index.func(func.path, f"{cls}.__init__")
    if init is None:
        return None  # built by calls of its name, which the index keeps only for constructors
    gate = caller_gate(index, init, facts, flag, depth=depth)
    return None if gate is None else replace(gate, message=f"{cls} is not built here: {gate.message}")


def reached(
    index: FlagIndex, func: Func, facts: dict[str, Any], flag: dict[str, Any], *, depth: int = 8
) -> bool:
    """Whether some chain of callers surely reaches `func` on this deployment: up through calls
    whose guards hold here (or uses that pass it on, a process target), to module-level code of a
    module this deployment loads. Evidence that a reader acts here (not a verdict: the other
    chains may still be off)."""
    status = module_status(index, facts)
    seen: set[tuple[str, str]] = set()

    def up(f: Func, left: int) -> bool:
        if (f.path, f.qual) in seen or left <= 0:
            return False
        seen.add((f.path, f.qual))
        name = _init_class(f.qual) or f.qual.rsplit(".", 1)[-1]
        for path, qual, called in index.callers_of(name):
            if qual == "<module>":  # import-time code of a loaded module that imports `func`'s
                module = index.modules.get(path)
                imported = {index.mod_path.get(m) for m in module.imports} if module else set()
                if status.get(path) is True and path != f.path and f.path in imported:
                    return True
                continue
            caller = index.func(path, qual)
            if caller is None or not any(
                t.path == f.path and t.qual == f.qual for t in index.resolve_call(caller, name)
            ):
                continue
            if called:
                env = env_of(index, caller, facts, flag, {})
                if not any(
                    c.callee == name and evaluate_all(c.guards, env).truth is True for c in caller.calls
                ):
                    continue
            if status.get(caller.path) is not False and up(caller, left - 1):
                return True
        return False

    return up(func, depth)


def _init_class(qual: str) -> str | None:
    cls, _, name = qual.partition(".")
    return cls if name == "__init__" else None


def class_of(index: FlagIndex, func: Func) -> str | None:
    """The class `func` is a method of (its qualified name's first part, when that is a class)."""
    head, dot, _ = func.qual.partition(".")
    module = index.modules.get(func.path)
    return head if dot and module is not None and head in module.classes else None


def _caller_off(
    index: FlagIndex,
    caller: Func,
    call: Call | None,
    facts: dict[str, Any],
    flag: dict[str, Any],
    *,
    depth: int,
) -> ExitPath | None:
    """Why `caller` itself does not run here: its module is not loaded, it is a registry entry not
    selected, or it is a method of a class not built here; else None."""
    site = (
        f"{caller.path}:{call.line} {caller.qual} -> {call.callee}()"
        if call
        else f"{caller.path}::{caller.qual}"
    )
    status = module_status(index, facts)
    if status.get(caller.path) is False:
        why = f"{caller.qual} is in a module not loaded here: {module_reason(index, facts, caller.path, status)}"
        return ExitPath("gate", caller.path, caller.line, why, "", [site], True)
    if caller.keys:
        selected = registry_status(index, facts)
        states = [selected.get(k) for k in caller.keys]
        if states and all(s is False for s in states):
            deco, key = caller.keys[0]
            why = f"{caller.qual} runs only when {deco.removeprefix('register_')} is {key!r}, not here"
            return ExitPath("gate", caller.path, caller.line, why, "", [site], True)
    if class_of(index, caller) and not caller.qual.endswith(".__init__"):
        gate = construction_gate(index, caller, facts, flag)
        if gate is not None:
            gate.via.insert(0, site)
            return gate
    return None


def _failing(caller: Func, call: Call, env: Env) -> ExitPath | None:
    """The guard of `call` that fails here, as a gate (the early return's line when it is one)."""
    if evaluate_all(call.guards, env).truth is not False:
        return None
    site = f"{caller.path}:{call.line} {caller.qual} -> {call.callee}()"
    for guard in call.guards:
        o = evaluate(guard, env)
        if o.truth is not False:
            continue
        early = next((g for g in caller.gates if f"not ({g.guards[-1]})" == guard), None)
        facts = ", ".join(o.used) or "constants"
        if early is not None:
            why = f"{caller.qual} returns early when {early.guards[-1]} ({facts}), before calling {call.callee}()"
            return ExitPath("gate", caller.path, early.line, why, "", [site], True, o.used)
        why = f"{caller.qual} calls {call.callee}() only when {guard} ({facts})"
        return ExitPath("gate", caller.path, call.line, why, "", [site], True, o.used)
    return None


def idle_here(index: FlagIndex, func: Func, facts: dict[str, Any], flag: dict[str, Any]) -> str | None:
    """Why `func` does not run here (its module is not loaded, no caller calls it, its class is not
    built), or None."""
    if module_status(index, facts).get(func.path) is False:
        return "its module is not loaded here"
    gate = caller_gate(index, func, facts, flag) or construction_gate(index, func, facts, flag)
    return f"gated at {gate.location}: {gate.message}" if gate else None
