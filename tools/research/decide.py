"""The verdict from a flag's findings (readers with their state and exits), in the shared vocabulary.

Order: a refusal that fires from a running reader; a fallback that switches the flag off; no reader
(dead); readers that only log (dead); a running reader (applies); an open deployment fact (unknown);
only compatibility checks read it, or every reader is off (no-op; a reader that runs but whose
effect a caller or callee gates off here is cited first). An `applies` verdict cites the running
reader that best shows the flag acting here: not in another registry entry's module, not argument
code, in a function that surely runs here, with conditions that hold on model or GPU facts.
"""

from __future__ import annotations

import re
from typing import Any

from tools.research.catalog import FlagInfo

_DEPLOYMENT = ("model.", "gpu.", "interconnect")
"""Facts of this model and these GPUs: a reader whose conditions hold on them is evidence that the
flag acts *here*, more than one whose conditions hold on server defaults."""
_CONVERSIONS = tuple(
    f"passed to {b}()" for b in ("bool", "int", "float", "str", "list", "dict", "tuple", "repr")
)
_VALIDATORS = ("check_", "_check_", "validate", "_validate", "verify", "_verify")
UNSURE = 0.55
"""The certainty of a verdict that rests on a guard research could not evaluate or a value it could
not follow: at most 0.6, so the agent tries such a flag after the sure ones and never rules one out
for good on it (`agent.policy.verdict.FlagVerdict.rejected`)."""


def decide(v: Any, target: FlagInfo) -> None:
    """Set `v.verdict`, `v.certainty` and `v.summary` from its findings (see `tools.research.analysis`)."""
    found = v.findings
    refusals = [
        (f, e)
        for f in found
        if f.state == "on"
        for e in f.exits
        if e.kind in ("raise", "assert") and e.truth is True
    ]
    acting = [f for f in found if not is_validator(f)]
    offs = [
        (f, e)
        for f in found
        for e in f.exits
        if e.kind == "fallback" and e.truth is True and target.dest in e.sets
    ]
    if refusals:
        f, e = refusals[0]
        via = f" via {' / '.join(e.via)}" if e.via else ""
        v.verdict, v.certainty = "refuses-to-start", 0.9
        v.summary = (
            f'{e.exc} at {e.location}: "{e.message}" (reached from {f.location}{via}; {", ".join(e.used)}).'
        )
    elif offs:
        f, e = offs[0]
        v.verdict, v.certainty = "no-op", 0.85
        v.summary = f'switched off at {e.location}: "{e.message}" ({", ".join(e.used) or "condition holds"}).'
    elif not found:
        v.verdict, v.certainty = "dead", 0.95
        v.summary = f"{target.name} is defined in SGLang {v.version} but nothing on the serving path reads `{target.dest}`."
    elif all(f.why == "only logged" or "never used" in f.why for f in found):
        v.verdict, v.certainty = "dead", 0.9
        v.summary = f"read only where nothing follows: {found[0].location} ({found[0].why})."
    elif on := [f for f in acting if f.state in ("on", "runtime")]:
        best = max(
            on,
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
        held = "; ".join(
            f"{c['condition']} with {c['fact']}" for c in best.conditions if c["outcome"] == "pass"
        )
        v.verdict = "applies"
        v.certainty = 0.9 if best.state == "on" else UNSURE
        v.summary = (
            f"read at {best.location} in {best.function}" + (f"; holds here: {held}" if held else "") + "."
        )
        if best.state == "runtime":  # a guard or value research could not settle from the facts
            v.summary += f" Not settled from the deployment's facts: {best.why}."
        elif best.config:  # only argument code reads it: where the value goes at run time is not followed
            v.certainty = UNSURE
            v.summary += " Only argument code reads it here; its use at run time was not followed."
        if any(e.kind == "override" for e in best.exits):  # what it overrides, and to what
            v.summary += f" It {best.why}."
    elif unknown := [f for f in found if f.state == "unknown"]:
        v.verdict, v.certainty = "unknown", 0.3
        v.summary = f"{unknown[0].location} {unknown[0].why}."
    elif not acting:
        v.verdict, v.certainty = "no-op", 0.8
        v.summary = f"read only by compatibility checks ({found[0].location})."
    elif gated := [(f, e) for f in found for e in f.exits if e.kind == "gate"]:
        f, e = gated[0]
        v.verdict, v.certainty = "no-op", 0.8
        via = f" via {' / '.join(e.via)}" if e.via else ""
        v.summary = f"every reader is off here; {f.location} is gated at {e.location}{via}: {e.message}."
    else:
        first = next((f for f in found if any(c["outcome"] == "fail" for c in f.conditions)), found[0])
        failing = next((c for c in first.conditions if c["outcome"] == "fail"), None)
        why = f"{failing['condition']} with {failing['fact']}" if failing else first.why
        if failing and re.search(r"model\.(experts_per_tok|num_experts) = (0|None)\b", failing["fact"]):
            why = f"the model has no MoE layers ({failing['fact']}), so {failing['condition']} never holds"
        v.verdict, v.certainty = "no-op", 0.85
        v.summary = f"every reader is off here, e.g. {first.location}: {why}."


def is_validator(f: Any) -> bool:
    """A reader in a compatibility check (`check_*`, `validate*`, `verify*`): it acts on nothing."""
    last = f.function.rsplit(".", 1)[-1]
    return last.startswith(_VALIDATORS)
