"""Paired (A/B/A) comparison of a candidate with the known-good configuration measured next to it.

The known-good configuration A is measured right before the candidate B (A is still running, so it
costs no restart) and again right after B is rolled back (the rollback restarts A anyway). The
candidate is compared with the midpoint of the two A blocks, so a linear drift of the machine
(load from other processes, thermal state) cancels; what the two A blocks disagree on beyond their
own noise is added to the variance, so a step in the load widens the interval instead of making a
no-op look like a gain. Restart-to-restart spread (`launch_noise`) that repetitions inside one
launch cannot see is added for every launch involved.

Decision for "improve throughput" without a named level: the explicit **Pareto rule** —
better at some measured level by at least `min_effect` (significantly), worse at none beyond
`regress_tolerance` (point estimate); candidates that pass are ranked by the goal's objective.
For a named level or a latency goal the objective itself must improve by `min_effect`.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel

from tools.bench.objective import Objective
from tools.bench.results import SweepResult

Verdict = Literal["improved", "regressed", "no_change", "inconclusive"]
METHOD = (
    "paired A/B/A: candidate vs the midpoint of the known-good blocks measured before and after it; "
    "t interval on log(metric), widened by the A-A drift and the restart spread"
)


class Interval(BaseModel):
    """One metric (a level or the objective) compared: ratio (>1 better), 95% CI, p, repetitions."""

    concurrency: int | None
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    n_before: int = 0
    n_candidate: int = 0
    n_after: int = 0
    drift: float = 0.0
    """log ratio between the after and the before block of A (0 without an after block)."""

    def pct(self) -> str:
        """`+4.1% [+2.0..+6.2]`."""
        if self.ratio is None:
            return "n/a"
        text = f"{(self.ratio - 1) * 100:+.1f}%"
        if self.ci_low is not None and self.ci_high is not None:
            text += f" [{(self.ci_low - 1) * 100:+.1f}..{(self.ci_high - 1) * 100:+.1f}]"
        return text


class PairedComparison(BaseModel):
    """The A/B/A decision, with every interval it rests on."""

    verdict: Verdict
    rule: Literal["pareto", "objective"]
    ratio: float | None = None
    """The goal's objective ratio (used for ranking)."""
    overall: Interval
    per_level: list[Interval]
    method: str = METHOD
    summary: str
    promising: bool = False
    """Inconclusive but an improvement is still inside the interval: more repetitions may decide."""
    clear_no: bool = False
    """No level can plausibly reach `min_effect` (its interval stops below it, or its estimate is below
    half of it), or one regressed significantly: more repetitions are not worth it."""


def _values(reps: list[SweepResult], objective: Objective, levels: list[int]) -> list[float]:
    """Per repetition: the mean log metric over `levels`, oriented so that higher is better
    (a repetition missing any value is left out)."""
    sign = 1.0 if objective.higher_is_better else -1.0
    out = []
    for s in reps:
        logs: list[float] = []
        for c in levels:
            lv = s.level(c)
            got = [getattr(lv, m, None) if lv is not None and lv.ok else None for m in objective.metrics]
            if any(v is None or v <= 0 for v in got):
                logs = []
                break
            logs += [sign * math.log(v) for v in got]
        if logs:
            out.append(sum(logs) / len(logs))
    return out


def block_spread(blocks: list[list[SweepResult]] | None, objective: Objective, levels: list[int]) -> float:
    """Standard deviation of the block means (log) of repeated blocks of one configuration, beyond
    what their repetitions explain; 0 with fewer than 3 blocks (too little to tell)."""
    means, within = [], []
    for b in blocks or []:
        v = _values(b, objective, levels)
        if len(v) >= 2:
            means.append(sum(v) / len(v))
            within.append(_ss(v) / (len(v) - 1) / len(v))
    if len(means) < 3:
        return 0.0
    spread = _ss(means) / (len(means) - 1) - sum(within) / len(within)
    return math.sqrt(max(0.0, spread))


def _ss(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs)


def interval(
    before: list[float], cand: list[float], after: list[float], *, launch_noise: float, alpha: float,
    block_sd: float = 0.0,
    concurrency: int | None = None,
) -> Interval:  # fmt: skip
    """Candidate vs the A midpoint on log values (oriented so > 0 is better)."""
    from scipy import stats as sps

    out = Interval(concurrency=concurrency, n_before=len(before), n_candidate=len(cand), n_after=len(after))
    if not before or not cand:
        return out
    mb, mc = sum(before) / len(before), sum(cand) / len(cand)
    groups = [g for g in (before, cand, after) if g]
    if after:
        ma = sum(after) / len(after)
        ref, out.drift = (mb + ma) / 2, ma - mb
        ref_var_n = (1 / len(before) + 1 / len(after)) / 4
        launches = 1 + 0.5  # B's launch, and the mean of A's two launches
    else:
        ref, ref_var_n, launches = mb, 1 / len(before), 2.0
    diff = mc - ref
    df = sum(len(g) for g in groups) - len(groups)
    out.ratio = math.exp(diff)
    if df < 1:
        return out
    pooled = sum(_ss(g) for g in groups) / df
    # what the two A blocks disagree on beyond their own noise is drift that need not be linear:
    # half of it may sit anywhere between them
    extra = 0.0
    if after:
        extra = max(0.0, out.drift**2 - pooled * (1 / len(before) + 1 / len(after))) / 4
    # launch-to-launch spread: the declared restart noise, or what the repeated known-good blocks of
    # this run showed (load that changes between blocks but not within one), whichever is larger
    per_launch = max(math.log1p(launch_noise), block_sd) ** 2
    var = pooled * (1 / len(cand) + ref_var_n) + launches * per_launch + extra
    se = math.sqrt(var)
    if se <= 1e-12:
        out.ci_low = out.ci_high = out.ratio
        out.p_value = 1.0 if abs(diff) < 1e-12 else 0.0
        return out
    half = float(sps.t.ppf(1 - alpha / 2, df)) * se
    out.ci_low, out.ci_high = math.exp(diff - half), math.exp(diff + half)
    out.p_value = float(2 * sps.t.sf(abs(diff) / se, df))
    return out


def paired_compare(
    before: list[SweepResult],
    cand: list[SweepResult],
    after: list[SweepResult] | None,
    objective: Objective,
    *,
    min_effect: float = 0.02,
    regress_tolerance: float = 0.03,
    launch_noise: float = 0.01,
    alpha: float = 0.05,
    history: list[list[SweepResult]] | None = None,
) -> PairedComparison:
    """The A/B/A verdict of `cand` against the known-good blocks `before` and `after` (may be empty:
    a provisional A/B look used to stop early or to add repetitions). `history`: every block of the
    same known-good configuration measured in this run; the spread of their means is the
    launch-to-launch noise actually seen (used when larger than `launch_noise`)."""
    after = after or []
    levels = sorted(
        set.intersection(*({lv.max_concurrency for lv in s.levels if lv.ok} for s in before))
        if before
        else set()
    )
    wanted = objective.levels or (levels[:1] if objective.lowest_level else levels)
    pareto = objective.kind == "throughput" and not objective.levels and not objective.lowest_level
    kw = dict(launch_noise=launch_noise, alpha=alpha)
    overall = interval(
        _values(before, objective, wanted), _values(cand, objective, wanted),
        _values(after, objective, wanted), block_sd=block_spread(history, objective, wanted), **kw,
    )  # fmt: skip
    per_level = [
        interval(
            _values(before, objective, [c]),
            _values(cand, objective, [c]),
            _values(after, objective, [c]),
            concurrency=c,
            block_sd=block_spread(history, objective, [c]),
            **kw,
        )  # fmt: skip
        for c in levels
    ]
    rule: Literal["pareto", "objective"] = "pareto" if pareto else "objective"
    up, floor = 1 + min_effect, 1 - regress_tolerance
    base = dict(rule=rule, ratio=overall.ratio, overall=overall, per_level=per_level)
    bad_cand = any(s.partial for s in cand) or any(
        len(_values(cand, objective, [c])) < len(cand) for c in levels
    )
    if bad_cand:
        return PairedComparison(
            verdict="regressed", summary="regressed: the candidate had errors or lost a level", **base
        )
    if overall.p_value is None:
        return PairedComparison(
            verdict="inconclusive", summary="inconclusive: too few repetitions", promising=True, **base
        )
    worse = [i for i in per_level if i.ratio is not None and i.ratio < floor]
    sig_worse = [i for i in worse if i.ci_high is not None and i.ci_high < 1]
    judged = per_level if pareto else [overall]
    wins = [i for i in judged if i.ratio >= up and i.ci_low is not None and i.ci_low > 1]
    # futility: an interval must still reach +min_effect, and where it is narrow enough to mean
    # something (upper end below 4x the minimum effect) its estimate must be at least half of it
    reach = [
        i
        for i in judged
        if i.ci_high is not None
        and i.ci_high >= up
        and (i.ratio >= 1 + min_effect / 2 or i.ci_high >= 1 + 4 * min_effect)
    ]
    text = _describe(overall, per_level, rule, objective)
    if sig_worse:
        i = sig_worse[0]
        verdict: Verdict = "regressed"
        why = f"c={i.concurrency} {i.pct()} is beyond the {regress_tolerance:.0%} tolerance"
    elif wins and not worse:
        verdict, why = (
            "improved",
            "better by >= {:.0%} at {}; no level worse than -{:.0%}".format(
                min_effect, ", ".join(_where(i) for i in wins), regress_tolerance
            ),
        )
    elif not reach:
        verdict, why = "no_change", f"no level can still reach +{min_effect:.0%} (futility)"
    else:
        verdict = "inconclusive"
        why = (
            f"c={worse[0].concurrency} {worse[0].pct()} is below the -{regress_tolerance:.0%} tolerance"
            if worse
            else f"a gain of +{min_effect:.0%} is possible but not established"
        )
    # a level below the tolerance without significance is noise until more repetitions say otherwise
    promising = verdict == "inconclusive" and bool(reach)
    return PairedComparison(
        verdict=verdict, summary=f"{verdict}: {why}; {text}", promising=promising,
        clear_no=not reach or bool(sig_worse), **base,
    )  # fmt: skip


def _where(i: Interval) -> str:
    return "the objective" if i.concurrency is None else f"c={i.concurrency}"


def _describe(overall: Interval, per_level: list[Interval], rule: str, objective: Objective) -> str:
    levels = ", ".join(f"c={i.concurrency} {i.pct()}" for i in per_level)
    n = f"{overall.n_before}+{overall.n_after} known-good vs {overall.n_candidate} candidate repetitions"
    drift = f", A-A drift {overall.drift * 100:+.1f}%" if overall.n_after else ""
    return f"{objective.description} {overall.pct()} (95% CI); {levels}; {n}{drift}; rule: {rule}"
