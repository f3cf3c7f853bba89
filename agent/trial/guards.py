"""Check a guard found in SGLang's code (e.g. `topk > 2`) against this deployment's facts.

Code names are mapped to facts (`topk` -> `model.experts_per_tok`); a name with no known fact, or
an expression too complex to split, gives `unknown`, never a guess.
"""

from __future__ import annotations

import re
from typing import Any

from agent.policy.conditions import ConditionError, check

# Identifier used in SGLang code -> fact name (see DeploymentContext.facts).
CODE_FACTS = {
    "topk": "model.experts_per_tok",
    "top_k": "model.experts_per_tok",
    "num_experts_per_tok": "model.experts_per_tok",
    "n_routed_experts": "model.num_experts",
    "num_experts": "model.num_experts",
    "tp_size": "server.tp_size",
    "tp_world_size": "server.tp_size",
    "attention_backend": "server.attention_backend",
    "moe_runner_backend": "server.moe_runner_backend",
    "kv_cache_dtype": "server.kv_cache_dtype",
    "speculative_algorithm": "server.speculative_algorithm",
    "disable_cuda_graph": "server.disable_cuda_graph",
    "enable_dp_attention": "server.enable_dp_attention",
    "sm_version": "gpu.sm",
}
_DERIVED = {
    # weight-only int8/int4 MoE kernels: only with such a quantization
    "use_int8_w8a16": lambda f: _quant(f, ("w8a16", "int8")),
    "use_int4_w4a16": lambda f: _quant(f, ("w4a16", "int4", "awq", "gptq")),
    "use_fp8_w8a8": lambda f: _quant(f, ("fp8",)),
    "_is_sm90_supported": lambda f: None if "gpu.sm" not in f else f["gpu.sm"] == 90,
    "_is_sm100_supported": lambda f: None if "gpu.sm" not in f else f["gpu.sm"] in (100, 103),
}
_IDENT = re.compile(r"[A-Za-z_][\w.]*(\(\))?")


def _quant(facts: dict[str, Any], needles: tuple[str, ...]) -> bool | None:
    if "model.quantization" not in facts:
        return None
    q = str(facts["model.quantization"] or "").lower()
    return any(n in q for n in needles)


def split_guard(guard: str) -> list[str]:
    """`(a and (not b) and c > 2)` -> `["a", "not b", "c > 2"]` (top-level `and` only)."""
    text = guard.strip()
    while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1].strip()
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0 and text.startswith(" and ", i):
            parts.append(text[start:i])
            start = i + 5
            i += 5
            continue
        i += 1
    parts.append(text[start:])
    out = []
    for p in parts:
        p = p.strip()
        while p.startswith("(") and p.endswith(")") and _balanced(p[1:-1]):
            p = p[1:-1].strip()
        if p:
            out.append(p)
    return out


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += ch in "(["
        depth -= ch in ")]"
        if depth < 0:
            return False
    return depth == 0


def _last_name(ident: str) -> str:
    return ident.removesuffix("()").rsplit(".", 1)[-1]


def check_guard(term: str, facts: dict[str, Any]) -> dict[str, Any]:
    """One guard term checked: `{"condition", "fact", "outcome"}` with outcome pass/fail/unknown."""
    negated = term.startswith("not ")
    body = term[4:].strip() if negated else term
    m = _IDENT.match(body)
    if not m:
        return {"condition": term, "fact": "not a simple condition", "outcome": "unknown"}
    name = _last_name(m.group(0))
    rest = body[m.end() :]
    if name in _DERIVED:
        value = _DERIVED[name](facts)
        local = {name: value} if value is not None else {}
        fact_name = name
    elif name in CODE_FACTS and CODE_FACTS[name] in facts:
        fact_name = CODE_FACTS[name]
        local = {name: facts[fact_name]}
    else:
        return {"condition": term, "fact": f"{name}: no known fact", "outcome": "unknown"}
    try:
        result = check(("not " if negated else "") + name + rest, local)
    except ConditionError:
        return {"condition": term, "fact": f"{fact_name} = {local.get(name)!r}", "outcome": "unknown"}
    shown = f"{fact_name} = {result.actual!r}" if result.outcome != "unknown" else f"{fact_name}: unknown"
    return {"condition": term, "fact": shown, "outcome": result.outcome}


def check_guards(guards: list[str], facts: dict[str, Any]) -> list[dict[str, Any]]:
    """Every term of every guard, checked (guards are combined with `and`)."""
    return [check_guard(term, facts) for g in guards for term in split_guard(g)]
