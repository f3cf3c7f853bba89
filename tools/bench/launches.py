"""The blocks of one configuration: their values per repetition, how far its launches spread (beyond
what their repetitions explain), and two blocks of one launch settled into one. The paired
comparison (`tools.bench.paired`) widens its intervals by that spread."""

from __future__ import annotations

import math

import numpy as np

from tools.bench.blockfit import Block, fit_blocks
from tools.bench.objective import Objective
from tools.bench.results import SweepResult


def rep_values(reps: list[SweepResult], objective: Objective, levels: list[int]) -> list[float]:
    """Per repetition: the mean log metric over `levels`, oriented so that higher is better
    (a repetition missing any value is left out)."""
    return [v for _, v in seeded_values(reps, objective, levels)]


def seeded_values(reps: list[SweepResult], objective: Objective, levels: list[int]) -> Block:
    """(seed, value) per repetition, as `rep_values`: the seed names the prompts it was measured on."""
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
            out.append((s.seed, sum(logs) / len(logs)))
    return out


def block_spread(blocks: list[list[SweepResult]] | None, objective: Objective, levels: list[int]) -> float:
    """Standard deviation of the block means (log) of repeated blocks of one configuration, beyond
    what their repetitions explain; 0 with fewer than 3 blocks (too little to tell)."""
    return pooled_spread([blocks or []], objective, levels)[0]


def block_resolution(
    blocks: list[list[SweepResult]] | None, objective: Objective, levels: list[int]
) -> float:
    """The standard error (log) of one block's mean from its repetitions (beyond its prompts): a
    spread between launches smaller than this, repeated blocks cannot tell from none."""
    got = _group_noise(blocks or [], objective, levels)
    return math.sqrt(got[2] / got[1]) if got and got[1] else 0.0


def _group_noise(
    blocks: list[list[SweepResult]], objective: Objective, levels: list[int]
) -> tuple[float, int, float] | None:
    """(sum of squares of the block means around their mean, its degrees of freedom, what repetition
    noise alone puts into that sum) for the blocks of 2+ repetitions of one configuration, their
    prompts' effect taken out (`fit_blocks`); None below two such blocks."""
    kept = [p for b in blocks if len(p := seeded_values(b, objective, levels)) >= 2]
    if len(kept) < 2:
        return None
    fit = fit_blocks(kept)
    if fit.df < 1:
        return None
    centre = np.eye(len(kept)) - 1 / len(kept)
    means = centre @ fit.means
    return float(means @ means), len(kept) - 1, fit.var * float(np.trace(centre @ fit.cov @ centre))


def pooled_spread(
    groups: list[list[list[SweepResult]]], objective: Objective, levels: list[int]
) -> tuple[float, int]:
    """(restart spread as a log sd, its degrees of freedom) seen in `groups`, each the blocks of one
    configuration, one block per launch: the spread of each configuration's launch means around
    their own mean, beyond what their repetitions explain, pooled over the configurations (a
    restart moves any configuration alike; what differs between configurations is their own
    effect, which each group's mean takes out). (0, 0) below 2 degrees of freedom (too little to tell)."""
    ss, df, noise = 0.0, 0, 0.0
    for blocks in groups:
        if got := _group_noise(blocks, objective, levels):
            ss, df, noise = ss + got[0], df + got[1], noise + got[2]
    if df < 2:
        return 0.0, 0
    return math.sqrt(max(0.0, (ss - noise) / df)), df


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def settle(
    first: list[SweepResult], second: list[SweepResult], objective: Objective, *, alpha: float = 0.05
) -> tuple[list[SweepResult], list[SweepResult] | None, str]:
    """Two blocks of one launch of a configuration, measured at different times, as one: (the block
    to judge with, the block set aside or None, why). They agree unless some level's means differ
    significantly (t over the repetitions, their prompts' effect taken out, alpha over the levels);
    then the slower one is set aside. Within one launch nothing but a transient load (another process, a throttled GPU) makes a
    server slower for a while, and nothing makes it faster: a known-good block measured under load
    would pass a candidate's ordinary speed for a gain (`bench_rule_power.py --step`)."""
    from scipy import stats as sps

    # the levels where every repetition of both blocks has the goal's metrics
    levels = [
        c
        for c in sorted(ok_levels(first) & ok_levels(second))
        if all(len(rep_values(x, objective, [c])) == len(x) for x in (first, second))
    ]
    family = alpha / max(1, len(levels))
    for c in levels:
        a, b = seeded_values(first, objective, [c]), seeded_values(second, objective, [c])
        if len(a) < 2 or len(b) < 2:
            continue
        fit = fit_blocks([a, b])
        gap, var = fit.contrast([-1.0, 1.0])  # second minus first
        if not var > 0:  # no noise seen (or no degrees of freedom): nothing to test
            continue
        p = float(2 * sps.t.sf(abs(gap) / math.sqrt(var), fit.df))
        if p < family:
            slow, fast = (first, second) if gap > 0 else (second, first)
            gap = math.expm1(abs(gap))
            if _mean(rep_values(slow, objective, levels)) > _mean(rep_values(fast, objective, levels)):
                slow, fast = fast, slow  # the faster block over all levels is kept
            which = "earlier" if slow is first else "later"
            why = (
                f"two blocks of the same known-good launch disagree (c={c} {gap:.1%} apart, p={p:.3f}); "
                f"the {which}, slower one was set aside as measured under a transient load"
            )
            return fast, slow, why
    return first + second, None, ""


def ok_levels(reps: list[SweepResult]) -> set[int]:
    """The levels every repetition of `reps` measured whole."""
    sets = [{lv.max_concurrency for lv in s.levels if lv.ok} for s in reps]
    return set.intersection(*sets) if sets else set()


PRIOR_LAUNCHES = 6
"""How many launches' worth of evidence the declared restart spread (`launch_noise`) counts as when
it is pooled with the spread that this run's own known-good launches show."""


def launch_spread(
    declared: float, seen: tuple[float, int], prior_df: float | None = None
) -> tuple[float, float]:
    """(restart spread per launch as a log sd, its degrees of freedom): the declared value pooled
    with the spread seen between this run's known-good launches (`seen` = (sd, df)), weighted by
    degrees of freedom (a moderated variance, as limma does for few replicates). Taking the larger
    of the two instead let one unlucky launch among five widen every later interval by half (its
    t quantile on 4 df): half the time the larger one is the chance high of the same spread. Load
    that really changes between launches still takes over as its blocks accumulate. `prior_df`:
    the degrees of freedom of `declared` (a spread measured on this deployment counts with its own,
    see `agent.trial.spread`); None: a declared figure, weighted as PRIOR_LAUNCHES and taken as
    exact while nothing was seen."""
    sd, df = seen
    if df < 1:
        return declared, math.inf if prior_df is None else prior_df
    prior_df = PRIOR_LAUNCHES if prior_df is None else prior_df
    pooled = (prior_df * declared**2 + df * sd**2) / (prior_df + df)
    return math.sqrt(pooled), prior_df + df
