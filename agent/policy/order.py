"""Which candidate to trial next: expected value per restart.

    value = research certainty x plausible gain / restart cost

Certainty comes from the research verdict (its `certainty` when the researcher gives one, else from
the verdict itself: `applies` is likely to matter, `unknown` is a coin flip); the plausible gain from
the playbook lever's priority (its `expected_gain` when it has one); the restart cost from the
lever's `restart_cost` (1 = one ordinary restart; torch.compile and the like take longer). A run
with a budget then spends it on the candidates most likely to pay for their restart.

A near miss (rejected as not established although it still looked like a winner) may get one
second look, ranked with the untried candidates: its certainty is the chance, given what was
measured, that it helps at all, its plausible gain the estimate measured.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

from agent.policy.verdict import REJECTED

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


def expected_value(candidate: dict[str, Any], verdict: Any) -> float:
    """certainty x plausible gain / restart cost for a candidate as the planner sees it."""
    gain = candidate.get("expected_gain") or GAIN_BY_PRIORITY.get(candidate.get("priority", ""), 0.02)
    sure = certainty(verdict)
    if candidate.get("status") in PLAYBOOK_DOUBTS:  # the playbook's conditions say it won't help or start
        sure *= 0.25
    return sure * float(gain) / restart_cost(candidate)


def restart_cost(candidate: dict[str, Any]) -> float:
    """Restarts a trial of the candidate is worth (the playbook's `restart_cost`, else 2 for a slow start)."""
    return float(candidate.get("restart_cost") or (2.0 if candidate["flag"] in SLOW_START else 1.0))


def second_look_value(candidate: dict[str, Any], near_miss: dict[str, Any]) -> float:
    """certainty x gain / restart cost of trying a near miss again, from its best judged interval."""
    ratio, low, high = (near_miss.get(k) for k in ("ratio", "ci_low", "ci_high"))
    if not (ratio and low and high and 0 < low < high):
        return 0.0
    se = (math.log(high) - math.log(low)) / (2 * 1.96)
    sure = NormalDist().cdf(math.log(ratio) / se)
    return sure * max(0.0, ratio - 1) / restart_cost(candidate)


def next_trials(
    candidates: list[dict[str, Any]], verdicts: dict[str, Any], tried: dict[str, list[dict[str, Any]]]
) -> list[tuple[dict[str, Any], str]]:
    """What to trial next, best first: (candidate, why) for the untried candidates and for each near
    miss tried once, ranked by value per restart. `tried`: flag -> its trial results so far."""
    ranked: list[tuple[float, int, dict[str, Any], str]] = []
    for i, c in enumerate(candidates):
        results = tried.get(c["flag"], [])
        if not results:
            ranked.append((expected_value(c, verdicts.get(c["flag"])), i, c, "untried"))
        elif len(results) == 1 and (miss := results[0].get("near_miss")):
            ranked.append((second_look_value(c, miss), i, c, "second look at a near miss"))
    ranked.sort(key=lambda x: (-x[0], x[1]))
    return [(c, why) for _, _, c, why in ranked]
