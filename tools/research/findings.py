"""Every reader of a flag on one deployment, each with its state here (on / runtime / unknown / off)
and why: guards evaluated three-valued, the modules and classes that run, copies and stores
followed, the exits a running reader reaches (`reader_findings`, used by `analysis.analyze_flag`);
and the records it fills: `Finding` per reader, `CodeVerdict` for the flag."""

from __future__ import annotations

import ast
import re
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Any

from tools.research.callers import caller_gate, construction_gate, reached
from tools.research.dispatch import module_reason, module_status, registry_alternatives
from tools.research.flag_index.lookup import FlagIndex
from tools.research.flag_index.serving_path import is_config_path
from tools.research.follow.alike import acts_alike
from tools.research.follow.stores import follow_store, store_of
from tools.research.gates import (
    activation,
    always_called,
    cond_change,
    idle_after,
    override_effect,
)
from tools.research.guard_eval import TOO_LARGE, evaluate
from tools.research.guards.terms import Env
from tools.research.index_types import Func, Read
from tools.research.reach import ExitPath, exits_of, locals_of, reach_exits


@dataclass
class Finding:
    """One reader and what it does here: `state` is on / runtime / unknown / off / excluded."""

    location: str
    text: str
    function: str
    state: str
    why: str
    conditions: list[dict[str, str]] = field(default_factory=list)
    exits: list[ExitPath] = field(default_factory=list)
    config: bool = False
    alternative: bool = False
    """In a module only a registry entry not selected here builds (another attention backend): its
    module may be loaded, but it is the weakest evidence that the flag acts here."""
    sure: bool = False
    """Some chain of callers surely reaches its function here (`callers.reached`): the best evidence that the flag acts here."""


@dataclass
class CodeVerdict:
    """The code's answer about one flag on one deployment, with evidence (see the module docstring).

    `certainty` (0..1) is how often the rule that decided it (`rule`) has been right on what it rests
    on (`basis`) over the taught labels (`tools.research.verdict.calibration`); at most 0.6 when runtime
    state or a missing deployment fact leaves something open (`unsettled` says what).
    """

    flag: str
    dest: str
    version: str
    verdict: str
    summary: str
    certainty: float
    researched_as: str | None = None
    value: Any = None
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    definition: str | None = None
    help: str = ""
    rule: str = ""
    """The rule of `tools.research.verdict.decide.RULES` that decided the verdict."""
    basis: str = ""
    """What the verdict rests on (`tools.research.verdict.decide.BASES`): startup, reached, guard, open, ..."""
    unsettled: str = ""
    """What it rests on that the deployment's facts did not settle (a guard left open, a fact
    missing); empty when everything is settled."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


MAX_REACHED_READERS = 120
"""Readers whose calls are followed to exits, per flag (why: `--tp-size` has ~300 running readers)."""
_SERVER_ARGS_RECEIVER = re.compile(
    r"server_args|\bargs\b|get_global_server_args|get_\w+\(\)|\bcfg\b|\bview\b"
)


@lru_cache(maxsize=4096)
def _terms(source: str) -> tuple[str, ...]:
    """Top-level `and` terms of a condition."""
    try:
        node = ast.parse(source, mode="eval").body
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            return tuple(t for v in node.values for t in _terms(ast.unparse(v)))
        return (ast.unparse(node),)
    except (SyntaxError, RecursionError, MemoryError):  # the last two: nested past Python's limits
        return (source,)


MAX_TERMS = 256
"""Condition terms checked per reader (SGLang 0.5.23's most: 26, of which 21 name a fact): a
generated `if a and b and ...` of thousands of terms would list them all on every reader under it."""


def _conditions(conds: list[str], env: Env, dest: str) -> list[dict[str, str]]:
    """Each condition term that mentions a deployment fact, checked (the first `MAX_TERMS` terms)."""
    out = []
    terms = [t for cond in conds for t in _terms(cond)]
    for term in terms[:MAX_TERMS]:
        o = evaluate(term, env)
        if not o.used and not o.missing:
            continue
        outcome = {True: "pass", False: "fail"}.get(o.truth, "unknown")
        fact = ", ".join(o.used) if o.used else "missing: " + ", ".join(o.missing)
        out.append({"condition": term, "fact": fact, "outcome": outcome})
    if len(terms) > MAX_TERMS:
        more = f"({len(terms) - MAX_TERMS:,} more terms, not checked)"
        out.append({"condition": more, "fact": "", "outcome": "unknown"})
    return out


def _foreign(index: FlagIndex, read: Read, definitions: set[str]) -> bool:
    """A same-named attribute of another object: the file declares a class field of that name
    (e.g. a request model) and the read's receiver is not server args."""
    if read.path in definitions or is_config_path(read.path):
        return False
    module = index.modules.get(read.path)
    declared = [c for c, fields in (module.classes if module else {}).items() if read.dest in fields]
    if not declared:
        return False
    return not _SERVER_ARGS_RECEIVER.search(read.receiver) or (
        read.receiver == "self" and read.cls in declared
    )


def reader_findings(
    index: FlagIndex,
    dest: str,
    facts: dict[str, Any],
    flag_values: dict[str, Any],
    v: CodeVerdict,
    without: dict[str, Any],
) -> None:
    """Append to `v` a finding for each reader of `dest` (a note for each read that is not the flag).
    One piece because each read goes through one ladder of states read top to bottom (off, on,
    unknown, runtime), then refinements that may overrule it (module, gate, store, exits), with a
    budget of followed exits and the callees already walked shared across the reads."""
    dests = frozenset(f.dest for f in index.catalog)
    definitions = {f.path for f in index.catalog if f.path}
    reads = index.reads(dest)
    status = module_status(index, facts) if reads else {}
    alternatives = registry_alternatives(index, facts) if reads else set()
    seen: set[str] = set()  # callees already walked for an earlier reader of this flag
    # argument resolution and validation first: that is where start-up refusals live
    reads = sorted(reads, key=lambda r: (not is_config_path(r.path), r.path, r.line))
    budget = MAX_REACHED_READERS
    for read in reads:
        loc = f"{read.path}:{read.line}"
        if _foreign(index, read, definitions):
            v.notes.append(f"{loc}: `{read.receiver}.{dest}` is another object's attribute, not the flag")
            continue
        if status.get(read.path) is False:
            why = module_reason(index, facts, read.path, status)
            v.findings.append(Finding(loc, read.receiver, read.func, "off", f"not loaded here: {why}"))
            continue
        func = index.func(read.path, read.func)
        if func is not None and (other := _other_architecture(func, facts)):
            v.findings.append(Finding(loc, read.receiver, read.func, "off", other))
            continue
        module = index.modules.get(read.path)
        env = Env(
            facts,
            flag_values,
            dests,
            locals_of(func, module) if func else {},
            {},
            module.consts if module else {},
            frozenset({read.local} if read.local else ()),
            f"{read.path}::{read.func}",
            index.query,
        )
        change = cond_change(read, env, replace(env, facts=without, flag={}), func.params if func else None)
        turns = (
            change is not None
            and change[0] != change[1]
            and _sure_to_act(index, read, func, facts, flag_values)
        )
        o = activation(read, env, turns=turns)
        conds = [*read.guards, *([read.cond] if read.cond else [])]
        finding = Finding(loc, f"{read.receiver}.{dest}", read.func, "", "", _conditions(conds, env, dest))
        finding.config = is_config_path(read.path)
        finding.alternative = read.path in alternatives
        if read.inert:
            finding.state, finding.why = "off", read.effect or "nothing follows"
        elif copies := _read_back(read, reads):
            finding.state, finding.why = (
                "off",
                f"copied to {read.store}, read back at {copies} (each its own reader)",
            )
        elif change is not None and change[0] == change[1]:
            finding.state, finding.why = "off", f"`{read.cond}` is {change[1]!r} with or without the flag"
        elif o.truth is False:
            finding.state, finding.why = "off", "its condition fails here"
        elif o.truth is True:
            effect = read.effect or "read"
            if turns:
                effect += f"; the flag turns `{read.cond}` from {change[0]!r} to {change[1]!r}"
            finding.state, finding.why = "on", effect
        elif o.missing:
            finding.state, finding.why = "unknown", "needs " + ", ".join(o.missing)
        elif TOO_LARGE in o.runtime:
            finding.state, finding.why = "runtime", f"open: {TOO_LARGE.strip('()')}"
        else:
            finding.state, finding.why = (
                "runtime",
                "conditions hold for this deployment; the rest is runtime state",
            )
        if status.get(read.path) is None and finding.state == "on":
            finding.state, finding.why = (
                "runtime",
                f"{read.effect or 'read'}; whether its module is loaded here is open",
            )
        if (
            finding.state != "off"
            and func is not None
            and (gate := _gate(index, read, func, facts, flag_values))
        ):
            finding.state, finding.why = "off", f"gated at {gate.location}: {gate.message}"
            finding.exits = [gate]
        running = finding.state in ("on", "runtime") and func is not None and read.local
        if running and (why := acts_alike(index, read, func, (env, replace(env, facts=without, flag={})))):
            finding.state, finding.why = "off", why
        carried: list[ExitPath] = []  # reached where a getter hands the stored value out
        if finding.state in ("on", "runtime") and (store := store_of(index, read, func)):
            setter = func if read.store else None  # `global X; X = <its local>`: the value as stored
            finding.state, finding.why, gate, carried = follow_store(index, store, facts, flag_values, setter)
            finding.exits = [gate] if gate else []
        if finding.state == "on" and not finding.config and not carried and func is not None and budget > 0:
            finding.sure = reached(index, func, facts, flag_values)
        if finding.state != "off" and budget > 0:
            budget -= 1
            finding.exits = reach_exits(index, read, facts, flag_values, seen=seen) + carried
            _drop_unbuilt(index, finding.exits, facts, flag_values)
            fired = {e.kind: e for e in reversed(finding.exits) if e.truth is True}
            if fb := fired.get("fallback"):
                finding.state, finding.why = "off", f"falls back at {fb.location}: {fb.message}"
            elif ov := fired.get("override"):
                finding.state, finding.why = override_effect(index, ov, facts, flag_values)
        v.findings.append(finding)
    if budget <= 0:
        running = sum(f.state != "off" for f in v.findings)
        v.notes.append(f"exits followed from the first {MAX_REACHED_READERS} of {running} running readers")
    v.findings.sort(key=lambda f: f.location)
    _registry_findings(index, dest, facts, flag_values, v, seen)


def _read_back(read: Read, reads: list[Read]) -> str | None:
    """Lines where a copy of the flag under its own name (`self.x = args.x`) is read back by its
    class: those reads are the flag's readers with their own conditions, the copy does nothing."""
    if read.store != f"self.{read.dest}":
        return None
    lines = [r.line for r in reads if r.receiver == "self" and (r.path, r.cls) == (read.path, read.cls)]
    lines = [line for line in lines if line != read.line]
    return ", ".join(map(str, lines[:6])) if lines else None


def _drop_unbuilt(
    index: FlagIndex, exits: list[ExitPath], facts: dict[str, Any], flag: dict[str, Any]
) -> None:
    """A refusal reached through a call by name in a method of a class not built here cannot fire
    (`load_model()` resolved to the remote-instance loader on a server that loads from disk)."""
    for e in exits:
        if e.truth is not True or e.kind not in ("raise", "assert") or not e.via:
            continue
        funcs = [f for f in index.funcs_in(e.path) if f.line <= e.line <= f.end]
        if funcs and (gate := construction_gate(index, max(funcs, key=lambda f: f.line), facts, flag)):
            e.truth = False
            e.message += f" (cannot run here: {gate.message})"


def _sure_to_act(
    index: FlagIndex, read: Read, func: Func | None, facts: dict[str, Any], flag: dict[str, Any]
) -> bool:
    """Whether a read whose test the flag turns acts: always, unless the test is a `raise`'s or an
    `assert`'s (a refusal). A refusal counts only in argument code that surely runs here, not
    behind a mode no fact decides (`_DetailSinglePassGatherer.__init__`, `_handle_dflash`)."""
    if func is None:
        return True
    refusal = any(
        e.kind in ("raise", "assert") and (e.line == read.line or (e.guards and e.guards[-1] == read.cond))
        for e in func.exits
    )
    return not refusal or (is_config_path(read.path) and always_called(index, func, facts, flag))


_ARCHITECTURE = re.compile(r"[A-Z]\w*For[A-Z]\w+")


def _other_architecture(func: Func, facts: dict[str, Any]) -> str | None:
    """Why `func` does not run for this model: it is registered for other architectures only
    (`@_register_for("Qwen4ExpForConditionalGeneration")`), or None."""
    archs = [key for _, key in func.keys if _ARCHITECTURE.fullmatch(key)]
    arch = facts.get("model.architecture")
    if not archs or not arch or arch in archs:
        return None
    return f"registered for {', '.join(archs)} only; this model is {arch}"


def _gate(
    index: FlagIndex, read: Read, func: Func, facts: dict[str, Any], flag: dict[str, Any]
) -> ExitPath | None:
    """What keeps a running reader's effect from happening here (`tools.research.gates`), or None."""
    gate = caller_gate(index, func, facts, flag) or construction_gate(index, func, facts, flag)
    if gate is None and read.effect == "controls a branch":
        gate = idle_after(index, func, read.line, facts, flag)
    return gate


def _registry_findings(
    index: FlagIndex,
    dest: str,
    facts: dict[str, Any],
    flag_values: dict[str, Any],
    v: CodeVerdict,
    seen: set[str],
) -> None:
    """A value that selects a registry entry (`@register_<dest>("value")`) runs that entry: its exits
    are the flag's too (the registry calls it through a table, which no call edge shows)."""
    value = flag_values.get(dest)
    if not isinstance(value, str):
        return
    for deco, key, path, _imports in index.registries:
        if key != value or deco.removeprefix("register_") != dest:
            continue
        for func in index.funcs_in(path):
            if (deco, key) in func.keys:
                exits = exits_of(index, func, facts, flag_values, seen=seen)
                why = f"@{deco}({key!r}) runs when {dest} = {key!r}"
                v.findings.append(Finding(f"{path}:{func.line}", f"@{deco}", func.qual, "on", why, [], exits))
