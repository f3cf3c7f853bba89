"""Paired (A/B/A) comparison of a candidate with the known-good configuration measured next to it.

The known-good configuration A is measured right before the candidate B (A is still running, so it
costs no restart) and again right after B is rolled back (the rollback restarts A anyway). The
candidate is compared with the midpoint of the two A blocks, so a linear drift of the machine
(load from other processes, thermal state) cancels; what the two A blocks disagree on beyond their
own noise and the restart spread is added to the variance, so a step in the load widens the
interval instead of making a no-op look like a gain. Restart-to-restart spread that repetitions
inside one launch cannot see (`launch_noise`, pooled with the spread of this run's known-good
launches) is added for every launch involved; a second launch of the candidate (`confirm`) halves
the candidate's share of it, and a third launch of each side (`third`, for a near miss) cuts the
total to a third of one launch's.

Decision for "improve throughput" without a named level: the explicit **Pareto rule** —
better at some measured level by at least `min_effect` (significantly), worse at none beyond
`regress_tolerance` (point estimate); candidates that pass are ranked by the goal's objective. A
level below the tolerance rejects the candidate outright ("regressed") only when it is significantly
worse over the family of levels (alpha / number of levels); otherwise it blocks the keep while more
numbers are gathered.
For a named level or a latency goal the objective itself must improve by `min_effect`.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel

from tools.bench.blockfit import Block, fit_blocks
from tools.bench.launches import launch_spread, ok_levels, pooled_spread, rep_values, seeded_values
from tools.bench.objective import Objective
from tools.bench.results import SweepResult

Verdict = Literal["improved", "regressed", "no_change", "inconclusive"]
METHOD = (
    "paired A/B/A: candidate launch(es) vs the mean of the known-good launches measured before and "
    "after it, each seed's prompts' own speed taken out; t interval on log(metric) "
    "(Welch-Satterthwaite df), widened by the restart spread "
    "(declared, pooled with this run's known-good launches) and by A-A drift beyond it"
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
    launches_candidate: int = 1
    """Launches of the candidate the blocks come from (2 when a winner was measured again, 3 for a
    near miss)."""
    within_share: float = 0.0
    """Share of the variance that more repetitions in the same launch can still reduce."""
    launch_spread: float = 0.0
    """Restart-to-restart spread (relative sd) the interval assumed for each launch."""

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
    significantly_worse: list[int | None] = []
    """Levels significantly worse than known-good over the family of levels (alpha / levels), even
    within the tolerance."""
    clear_no: bool = False
    """No level can plausibly reach `min_effect` (its interval stops below it, or its estimate is below
    half of it), or one regressed significantly: more repetitions are not worth it."""


def interval(
    known_good: list[Block], cand: list[Block], *, launch_noise: float, alpha: float,
    spread: tuple[float, int] = (0.0, 0), concurrency: int | None = None,
    prior_df: float | None = None,
) -> Interval:  # fmt: skip
    """The candidate's launches vs the known-good launches around them, on log values oriented so
    that > 0 is better. Each argument holds one block per launch, in time order, of (seed, value)
    repetitions: blocks measured on the same prompts are compared with their effect taken out
    (`tools.bench.blockfit`). Known-good's launches before these are not averaged in: under a slow
    drift (the server +0.1% faster a block) their mean lags this trial's, and a no-op was kept 10.5%
    of the time instead of 2.6% (`bench_rule_power.py --measured --earlier 2 --history 7 --gap 4
    --drift 0.001`); their spread counts (`launch_spread`), their level does not.

    Variance: the repetition noise of every block mean, the launch-to-launch spread of each launch
    (the candidate's mean launch and the known-good mean launch), and what the first and last
    known-good blocks disagree on beyond their own noise and the restart spread. The t quantile
    takes Welch-Satterthwaite degrees of freedom: the restart spread counts with those of
    `launch_spread` and the drift bound is taken as given, so a handful of repetitions does not
    inflate the quantile of a variance they hardly contribute to. One piece because it is one
    variance formula, its terms summed and weighed for one t interval; half its length is this text."""
    from scipy import stats as sps

    a, b = [g for g in known_good if g], [g for g in cand if g]
    out = Interval(
        concurrency=concurrency, n_before=len(a[0]) if a else 0, n_after=sum(map(len, a[1:])),
        n_candidate=sum(map(len, b)), launches_candidate=len(b),
    )  # fmt: skip
    if not a or not b:
        return out
    per_launch, launch_df = launch_spread(math.log1p(launch_noise), spread, prior_df)
    fit = fit_blocks(a + b)
    diff, within = fit.contrast([-1 / len(a)] * len(a) + [1 / len(b)] * len(b))
    out.ratio = math.exp(diff)
    drift = (0.0, 0.0)
    if len(a) > 1:
        drift = fit.contrast([-1.0] + [0.0] * (len(a) - 2) + [1.0] + [0.0] * len(b))
        out.drift = drift[0]
    df = fit.df
    if df < 1:
        return out
    out.launch_spread = math.expm1(per_launch)
    # what the two A blocks disagree on beyond their own noise and beyond the restart spread (they
    # are two launches; the launch term below counts that part) is drift that need not be linear:
    # half of it may sit anywhere between them
    extra = 0.0
    if len(a) > 1:
        extra = max(0.0, out.drift**2 - drift[1] - 2 * per_launch**2) / 4
    launch = (1 / len(a) + 1 / len(b)) * per_launch**2
    var = within + launch + extra
    se = math.sqrt(var)
    if se <= 1e-12:
        out.ci_low = out.ci_high = out.ratio
        out.p_value = 1.0 if abs(diff) < 1e-12 else 0.0
        return out
    out.within_share = within / var
    # the drift term is a bound taken as given, like the declared spread
    noise = within**2 / df + launch**2 / launch_df
    dof = var**2 / noise if noise > 0 else math.inf
    half = float(sps.t.ppf(1 - alpha / 2, dof)) * se
    out.ci_low, out.ci_high = math.exp(diff - half), math.exp(diff + half)
    out.p_value = float(2 * sps.t.sf(abs(diff) / se, dof))
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
    confirm: list[SweepResult] | None = None,
    third: tuple[list[SweepResult], list[SweepResult]] | None = None,
    prior_df: float | None = None,
    groups: list[list[list[SweepResult]]] | None = None,
) -> PairedComparison:
    """The A/B/A verdict of `cand` against the known-good blocks `before` and `after` (may be empty:
    a provisional A/B look used to stop early or to add repetitions). `history`: every block of the
    same known-good configuration measured in this run, one per launch; the spread of their means is
    the launch-to-launch noise actually seen (pooled with `launch_noise`, see `launch_spread`).
    `groups`: more such launches, each group one configuration's (`pooled_spread`: every
    configuration the run launched more than once tells how far a restart moves a server).
    `confirm`: a block on a second launch of the candidate (after `after`): both candidate launches
    are judged. `third`: (known-good, candidate) blocks of one more launch of each, in that order
    after `confirm`: three launches of each side are judged.

    One piece because it is one verdict rule read top to bottom: the intervals, the sets the rule
    reads (worse, significantly below, wins, can still reach), then the ladder regressed / improved /
    no_change / inconclusive, all on the same thresholds.
    """
    after = after or []
    more_good, more_cand = third or ([], [])
    levels = sorted(ok_levels(before))
    wanted = objective.levels or (levels[:1] if objective.lowest_level else levels)
    pareto = objective.kind == "throughput" and not objective.levels and not objective.lowest_level
    kw = dict(launch_noise=launch_noise, alpha=alpha, prior_df=prior_df)

    def judged(at: list[int], concurrency: int | None = None) -> Interval:
        def v(blocks: list[list[SweepResult]]) -> list[Block]:
            return [seeded_values(x, objective, at) for x in blocks]

        return interval(
            v([before, after, more_good]), v([cand, confirm or [], more_cand]),
            spread=pooled_spread([*(groups or []), *([history] if history else [])], objective, at),
            concurrency=concurrency, **kw,
        )  # fmt: skip

    overall = judged(wanted)
    per_level = [judged([c], c) for c in levels]
    rule: Literal["pareto", "objective"] = "pareto" if pareto else "objective"
    up, floor = 1 + min_effect, 1 - regress_tolerance
    base = dict(rule=rule, ratio=overall.ratio, overall=overall, per_level=per_level)
    every_cand = cand + (confirm or []) + more_cand
    bad_cand = any(s.partial for s in every_cand) or any(
        len(rep_values(every_cand, objective, [c])) < len(every_cand) for c in levels
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
    # "worse at some level" is asked of every level at once: significance at alpha / levels (Bonferroni),
    # else one noisy level of three (c=1 with few requests) rejects a real gain once in ~15 trials
    family = alpha / max(1, len(per_level))
    below = [i for i in per_level if i.ratio is not None and i.ratio < 1 and (i.p_value or 1) < family]
    sig_worse = [i for i in below if i.ratio < floor]
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
    good = before + after + more_good
    if objective.slo is not None and (broken := objective.slo.broken_by(every_cand, known_good=good)):
        # the goal's limit ("keeping p99 TTFT under 500 ms") is no trade-off: a change that breaks it
        # is not kept, whatever it gains
        return PairedComparison(
            verdict="regressed", summary=f"regressed: {broken}; {text}", clear_no=True, **base
        )
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
        significantly_worse=[i.concurrency for i in below],
        clear_no=not reach or bool(sig_worse), **base,
    )  # fmt: skip


def _where(i: Interval) -> str:
    return "the objective" if i.concurrency is None else f"c={i.concurrency}"


def _describe(overall: Interval, per_level: list[Interval], rule: str, objective: Objective) -> str:
    levels = ", ".join(f"c={i.concurrency} {i.pct()}" for i in per_level)
    n = f"{overall.n_before}+{overall.n_after} known-good vs {overall.n_candidate} candidate repetitions"
    if overall.launches_candidate > 1:
        n += f" on {overall.launches_candidate} launches"
    drift = f", A-A drift {overall.drift * 100:+.1f}%" if overall.n_after else ""
    # a latency's ratio is known-good / candidate: + is a lower latency
    gain = "" if objective.higher_is_better else "as a gain (+ = lower) "
    return f"{objective.description} {gain}{overall.pct()} (95% CI); {levels}; {n}{drift}; rule: {rule}"
