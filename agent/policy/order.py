"""What trialling a candidate is worth: expected value per restart.

    value = research certainty x plausible gain / restart cost

Certainty comes from the research verdict (its `certainty` when the researcher gives one, else from
the verdict itself: `applies` is likely to matter, `unknown` is a coin flip); the plausible gain from
the playbook lever's priority (its `expected_gain` when it has one); the cost from the runner's
`trial_cost` (1 = an ordinary trial; torch.compile and the like start slower, and a trial of them
takes as much longer as their two slow launches add to a trial measured here), else the lever's
`restart_cost`. A run with a budget then spends it on the candidates most likely to pay for their
restart.

A near miss's second look is worth what it measured (`second_look_value`); the queue built from
these values is `agent.policy.trialqueue`.
"""

from __future__ import annotations

from typing import Any

from agent.policy.verdict import REJECTED, doubtful_rejection
from agent.trial.firstlook import log_estimate, look_value
from agent.trial.spread import establishable  # noqa: F401 - the planner's name for it

GAIN_BY_PRIORITY = {"high": 0.06, "medium": 0.04, "low": 0.02}
CERTAINTY_BY_VERDICT = {"applies": 0.8, "unknown": 0.4}
CERTAINTY_WORDS = {"high": 0.9, "medium": 0.6, "low": 0.3}
PLAYBOOK_DOUBTS = ("no-op", "incompatible")
"""Playbook statuses that research overruled: still tried, but only after the undisputed ones."""
SLOW_START = ("--enable-torch-compile",)
"""Flags known to lengthen start-up several fold (counted as two restarts)."""


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def certainty(verdict: Any) -> float:
    """0..1: how sure research is that the flag changes something here."""
    given = _get(verdict, "certainty")
    if isinstance(given, int | float) and not isinstance(given, bool):
        sure = max(0.0, min(1.0, float(given)))
        # a doubtful no-op or refusal is still tried: the chance it acts is the chance research is wrong
        return 1.0 - sure if _get(verdict, "verdict") in REJECTED else sure
    if isinstance(given, str) and given.lower() in CERTAINTY_WORDS:
        return CERTAINTY_WORDS[given.lower()]
    return CERTAINTY_BY_VERDICT.get(str(_get(verdict, "verdict", "unknown")), 0.0)


def plausible_gain(candidate: dict[str, Any]) -> float:
    """The gain the lever may bring here at the levels where it acts: its `expected_gain` or its
    priority's, times what the baseline's state makes of it (`state_factor`, see
    `agent.policy.loadstate`)."""
    gain = candidate.get("expected_gain") or GAIN_BY_PRIORITY.get(candidate.get("priority", ""), 0.02)
    return float(gain) * float(candidate.get("state_factor") or 1.0)


def expected_value(candidate: dict[str, Any], verdict: Any) -> float:
    """certainty x plausible gain / restart cost for a candidate as the planner sees it."""
    gain = plausible_gain(candidate)
    sure = certainty(verdict)
    if candidate.get("status") in PLAYBOOK_DOUBTS:  # the playbook's conditions say it won't help or start
        sure *= 0.25
    return sure * float(gain) / restart_cost(candidate)


def waiting_value(
    candidates: list[dict[str, Any]], verdicts: dict[str, dict[str, Any]], touched: set[str]
) -> float:
    """The value per trial (`expected_value`) of the best candidate not in `touched` that research
    lets through (applies, unknown, or a doubtful rejection) and the lossy rule does not block; 0
    when none waits (the runner's `waiting_value`: what a third launch must be worth more than)."""
    values = [0.0]
    for c in candidates:
        verdict = verdicts.get(c["flag"])
        if c["flag"] in touched or verdict is None or (c.get("lossy") and not c.get("lossy_allowed")):
            continue
        if verdict["verdict"] in ("applies", "unknown") or doubtful_rejection(verdict):
            values.append(expected_value(c, verdict))
    return max(values)


def restart_cost(candidate: dict[str, Any]) -> float:
    """Ordinary trials' time a trial of the candidate takes: the runner's `trial_cost` (its slow
    launches against the length of a trial measured here), else the playbook's `restart_cost`
    (restarts' worth of one start), else 2 for a flag known to start slowly."""
    given = candidate.get("trial_cost") or candidate.get("restart_cost")
    return float(given or (2.0 if candidate["flag"] in SLOW_START else 1.0))


def slow_start_flags(candidates: list[Any]) -> dict[str, float]:
    """Flag → `restart_cost` of the playbook candidates whose start takes longer than a restart."""
    costs = {c.flag: restart_cost({"flag": c.flag, "restart_cost": getattr(c.lever, "restart_cost", None)})
             for c in candidates}  # fmt: skip
    return {flag: cost for flag, cost in costs.items() if cost > 1}


def second_look_value(candidate: dict[str, Any], near_miss: dict[str, Any]) -> float:
    """certainty x gain / restart cost of trying a near miss again, from its best judged interval."""
    return look_value([log_estimate(near_miss)], restart_cost(candidate))
