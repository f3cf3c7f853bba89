"""A change rejected on its first launch that the numbers did not rule out, and the one later look at
it that is judged together with that launch.

One launch of each side measures a lever's gain give or take 1.5% at a 1% restart spread: a true
+2.5% lever ends its first launch below the bar that sends it to a second about one time in five
(futility, or not looking like a winner). When the run has restarts left at its end, such a change
may be tried again (`agent.policy.trialqueue.another_looks`), on the changes kept by then. That look
must not throw away the low first measurement: it is kept only when it is improved on its own and,
with the first launch's interval pooled in at each judged level (inverse-variance on the log
scale), the pooled estimate still clears the rule (interval above no change, at least the minimum
effect) at some level. In
`python benchmarks/bench_rule_power.py --where c8 --block-reps 2 --another-look` a true +2.5% lever
is kept 64% -> 69% of the time; a no-op tried twice this way 3.3% -> 3.7% (the look itself about
+0.5 points at a 1% spread, +1.3 at a true 1.5% under a declared 1%): the pooling refuses half of
the looks a fresh trial would keep.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

from agent.trial.judge import best_judged, judged
from agent.trial.record import TrialRecord
from agent.trial.state import RunnerState
from tools.bench.paired import Interval

Z = 1.96


def short_first_look(cmp: Any, bench: Any) -> dict[str, Any] | None:
    """The judged interval with the highest estimate (`agent.trial.judge.best_judged`) when a first launch was
    rejected without the numbers ruling the change out: an estimate above no change whose interval
    still reaches the minimum effect, no level significantly worse. None otherwise (a regression,
    or nothing left)."""
    if cmp.verdict == "regressed" or cmp.significantly_worse:
        return None
    if not any(i.ratio is not None for i in judged(cmp)):
        return None
    best = best_judged(cmp)
    if best["ratio"] <= 1 or (best["ci_high"] or 0) < 1 + bench.min_effect:
        return None
    return best


def log_estimate(interval: dict[str, Any]) -> tuple[float, float] | None:
    """(log ratio, its standard error) of a recorded 95% interval (None: malformed)."""
    ratio, low, high = (interval.get(k) for k in ("ratio", "ci_low", "ci_high"))
    if not (ratio and low and high and 0 < low < high):
        return None
    return math.log(ratio), (math.log(high) - math.log(low)) / (2 * Z)


def look_value(estimates: list[tuple[float, float] | None], cost: float) -> float:
    """certainty x gain / restart cost of one change whose parts measured `estimates` (independent
    trials: log ratios add, so do their variances)."""
    known = [e for e in estimates if e is not None]
    if not known or len(known) < len(estimates):
        return 0.0
    total = sum(log for log, _ in known)
    se = math.sqrt(sum(err**2 for _, err in known))
    return NormalDist().cdf(total / se) * max(0.0, math.expm1(total)) / cost


def pooled(first: dict[str, Any], now: Any) -> tuple[float, float, float] | None:
    """(ratio, low, high) of two independent intervals of one level pooled (None: either malformed)."""
    a = log_estimate(first)
    b = log_estimate({"ratio": now.ratio, "ci_low": now.ci_low, "ci_high": now.ci_high})
    if a is None or b is None:
        return None
    wa, wb = a[1] ** -2, b[1] ** -2
    mean, se = (wa * a[0] + wb * b[0]) / (wa + wb), (wa + wb) ** -0.5
    return math.exp(mean), math.exp(mean - Z * se), math.exp(mean + Z * se)


def earlier_look(trials: list[Any], record: Any) -> Any | None:
    """The latest earlier trial of the same changes whose first launch came short
    (`TrialRecord.first_look`), or None. On whatever base: the later look must be improved on its
    own too, so pooling in a launch on another base can only make it harder to keep."""

    def key(t: Any) -> tuple[Any, ...]:
        return t.kind, sorted(c.describe() for c in t.changes)

    same = [t for t in trials if t.number < record.number and t.first_look and key(t) == key(record)]
    return same[-1] if same else None


def _intervals(comparison: dict[str, Any] | None) -> dict[Any, dict[str, Any]]:
    """A recorded comparison's judged intervals by level (None: the objective)."""
    c = comparison or {}
    judged = c.get("per_level") if c.get("rule") == "pareto" else [c.get("overall")]
    return {i.get("concurrency"): i for i in judged or [] if i}


def with_first_look(r: RunnerState, record: TrialRecord, final: Any) -> str | None:
    """Why `final`'s improvement does not hold once the change's earlier short first launch is
    pooled in (None: it holds at some judged level, or there is no such launch): at each judged
    level measured both times, the two intervals pooled must lie above no change with an estimate
    of at least the minimum effect."""
    earlier = earlier_look(r.trials, record)
    if earlier is None:
        return None
    first = _intervals(earlier.comparison)
    both = {
        i.concurrency: p
        for i in judged(final)
        if i.concurrency in first and (p := pooled(first[i.concurrency], i)) is not None
    }
    if not both:
        return f"improved on this look, but no level to judge together with trial {earlier.number}'s first launch"
    holds = {lv: x for lv, x in both.items() if x[1] > 1 and x[0] >= 1 + r.bench.min_effect}
    level, x = max((holds or both).items(), key=lambda kv: kv[1][0])
    told = f"{'the objective' if level is None else f'c={level}'} {_pct(x)} over both looks"
    if holds:
        record.notes.append(f"judged with trial {earlier.number}'s first launch: {told}")
        return None
    return f"improved on this look, but not with trial {earlier.number}'s first launch: best {told}"


def _pct(x: tuple[float, float, float]) -> str:
    ratio, low, high = x
    return Interval(concurrency=None, ratio=ratio, ci_low=low, ci_high=high).pct()
