"""Is a candidate really better than the baseline? Repeated sweeps, a test, an effect size.

Method: for each repetition the objective is one number (a geometric mean of level metrics).
Baseline and candidate repetitions are compared with a two-sample t-test on the logarithms, which
gives a 95% confidence interval for the ratio of the (geometric) means. The verdict needs
significance *and* an effect of at least `min_effect`; every level is also checked on its own
(Bonferroni-corrected) so that no level may regress beyond `regress_tolerance` unnoticed: a level
significantly below 1 - `regress_tolerance` makes the verdict regressed, and a level whose point
estimate is below it without significance makes the verdict at least inconclusive.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel

from tools.bench.objective import Objective, Slo, objective_from_goal
from tools.bench.results import SweepResult

__all__ = [
    "Comparison",
    "IncomparableResults",
    "LevelComparison",
    "Objective",
    "Slo",
    "compare",
    "objective_from_goal",
]

Verdict = Literal["improved", "regressed", "no_change", "inconclusive"]
METHOD = "two-sample t-test (pooled variance) on log(metric) across repetitions; 95% CI of the ratio of geometric means"
MAX_CI_HALF_WIDTH = 0.10
"""A non-significant result is called no_change only if the CI excludes effects beyond ±10%."""


MEASURED_SETTINGS = ("api", "input_len", "output_len", "prompt_file", "request_rate")
"""Benchmark settings that change what is measured: results differing in any are not comparable."""


class IncomparableResults(ValueError):
    """The two sides were measured with different benchmark settings."""


class LevelComparison(BaseModel):
    """One level (or the objective) compared: means, the ratio (>1 is better), CI, p, verdict."""

    concurrency: int | None
    metric: str
    baseline: float | None = None
    candidate: float | None = None
    ratio: float | None = None
    """candidate/baseline oriented so that > 1 is better (baseline/candidate for latencies)."""
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    n_baseline: int = 0
    n_candidate: int = 0
    verdict: Verdict = "inconclusive"
    note: str = ""
    """Why the verdict is what it is when the numbers alone do not say (e.g. a suspect level)."""


class Comparison(BaseModel):
    """The decision on a candidate, with the numbers and the test it rests on."""

    verdict: Verdict
    objective: Objective
    ratio: float | None = None
    overall: LevelComparison | None = None
    per_level: list[LevelComparison] = []
    method: str = METHOD
    min_effect: float
    regress_tolerance: float
    summary: str


def _t_test(
    b: list[float], c: list[float], higher: bool, alpha: float, launch_noise: float = 0.0
) -> tuple[float, float, float, float]:
    """(ratio, ci_low, ci_high, p) for candidate vs baseline on log values, >1 is better.

    `launch_noise` is the restart-to-restart spread (relative sd) of a server: repetitions within
    one launch cannot see it, yet baseline and candidate always run in different launches, so its
    variance is added for each side.

    Pooled-variance t (df = nb + nc - 2): baseline and candidate run on the same machine with the
    same client, so their run-to-run noise is alike, and with 3 repetitions a side Welch's
    df correction would cost most of the power.
    """
    from scipy import stats as sps

    lb, lc = [math.log(x) for x in b], [math.log(x) for x in c]
    mb, mc = sum(lb) / len(lb), sum(lc) / len(lc)
    df = len(lb) + len(lc) - 2
    pooled = (sum((x - mb) ** 2 for x in lb) + sum((x - mc) ** 2 for x in lc)) / df
    diff = (mc - mb) if higher else (mb - mc)
    se = math.sqrt(pooled * (1 / len(lb) + 1 / len(lc)) + 2 * math.log1p(launch_noise) ** 2)
    if se <= 1e-12:  # identical repetitions (a deterministic server): the difference is exact
        return math.exp(diff), math.exp(diff), math.exp(diff), (1.0 if abs(diff) < 1e-12 else 0.0)
    half = float(sps.t.ppf(1 - alpha / 2, df)) * se
    p = float(2 * sps.t.sf(abs(diff) / se, df))
    return math.exp(diff), math.exp(diff - half), math.exp(diff + half), p


def _decide(ratio: float, lo: float, hi: float, p: float, alpha: float, up: float, down: float) -> Verdict:
    if p < alpha and ratio >= 1 + up:
        return "improved"
    if p < alpha and ratio <= 1 - down:
        return "regressed"
    if p < alpha:
        return "no_change"  # real but smaller than the minimum effect
    if hi <= 1 + MAX_CI_HALF_WIDTH and lo >= 1 - MAX_CI_HALF_WIDTH:
        return "no_change"
    return "inconclusive"


def _score(sweep: SweepResult, objective: Objective, levels: list[int]) -> float | None:
    """The objective of one repetition: geometric mean of its metrics over `levels`."""
    logs = []
    for c in levels:
        lv = sweep.level(c)
        for m in objective.metrics:
            value = getattr(lv, m, None) if lv is not None and lv.ok else None
            if value is None or value <= 0:
                return None
            logs.append(math.log(value))
    return math.exp(sum(logs) / len(logs))


def _compare_scores(
    b: list[float], c: list[float], *, higher: bool, alpha: float, up: float, down: float,
    concurrency: int | None, metric: str, launch_noise: float,
) -> LevelComparison:  # fmt: skip
    out = LevelComparison(concurrency=concurrency, metric=metric, n_baseline=len(b), n_candidate=len(c))
    if b and c:
        out.baseline, out.candidate = sum(b) / len(b), sum(c) / len(c)
    if len(b) < 2 or len(c) < 2:
        if b and c:
            gm = math.exp(sum(map(math.log, c)) / len(c) - sum(map(math.log, b)) / len(b))
            out.ratio = gm if higher else 1 / gm
        return out  # too few repetitions for the test: inconclusive
    out.ratio, out.ci_low, out.ci_high, out.p_value = _t_test(b, c, higher, alpha, launch_noise)
    out.verdict = _decide(out.ratio, out.ci_low, out.ci_high, out.p_value, alpha, up, down)
    return out


def _common_levels(sweeps: list[SweepResult]) -> list[int]:
    sets = [{lv.max_concurrency for lv in s.levels} for s in sweeps]
    return sorted(set.intersection(*sets)) if sets else []


def compare(
    baseline_reps: list[SweepResult],
    candidate_reps: list[SweepResult],
    objective: Objective | None = None,
    *,
    min_effect: float = 0.02,
    regress_tolerance: float = 0.03,
    alpha: float = 0.05,
    launch_noise: float = 0.0,
) -> Comparison:
    """Decide improved / regressed / no_change / inconclusive for `candidate_reps` vs
    `baseline_reps` on `objective` (default: throughput), with a guard on every level.

    A candidate with errors or missing levels is `regressed` (no data is never a pass); a broken
    baseline or fewer than 2 repetitions a side is `inconclusive`. `launch_noise` (relative sd
    between server restarts) widens every interval when the two sides ran in different launches
    (e.g. a trial vs its baseline). Raises `IncomparableResults`
    when the repetitions differ in a setting of `MEASURED_SETTINGS`.

    One piece because it is one decision read top to bottom: the guards in the order they decide
    (no data, errors, lost levels), the intervals, then the verdict ladder on the same thresholds.
    """
    _check_comparable(baseline_reps + candidate_reps)
    objective = objective or Objective()
    base = dict(objective=objective, min_effect=min_effect, regress_tolerance=regress_tolerance)

    def done(verdict: Verdict, summary: str, **kw: object) -> Comparison:
        return Comparison(verdict=verdict, summary=f"{verdict}: {summary}", **base, **kw)

    if not candidate_reps:
        return done("inconclusive", "no candidate measurements")
    if not baseline_reps:
        return done("inconclusive", "no baseline measurements")
    bad = partial_errors(candidate_reps)
    if bad:
        return done("regressed", f"the candidate's benchmark had errors: {'; '.join(bad[:3])}")
    if any(s.partial for s in baseline_reps):
        return done("inconclusive", "the baseline's benchmark had errors; measure it again")
    levels = _common_levels(baseline_reps)
    if lost := _missing_in_candidate(baseline_reps, candidate_reps, objective, levels):
        return done("regressed", f"the candidate has no data at {lost} (measured in the baseline)")
    wanted = objective.levels or (levels[:1] if objective.lowest_level else levels)
    if not levels or any(c not in levels for c in wanted):
        return done("inconclusive", f"levels {wanted} not measured on both sides (have {levels})")
    higher = objective.higher_is_better
    kw = dict(
        higher=higher, alpha=alpha, up=min_effect, down=min_effect,
        metric="+".join(objective.metrics), launch_noise=launch_noise,
    )  # fmt: skip
    b = [x for s in baseline_reps if (x := _score(s, objective, wanted)) is not None]
    c = [x for s in candidate_reps if (x := _score(s, objective, wanted)) is not None]
    overall = _compare_scores(b, c, concurrency=wanted[0] if len(wanted) == 1 else None, **kw)
    guard = dict(kw, alpha=alpha / len(levels), down=regress_tolerance)
    per_level = [
        _compare_scores(
            [x for s in baseline_reps if (x := _score(s, objective, [lvl])) is not None],
            [x for s in candidate_reps if (x := _score(s, objective, [lvl])) is not None],
            concurrency=lvl,
            **guard,
        )  # fmt: skip
        for lvl in levels
    ]
    extra = dict(ratio=overall.ratio, overall=overall, per_level=per_level)
    numbers = _describe(overall, objective, len(b), len(c), launch_noise)
    if len(b) < 2 or len(c) < 2:
        return done("inconclusive", f"needs >= 2 repetitions a side; {numbers}", **extra)
    if objective.slo and (broken := objective.slo.broken_by(candidate_reps, known_good=baseline_reps)):
        return done("regressed", f"SLO violated ({broken}); {numbers}", **extra)
    worse = [lc for lc in per_level if lc.verdict == "regressed"]
    if worse:
        lc = worse[0]
        return done(
            "regressed",
            f"concurrency {lc.concurrency} regressed {(1 - lc.ratio) * 100:.1f}% "
            f"(beyond the {regress_tolerance:.0%} tolerance, p={lc.p_value:.3g}); {numbers}",
            **extra,
        )
    suspect = [lc for lc in per_level if _suspect(lc, regress_tolerance)]
    for lc in suspect:
        lc.verdict = "inconclusive"
        lc.note = (
            f"{(1 - lc.ratio) * 100:.1f}% lower, beyond the {regress_tolerance:.0%} tolerance but not "
            f"significant (p={lc.p_value:.3g}): a possible regression, measure again"
        )
    if suspect and overall.verdict != "regressed":
        lc = suspect[0]
        return done("inconclusive", f"concurrency {lc.concurrency}: {lc.note}; {numbers}", **extra)
    return done(overall.verdict, numbers, **extra)


def _suspect(lc: LevelComparison, tolerance: float) -> bool:
    """A level whose point estimate is worse than the tolerance (significant ones are regressed)."""
    return lc.ratio is not None and lc.p_value is not None and lc.ratio < 1 - tolerance


def _measured(sweep: SweepResult) -> dict[str, object]:
    """What the sweep measured: its API, plus the other settings when they were recorded."""
    if not sweep.settings:
        return {"api": sweep.api}
    return {k: sweep.api if k == "api" else sweep.settings.get(k) for k in MEASURED_SETTINGS}


def _check_comparable(sweeps: list[SweepResult]) -> None:
    """Raise `IncomparableResults` if two sweeps recorded different `MEASURED_SETTINGS`."""
    seen: dict[str, tuple[object, SweepResult]] = {}
    diff = []
    for s in sweeps:
        for k, v in _measured(s).items():
            ref = seen.setdefault(k, (v, s))
            if ref[0] != v and not any(d[0] == k for d in diff):
                diff.append((k, f"{k} {ref[0]!r} ({ref[1].endpoint}) vs {v!r} ({s.endpoint})"))
    if diff:
        raise IncomparableResults(
            f"the results were measured with different settings: {'; '.join(d[1] for d in diff)}; "
            "run both with the same benchmark settings"
        )


def _missing_in_candidate(
    baseline_reps: list[SweepResult],
    candidate_reps: list[SweepResult],
    objective: Objective,
    levels: list[int],
) -> str:
    """The baseline levels with data that some candidate repetition lacks, described ('' if none)."""
    lost = [
        c
        for c in levels
        if any(_score(s, objective, [c]) is not None for s in baseline_reps)
        and any(_score(s, objective, [c]) is None for s in candidate_reps)
    ]
    return ", ".join(f"concurrency {c}" for c in lost)


def partial_errors(reps: list[SweepResult]) -> list[str]:
    """What failed in the partial repetitions of `reps`: each one's errors, else level by level."""
    return [e for s in reps if s.partial for e in (s.errors or _level_errors(s))]


def _level_errors(sweep: SweepResult) -> list[str]:
    return [f"c={lv.max_concurrency}: {e}" for lv in sweep.levels for e in lv.errors] or ["partial result"]


def _describe(lc: LevelComparison, objective: Objective, nb: int, nc: int, launch_noise: float) -> str:
    if lc.ratio is None or lc.baseline is None:
        return f"{objective.description}: no usable values ({nb} vs {nc} repetitions)"
    text = (
        f"{objective.description} {lc.baseline:.4g} -> {lc.candidate:.4g} (gain {(lc.ratio - 1) * 100:+.1f}%"
    )
    if lc.ci_low is not None:
        text += f", 95% CI {(lc.ci_low - 1) * 100:+.1f}%..{(lc.ci_high - 1) * 100:+.1f}%, p={lc.p_value:.3g}"
    noise = f", {launch_noise:.1%} restart noise" if launch_noise else ""
    return text + f"; t-test on logs, {nb} vs {nc} repetitions{noise})"
