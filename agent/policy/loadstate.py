"""What the baseline shows about the server under the benchmark's load, and what it makes of a lever.

Per concurrency level of the baseline: the running decode batch (Little's law on what was measured:
output tok/s x time per output token, capped by the concurrency and by `--max-running-requests`),
the requests left waiting (the concurrency beyond the server's running cap), the KV pool's use
(running requests x tokens each / the pool), and whether the CUDA graphs the server captured cover
that batch. These become `level.*` facts at each level and `state.*` facts over the run, which the
playbook's conditions read: a lever's `acts_at` (the levels where its mechanism acts) and its
`raise_when` / `lower_when` (what makes it worth more or less here than its priority says).
`agent.policy.order.expected_value` multiplies the candidate's value by the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.policy.conditions import check
from agent.policy.order import GAIN_BY_PRIORITY

RAISE, LOWER, NOWHERE = 1.5, 0.5, 0.25
"""Factors on a candidate's expected value: per `raise_when` that holds, per `lower_when` that
holds, and when its `acts_at` holds at no measured level."""


@dataclass
class LoadState:
    """The baseline's load on this server, per level, and the flat facts conditions read."""

    levels: dict[int, dict[str, Any]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    def level_facts(self, c: int) -> dict[str, Any]:
        """`level.*` facts of level `c` (with the run's `state.*` facts)."""
        return {**self.facts, **{f"level.{k}": v for k, v in self.levels.get(c, {}).items()}}

    def describe(self) -> str:
        """One line per level for the report."""
        out = []
        for c, lv in self.levels.items():
            graph = "captured" if lv["captured"] else f"beyond the captured {lv['graph_max_bs']}"
            graph = graph if lv["graph_max_bs"] or lv["captured"] else "no graphs captured"
            out.append(
                f"c={c}: running batch ~{lv['running']:.0f} ({graph}), {lv['queued']} waiting, "
                f"KV {lv['kv_use']:.0%}"
            )
        return "; ".join(out)


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def load_state(facts: dict[str, Any], bench: Any, reps: list[Any]) -> LoadState:
    """The state of each measured level from the server's resolved facts and the baseline's sweeps."""
    cap = _num(facts.get("server.max_running_requests"))
    pool = _num(facts.get("server.max_total_num_tokens"))
    graph = _num(facts.get("server.cuda_graph_max_bs_decode")) or _num(facts.get("server.cuda_graph_max_bs"))
    no_graph = bool(facts.get("server.disable_cuda_graph"))
    per_request = bench.input_len + bench.output_len
    state = LoadState()
    for c in sorted({lv.max_concurrency for s in reps for lv in s.levels}):
        got = [
            (lv.output_throughput, lv.mean_tpot_ms)
            for s in reps
            for lv in s.levels
            if lv.max_concurrency == c
        ]
        little = [t * p / 1000 for t, p in got if t and p]
        running = min(float(c), cap or float(c), sum(little) / len(little) if little else float(c))
        running = max(1.0, running)
        queued = max(0, c - int(cap)) if cap else 0
        kv = min(1.0, running * per_request / pool) if pool else 0.0
        state.levels[c] = {
            "concurrency": c, "running": round(running, 1), "queued": queued, "kv_use": round(kv, 3),
            "graph_max_bs": int(graph) if graph else 0,
            "captured": not no_graph and graph is not None and running <= graph,
        }  # fmt: skip
    if state.levels:
        top = state.levels[max(state.levels)]
        low = state.levels[min(state.levels)]
        beyond = max(0.0, top["running"] - (top["graph_max_bs"] if not no_graph else 0))
        state.facts = {
            "state.top_running": top["running"], "state.top_queued": top["queued"],
            "state.top_kv_use": top["kv_use"], "state.min_running": low["running"],
            "state.uncaptured_share": round(beyond / top["running"], 3),
            "state.uncaptured_levels": sum(not lv["captured"] for lv in state.levels.values()),
        }  # fmt: skip
    return state


def acts_at(lever: Any, state: LoadState) -> list[int]:
    """The measured levels where the lever's mechanism acts (every level when it names none)."""
    conditions = list(getattr(lever, "acts_at", []) or [])
    return _levels_where(conditions, state) if conditions else list(state.levels)


def costs_at(lever: Any, state: LoadState) -> list[int]:
    """The measured levels where the lever is known to cost (its `costs_at`; none when it names none)."""
    conditions = list(getattr(lever, "costs_at", []) or [])
    return _levels_where(conditions, state) if conditions else []


def _levels_where(conditions: list[str], state: LoadState) -> list[int]:
    """The measured levels where no condition fails (an unknown fact does not rule a level out)."""
    return [
        c for c in state.levels if all(check(x, state.level_facts(c)).outcome != "fail" for x in conditions)
    ]


def state_factor(lever: Any, state: LoadState, judged: list[int] | None = None) -> tuple[float, list[str]]:
    """(factor on the expected value, why) from the lever's hints and the baseline's state.
    `judged`: the levels a goal decides on (a named level, a latency goal's lowest; None: every
    level); a lever whose mechanism acts at none of them is worth as little as one acting nowhere."""
    if not state.levels:
        return 1.0, []
    factor, why = 1.0, []
    facts = {**state.facts}
    for cond in getattr(lever, "raise_when", []) or []:
        if (r := check(cond, facts)).outcome == "pass":
            factor *= RAISE
            why.append(f"raised: {r.plain()}")
    for cond in getattr(lever, "lower_when", []) or []:
        if (r := check(cond, facts)).outcome == "pass":
            factor *= LOWER
            why.append(f"lowered: {r.plain()}")
    acts = acts_at(lever, state) if getattr(lever, "acts_at", None) else None
    if acts is not None and not acts:
        factor *= NOWHERE
        why.append(f"lowered: no measured level where {' and '.join(lever.acts_at)}")
    elif acts is not None and judged and not set(acts) & set(judged):
        factor *= NOWHERE
        at = ", ".join(f"c={c}" for c in acts)
        why.append(f"lowered: it acts at {at}; the goal judges {', '.join(f'c={c}' for c in judged)}")
    return factor, why


def largest_gain(candidates: list[Any], state: LoadState) -> float | None:
    """The largest gain a playbook candidate may bring here: its `expected_gain` or its priority's,
    times what the baseline's state makes of it (`state_factor`), as the planner ranks them. None
    when no candidate is left to try."""
    gains = [
        float(c.lever.expected_gain or GAIN_BY_PRIORITY.get(c.lever.priority, 0.02))
        * state_factor(c.lever, state)[0]
        for c in candidates
        if c.status == "candidate"
    ]
    return max(gains) if gains else None
