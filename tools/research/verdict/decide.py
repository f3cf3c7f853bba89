"""The verdict from a flag's findings, in the shared vocabulary: a table of named rules, the first
that holds decides.

`RULES` in order: SGLang's own start-up run refuses the flag, drops it, or resolves the same
configuration with and without it; the trial's parallel world needs more GPUs than a node has; a
refusal fires from a running reader; a fallback switches the flag off; no reader (dead); readers
that only log (dead); a resolution pass sets the value back, or gives it by itself (no-op, when
start-up did not run); a running reader (applies); an open deployment fact (unknown); only
compatibility checks read it, or every reader is off (no-op; a reader that runs but whose effect a
caller or callee gates off here is cited first). An `applies`
verdict cites the running reader that best shows the flag acting here: not in another registry
entry's module, not argument code, in a function that surely runs here, with conditions that hold
on model or GPU facts.

Each rule's `Decision` names what it rests on (`basis`, see `BASES`) and, when that is not settled
from the deployment's facts, what is not (`unsettled`). The certainty is the rule's record on that
basis over the taught labels (`tools.research.verdict.calibration`), at most 0.6 when something is unsettled.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from tools.research.catalog import FlagInfo
from tools.research.findings import CodeVerdict, Finding
from tools.research.flag_index.lookup import FlagIndex
from tools.research.follow.alike import ALIKE
from tools.research.gates import overridden, set_anyway
from tools.research.platform_facts import PARALLEL_SIZES
from tools.research.startup.check import StartupAnswer
from tools.research.verdict.calibration import certainty

_DEPLOYMENT = ("model.", "gpu.", "interconnect")
"""Facts of this model and these GPUs: a reader whose conditions hold on them is evidence that the
flag acts *here*, more than one whose conditions hold on server defaults."""
_CONVERSIONS = tuple(
    f"passed to {b}()" for b in ("bool", "int", "float", "str", "list", "dict", "tuple", "repr")
)
_VALIDATORS = ("check_", "_check_", "validate", "_validate", "verify", "_verify")
BASES = {
    "startup": "SGLang's own start-up run on the deployment's facts",
    "reached": "a reader a chain of callers surely reaches here",
    "guard": "guards evaluated on the deployment's facts (a module loaded, a class built, a condition)",
    "alike": "every test of the value answering alike with and without it (the reader's code read)",
    "open": "a guard or value left open at run time",
    "missing": "a deployment fact nobody gave",
    "argument": "argument code only (resolution read, not run)",
    "index": "what the code index holds: no reader, only a log, only a compatibility check",
    "catalog": "the version's flag catalog",
}
"""What a verdict rests on (`CodeVerdict.basis`). A playbook rule alone is the agent's own
(`decided_by: playbook`, `agent.policy.builtin.research`)."""


@dataclass
class Question:
    """What the rules read: the verdict so far (its findings), the flag researched (the replacement
    of a deprecated one), SGLang's own start-up answer, and what resolution passes are read with."""

    v: CodeVerdict
    target: FlagInfo
    startup: StartupAnswer | None = None
    index: FlagIndex | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    flag_values: dict[str, Any] = field(default_factory=dict)

    @property
    def found(self) -> list[Finding]:
        return self.v.findings

    @cached_property
    def acting(self) -> list[Finding]:
        """Readers outside compatibility checks."""
        return [f for f in self.found if not is_validator(f)]

    @cached_property
    def running(self) -> list[Finding]:
        """Acting readers that run here, or may (runtime state)."""
        return [f for f in self.acting if f.state in ("on", "runtime")]

    @cached_property
    def unknown(self) -> list[Finding]:
        return [f for f in self.found if f.state == "unknown"]

    @property
    def code_decides(self) -> bool:
        """No answer of SGLang's own start-up settles it (not run, or unknown)."""
        return self.startup is None or self.startup.kind == "unknown"


@dataclass(frozen=True)
class Decision:
    """A rule's verdict, its summary, what it rests on, and what of that is not settled."""

    verdict: str
    summary: str
    basis: str
    unsettled: str = ""


@dataclass(frozen=True)
class Rule:
    """A named rule: `decide` returns its `Decision`, or None when it does not hold."""

    name: str
    decide: Callable[[Question], Decision | None]


def _basis(f: Finding) -> str:
    """What a reader's evidence is: open at runtime, argument code, surely reached, or guards
    evaluated on the facts."""
    if f.state == "runtime":
        return "open"
    if f.config:
        return "argument"
    return "reached" if f.sure else "guard"


def _what(v: CodeVerdict) -> str:
    return v.flag + ("" if v.value is True or v.value is None else f" {v.value}")


def _startup_lines(v: CodeVerdict, startup: StartupAnswer, last: int) -> None:
    """The lines that settled it while SGLang resolved the flag, latest first, as evidence."""
    for where in reversed(startup.lines[-last:]):
        v.findings.insert(0, Finding(where, "", "start-up", "on", "ran while SGLang resolved the flag"))


def startup_refuses(q: Question) -> Decision | None:
    """SGLang's own argument resolution, run for this deployment, raises on the flag."""
    v, s = q.v, q.startup
    if s is None or s.kind != "refused":
        return None
    _startup_lines(v, s, 3)
    if s.where:
        v.findings.insert(0, Finding(s.where, s.message, "start-up", "on", "raised here"))
    return Decision(
        "refuses-to-start",
        f"SGLang {v.version}'s own argument resolution, run for this deployment, refuses {_what(v)}: "
        f'"{s.message}" at {s.where}.',
        "startup",
    )


def parser_drops(q: Question) -> Decision | None:
    """SGLang's own parser stores nothing for the flag (a deprecation that only warns)."""
    v, s = q.v, q.startup
    if s is None or s.kind != "same" or s.stored is not False:
        return None
    summary = (
        f"SGLang {v.version}'s own parser stores nothing for {v.flag} (its action at {v.definition} "
        "only warns): no setting receives it, on this deployment or any other."
    )
    v.findings = [Finding(v.definition or "", v.flag, "argparse", "off", "its action stores nothing")]
    v.notes = [n for n in v.notes if not n.startswith("deprecated: researched through")]
    _startup_lines(v, s, 4)
    return Decision("dead", summary, "startup")


def startup_same(q: Question) -> Decision | None:
    """The same resolved configuration with and without the flag; dead when nothing reads it."""
    v, s = q.v, q.startup
    if s is None or s.kind != "same":
        return None
    # the code's own verdict, had start-up not run: dead stays dead (it says more than no-op)
    dead = None if refusal_reached(q) or fallback_off(q) else no_reader(q) or only_logged(q)
    if dead is not None:
        summary, verdict = dead.summary, "dead"
    else:
        settled = f"; it last settles `{v.dest}` at {s.lines[-1]}" if s.lines else ""
        summary, verdict = (
            f"SGLang {v.version}'s own argument resolution, run for this deployment, gives the same "
            f"configuration with and without {_what(v)} (reset, alias or a value it picks by itself)"
            f"{settled}: nothing it starts differs.",
            "no-op",
        )
    _startup_lines(v, s, 4)
    return Decision(verdict, summary, "startup")


def ranks_without_gpus(q: Question) -> Decision | None:
    """The flag sizes the parallel world beyond the GPUs a node has: SGLang's launcher places each
    rank of a node on GPU `base_gpu_id + local rank x gpu_id_step` (data-parallel replicas without
    DP attention each on GPUs of their own), and a rank on a GPU the node does not have cannot start."""
    if not set(PARALLEL_SIZES) & set(q.flag_values):
        return None
    size = {d: q.flag_values.get(d, q.facts.get(f"server.{d}")) for d in (*PARALLEL_SIZES, "nnodes")}
    step, base = q.facts.get("server.gpu_id_step", 1), q.facts.get("server.base_gpu_id", 0)
    gpus, dp_attention = q.facts.get("gpu.count"), q.facts.get("server.enable_dp_attention")
    tp, pp, dp, nodes = size["tp_size"], size["pp_size"], size["dp_size"] or 1, size["nnodes"] or 1
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (tp, pp, dp, nodes, step, base, gpus)):
        return None
    if dp_attention is None or not gpus or q.facts.get("server.device") not in (None, "cuda"):
        return None  # unknown, or a CPU engine whose ranks share its cores
    per_node = -(-tp * pp * (1 if dp_attention else dp) // nodes)
    last = base + (per_node - 1) * step
    if last < gpus:
        return None
    where = next(
        (f"{r.path}:{r.line}" for r in q.index.reads("gpu_id_step") if r.path.endswith("entrypoints/engine.py")),
        "",
    ) if q.index is not None else ""  # fmt: skip
    sizes = ", ".join(f"{d} {size[d]}" for d in (*PARALLEL_SIZES, "nnodes") if size[d] is not None)
    if where:
        q.v.findings.insert(0, Finding(where, "gpu_id", "launch", "on", "places each rank on a GPU"))
    return Decision(
        "refuses-to-start",
        f"{_what(q.v)} asks for {per_node} GPU(s) a node ({sizes}{', DP attention' if dp_attention else ''}); "
        f"the launcher{' at ' + where if where else ''} would place a rank on GPU {last}, and this node has "
        f"{gpus} (gpu.count): that rank cannot start.",
        "guard",
    )


def refusal_reached(q: Question) -> Decision | None:
    """A `raise`/`assert` that fires here, reached from a running reader."""
    for f in q.found:
        for e in f.exits if f.state == "on" else ():
            if e.kind in ("raise", "assert") and e.truth is True:
                via = f" via {' / '.join(e.via)}" if e.via else ""
                summary = f'{e.exc} at {e.location}: "{e.message}" (reached from {f.location}{via}; {", ".join(e.used)}).'
                return Decision("refuses-to-start", summary, _basis(f))
    return None


def fallback_off(q: Question) -> Decision | None:
    """A fallback that fires here switches the flag off."""
    for f in q.found:
        for e in f.exits:
            if e.kind == "fallback" and e.truth is True and q.target.dest in e.sets:
                summary = (
                    f'switched off at {e.location}: "{e.message}" ({", ".join(e.used) or "condition holds"}).'
                )
                return Decision("no-op", summary, _basis(f))
    return None


def no_reader(q: Question) -> Decision | None:
    """Nothing on the serving path reads it."""
    if q.found:
        return None
    v = q.v
    summary = f"{q.target.name} is defined in SGLang {v.version} but nothing on the serving path reads `{q.target.dest}`."
    return Decision("dead", summary, "index")


def only_logged(q: Question) -> Decision | None:
    """Every reader only logs it, or reads it into a name nothing uses."""
    found = q.found
    if not found or not all(f.why == "only logged" or "never used" in f.why for f in found):
        return None
    summary = f"read only where nothing follows: {found[0].location} ({found[0].why})."
    return Decision("dead", summary, "index")


def sets_back(q: Question) -> Decision | None:
    """A resolution pass sets the trial value back to the one running now (start-up not run)."""
    if not (q.code_decides and (q.running or q.unknown) and q.index is not None):
        return None
    over = overridden(q.index, q.target.dest, q.facts, q.flag_values)
    if over is None:
        return None
    where, func, why = over
    q.v.findings.append(Finding(where, f"return {{{q.target.dest!r}: ...}}", func, "off", why))
    return Decision("no-op", f"overridden: {func} at {where} {why}.", "argument")


def sets_anyway(q: Question) -> Decision | None:
    """A resolution pass gives the flag the trial value by itself here (start-up not run)."""
    if not (q.code_decides and (q.running or q.unknown) and q.index is not None):
        return None
    anyway = set_anyway(q.index, q.target.dest, q.facts, q.flag_values)
    if anyway is None:
        return None
    where, func, why, runtime = anyway
    q.v.findings.append(Finding(where, f"self.{q.target.dest} = ...", func, "off", why))
    unsettled = f"a guard left open at runtime: {', '.join(runtime)}" if runtime else ""
    basis = "open" if runtime else "argument"
    return Decision("no-op", f"set anyway: {func} at {where} {why}.", basis, unsettled)


def reader_runs(q: Question) -> Decision | None:
    """A reader runs here: the one that best shows the flag acting is the evidence."""
    if not q.running:
        return None
    best = max(
        q.running,
        key=lambda f: (
            f.state == "on",
            not f.alternative,
            not f.config,
            f.sure,  # code that surely runs here: the reason, not a reader of another mode
            not f.why.startswith(_CONVERSIONS),  # `"x": bool(cfg.x)` in a report is no effect yet
            "the flag turns" in f.why,  # its test changes value here: a shown effect
            f.function != "<module>",  # a function that runs beats a module-level table entry
            sum(c["outcome"] == "pass" and c["fact"].startswith(_DEPLOYMENT) for c in f.conditions),
            sum(c["outcome"] == "pass" for c in f.conditions),
        ),
    )
    held = "; ".join(f"{c['condition']} with {c['fact']}" for c in best.conditions if c["outcome"] == "pass")
    summary = f"read at {best.location} in {best.function}" + (f"; holds here: {held}" if held else "") + "."
    unsettled = ""
    if best.state == "runtime":  # a guard or value research could not settle from the facts
        unsettled = f"a guard or value left open: {best.why}"
        summary += f" Not settled from the deployment's facts: {best.why}."
    elif best.config:  # only argument code reads it: where the value goes at run time is not followed
        unsettled = "only argument code reads it; its use at run time was not followed"
        summary += " Only argument code reads it here; its use at run time was not followed."
    if any(e.kind == "override" for e in best.exits):  # what it overrides, and to what
        summary += f" It {best.why}."
    return Decision("applies", summary, _basis(best), unsettled)


def open_fact(q: Question) -> Decision | None:
    """A reader's conditions need a deployment fact nobody gave."""
    if not q.unknown:
        return None
    f = q.unknown[0]
    return Decision("unknown", f"{f.location} {f.why}.", "missing", f"a fact missing: {f.why}")


def only_checks(q: Question) -> Decision | None:
    """Only compatibility checks read it: they act on nothing."""
    if q.acting:
        return None
    return Decision("no-op", f"read only by compatibility checks ({q.found[0].location}).", "index")


def gated_off(q: Question) -> Decision | None:
    """Every reader is off here, and one that would run is gated off by a caller or callee."""
    for f in q.found:
        for e in f.exits:
            if e.kind == "gate":
                via = f" via {' / '.join(e.via)}" if e.via else ""
                summary = (
                    f"every reader is off here; {f.location} is gated at {e.location}{via}: {e.message}."
                )
                return Decision("no-op", summary, "guard")
    return None


def every_reader_off(q: Question) -> Decision:
    """Every reader is off here: a guard fails on the facts, its module is not loaded, its class not built."""
    found = q.found
    if alike := next((f for f in found if f.why.startswith(ALIKE)), None):
        return Decision("no-op", f"every reader is off here; {alike.location}: {alike.why}.", "alike")
    first = next((f for f in found if any(c["outcome"] == "fail" for c in f.conditions)), found[0])
    failing = next((c for c in first.conditions if c["outcome"] == "fail"), None)
    why = f"{failing['condition']} with {failing['fact']}" if failing else first.why
    if failing and re.search(r"model\.(experts_per_tok|num_experts) = (0|None)\b", failing["fact"]):
        why = f"the model has no MoE layers ({failing['fact']}), so {failing['condition']} never holds"
    return Decision("no-op", f"every reader is off here, e.g. {first.location}: {why}.", "guard")


RULES: tuple[Rule, ...] = (
    Rule("startup-refuses", startup_refuses),
    Rule("parser-drops", parser_drops),
    Rule("startup-same", startup_same),
    Rule("ranks-without-gpus", ranks_without_gpus),
    Rule("refusal-reached", refusal_reached),
    Rule("fallback-off", fallback_off),
    Rule("no-reader", no_reader),
    Rule("only-logged", only_logged),
    Rule("sets-back", sets_back),
    Rule("sets-anyway", sets_anyway),
    Rule("reader-runs", reader_runs),
    Rule("open-fact", open_fact),
    Rule("only-checks", only_checks),
    Rule("gated-off", gated_off),
    Rule("every-reader-off", every_reader_off),
)
"""In order: the first rule that holds decides (`every-reader-off` always holds)."""


def decide(q: Question) -> None:
    """Set the verdict of `q.v`: its verdict, summary, certainty, and the rule and basis it rests on."""
    for rule in RULES:
        d = rule.decide(q)
        if d is not None:
            break
    v = q.v
    v.verdict, v.summary = d.verdict, d.summary
    v.rule, v.basis, v.unsettled = rule.name, d.basis, d.unsettled
    v.certainty = certainty(rule.name, d.basis, unsettled=d.unsettled, verdict=d.verdict)


def is_validator(f: Any) -> bool:
    """A reader in a compatibility check (`check_*`, `validate*`, `verify*`): it acts on nothing."""
    last = f.function.rsplit(".", 1)[-1]
    return last.startswith(_VALIDATORS)
