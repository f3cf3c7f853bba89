"""Three-valued evaluation of a guard from SGLang's code against a deployment's facts.

A guard is Python source (`(_is_sm90_supported or _is_sm100_supported) and topk > 2`). It is parsed
with `ast` (never run) and evaluated with Kleene logic: `and`/`or`/`not`/comparisons/`in`/`is` over
True, False and UNKNOWN. Names resolve, in order, to the flag under research (its trial value),
other flags (`server.<dest>` facts), platform predicates (`is_sm90_supported()`, `_is_cuda`,
`get_platform().is_sm100`, `get_device_capability()` → `gpu.sm`, `get_device_name()` →
`gpu.name`), model facts for well-known code names (`topk` → `model.experts_per_tok`), then the
function's single-assigned locals, the caller's arguments and the module's constants. Anything else stays UNKNOWN, never a guess; the outcome says
whether it was unknown for a missing deployment fact or for runtime state.

The records, values and tables are in `guards/terms.py`, the evaluator itself in `guards/evaluator.py`.
"""

from __future__ import annotations

from tools.research.guards.evaluator import Evaluator, TooLarge
from tools.research.guards.terms import Env, Outcome, parse_guard, truth
from tools.research.platform_facts import UNKNOWN

TOO_LARGE = "(a guard too large to evaluate)"
"""The runtime term of a guard whose evaluation ran past `evaluator.MAX_STEPS` or Python's stack."""


def evaluate(source: str, env: Env) -> Outcome:
    """Evaluate one guard (Python source) against `env`."""
    out = Outcome()
    node = parse_guard(source)
    try:
        out.value = UNKNOWN if node is None else Evaluator(env, out).ev(node, 0)
    except (TooLarge, RecursionError):  # a guard this big is no fact of the deployment: unknown
        out.value = UNKNOWN
        out.runtime.append(TOO_LARGE)
    out.used = list(dict.fromkeys(out.used))
    out.missing = list(dict.fromkeys(out.missing))
    out.runtime = list(dict.fromkeys(out.runtime))
    return out


def evaluate_all(guards: list[str], env: Env) -> Outcome:
    """The conjunction of several guards (an empty list is True), Kleene `and`; each guard is parsed
    once and cached, since the same guard texts recur across readers, calls and exits."""
    total = Outcome(value=True)
    for guard in guards:
        one = evaluate(guard, env)
        total.used += one.used
        total.missing += one.missing
        total.runtime += one.runtime
        total.flag_dependent |= one.flag_dependent
        t = truth(one.value)
        if t is False:
            total.value = False
            break
        if t is UNKNOWN:
            total.value = UNKNOWN
    total.used = list(dict.fromkeys(total.used))
    total.missing = list(dict.fromkeys(total.missing))
    total.runtime = list(dict.fromkeys(total.runtime))
    return total
