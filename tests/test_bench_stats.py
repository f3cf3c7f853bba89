"""The statistics decide correctly: calibrated on seeded synthetic repetitions with realistic noise."""

from __future__ import annotations

import random

import pytest

from tools.bench.results import LevelResult, SweepResult
from tools.bench.stats import IncomparableResults, Objective, compare, objective_from_goal

LEVELS = {1: 120.0, 8: 800.0, 64: 1600.0}


def sweep(rng: random.Random, *, shift: float = 1.0, noise: float = 0.02, level_shift=None) -> SweepResult:
    """One repetition: per-rep common noise (half) and per-level noise (the rest), log-normal."""
    common = rng.gauss(0, noise / 2)
    levels = []
    for c, tput in LEVELS.items():
        s = shift * (level_shift or {}).get(c, 1.0)
        f = s * 2.718281828 ** (common + rng.gauss(0, noise))
        levels.append(
            LevelResult(max_concurrency=c, num_prompts=8, completed=8, output_throughput=tput * f,
                        median_ttft_ms=50.0 / f, median_tpot_ms=8.0 / f, p99_ttft_ms=90.0 / f)
        )  # fmt: skip
    return SweepResult(endpoint="http://x", api="completions", levels=levels)


def reps(rng, n=3, **kw):
    return [sweep(rng, **kw) for _ in range(n)]


def verdicts(trials: int, seed: int, **kw) -> dict[str, int]:
    rng = random.Random(seed)
    counts = {"improved": 0, "regressed": 0, "no_change": 0, "inconclusive": 0}
    for _ in range(trials):
        counts[compare(reps(rng, noise=kw.get("noise", 0.02)), reps(rng, **kw)).verdict] += 1
    return counts


def test_aa_flags_regression_at_most_at_nominal_rate():
    for noise in (0.01, 0.03):
        counts = verdicts(600, seed=1, noise=noise)
        assert counts["regressed"] / 600 <= 0.05, counts
        assert counts["improved"] / 600 <= 0.05, counts


def test_ten_percent_shift_detected_with_default_reps():
    for noise in (0.01, 0.03):
        up = verdicts(200, seed=2, shift=1.10, noise=noise)
        down = verdicts(200, seed=3, shift=0.90, noise=noise)
        assert up["improved"] >= 190, up
        assert down["regressed"] >= 190, down


def test_one_percent_shift_is_no_change():
    counts = verdicts(300, seed=4, shift=1.01, noise=0.02)
    assert counts["no_change"] >= 270, counts
    assert counts["regressed"] <= 15


def test_level_guard_overrides_objective_improvement():
    rng = random.Random(5)
    cand = reps(rng, noise=0.01, shift=1.12, level_shift={64: 0.78})
    result = compare(reps(rng, noise=0.01), cand)
    assert result.verdict == "regressed"
    assert "concurrency 64" in result.summary
    assert [lc.verdict for lc in result.per_level if lc.concurrency == 64] == ["regressed"]


def level_sweep(values: dict[int, float]) -> SweepResult:
    """One repetition with exactly these output throughputs per level."""
    levels = [
        LevelResult(max_concurrency=c, num_prompts=8, completed=8, output_throughput=v)
        for c, v in values.items()
    ]
    return SweepResult(endpoint="http://x", api="completions", levels=levels)


def test_noisy_level_regression_beyond_tolerance_is_never_improved():
    # c=1 is +30% and c=8 is -9.1% (3x the tolerance, p~0.03: not significant at alpha/3).
    base = [level_sweep({1: 100 + d, 8: 800 + 27 * d, 64: 1600 + 10 * d}) for d in (0, 1, -1)]
    cand = [level_sweep({1: 130 + d, 8: 727 + 27 * d, 64: 1600 + 10 * d}) for d in (0, 1, -1)]
    result = compare(base, cand)
    assert result.overall.verdict == "improved"  # the objective alone would keep it
    c8 = next(lc for lc in result.per_level if lc.concurrency == 8)
    assert 0.9 < c8.ratio < 0.92 and 0.05 / 3 < c8.p_value < 0.05
    assert result.verdict == "inconclusive"
    assert c8.verdict == "inconclusive" and "tolerance" in c8.note and "9.1% lower" in c8.note
    assert "concurrency 8" in result.summary and "9.1% lower" in result.summary
    assert all(lc.note == "" for lc in result.per_level if lc.concurrency != 8)


def test_too_few_reps_is_inconclusive_never_improved():
    rng = random.Random(6)
    result = compare(reps(rng, n=1), reps(rng, n=1, shift=1.5))
    assert result.verdict == "inconclusive"
    assert result.ratio > 1.3
    assert "repetitions" in result.summary


def test_candidate_errors_are_never_a_pass():
    rng = random.Random(7)
    cand = reps(rng, shift=1.5)
    cand[1].partial = True
    cand[1].errors = ["server unreachable at concurrency 8: cannot connect"]
    result = compare(reps(rng), cand)
    assert result.verdict == "regressed"
    assert "cannot connect" in result.summary
    empty = [SweepResult(endpoint="http://x", api="completions", partial=True) for _ in range(3)]
    assert compare(reps(rng), empty).verdict == "regressed"
    assert compare(empty, reps(rng)).verdict == "inconclusive"
    assert compare(reps(rng), []).verdict == "inconclusive"


def test_baseline_levels_missing_in_candidate_are_never_a_pass():
    rng = random.Random(11)
    base = reps(rng, noise=0.01)
    cand = reps(rng, noise=0.01, shift=1.5)
    for s in cand:  # not flagged partial: e.g. a sweep run with fewer levels
        s.levels = [lv for lv in s.levels if lv.max_concurrency != 8]
    result = compare(base, cand)
    assert result.verdict == "regressed" and "concurrency 8" in result.summary
    # Present but without the objective's metric in one repetition: no data either.
    cand = reps(rng, noise=0.01, shift=1.5)
    cand[2].levels[-1].output_throughput = None
    result = compare(base, cand)
    assert result.verdict == "regressed" and "concurrency 64" in result.summary
    # Extra candidate levels are ignored; a level the baseline lacks cannot be compared.
    short = [s.model_copy(update={"levels": s.levels[:2]}) for s in base]
    assert [lc.concurrency for lc in compare(short, reps(rng)).per_level] == [1, 8]
    objective = objective_from_goal("p99 ttft at concurrency 64")
    assert compare(short, reps(rng), objective).verdict == "inconclusive"


def test_results_measured_with_different_settings_are_refused():
    rng = random.Random(12)
    settings = {"input_len": 512, "output_len": 256, "request_rate": None, "prompt_file": None}
    base, cand = reps(rng, noise=0.01), reps(rng, noise=0.01, shift=1.3)
    for s in base + cand:
        s.settings = dict(settings)
    assert compare(base, cand).verdict == "improved"
    for key, value in [
        ("output_len", 999),
        ("input_len", 16),
        ("request_rate", 4.0),
        ("prompt_file", "p.jsonl"),
    ]:
        changed = [s.model_copy(update={"settings": {**settings, key: value}}) for s in cand]
        with pytest.raises(IncomparableResults, match=f"{key} .* vs {value!r}"):
            compare(base, changed)
    with pytest.raises(ValueError, match="api 'completions'"):
        compare(base, [s.model_copy(update={"api": "chat"}) for s in cand])
    # Results without recorded settings (older files) are compared on their API only.
    assert compare(base, [s.model_copy(update={"settings": {}}) for s in cand]).verdict == "improved"


def test_latency_objective_prefers_lower_values_at_lowest_level():
    rng = random.Random(8)
    objective = objective_from_goal("lower the latency for interactive users")
    assert objective.kind == "latency" and not objective.higher_is_better
    result = compare(reps(rng, noise=0.01), reps(rng, noise=0.01, level_shift={1: 1.15}), objective)
    assert result.verdict == "improved"
    assert result.overall.concurrency == 1
    assert result.overall.candidate < result.overall.baseline


def test_named_metric_and_level_and_slo_from_goal():
    objective = objective_from_goal("reduce p99 TTFT at concurrency 8")
    assert (objective.metrics, objective.levels) == (["p99_ttft_ms"], [8])
    objective = objective_from_goal("maximize throughput while keeping p99 TTFT under 80 ms")
    assert objective.kind == "throughput"
    assert objective.slo.metric == "p99_ttft_ms" and objective.slo.max_ms == 80
    rng = random.Random(9)
    # 10% faster, p99 TTFT ~82 ms: over the limit, but known-good (~90 ms) was over it too: there the
    # limit was not being kept, and the objective alone decides
    result = compare(reps(rng, noise=0.01), reps(rng, noise=0.01, shift=1.10), objective)
    assert result.verdict == "improved", result.summary
    # where known-good keeps it (~90 ms under 92), a candidate at 95 ms fails it, however much faster
    kept_limit = objective_from_goal("maximize throughput while keeping p99 TTFT under 92 ms")
    slower_first_token = [
        s.model_copy(update={"levels": [lv.model_copy(update={"p99_ttft_ms": 95.0}) for lv in s.levels]})
        for s in reps(rng, noise=0.01, shift=1.10)
    ]
    result = compare(reps(rng, noise=0.01), slower_first_token, kept_limit)
    assert (
        result.verdict == "regressed"
        and "SLO violated (p99_ttft_ms at concurrency 1 is 95.0 ms" in result.summary
    )
    relaxed = objective_from_goal("maximize throughput, p99 ttft below 0.2 s")
    assert relaxed.slo.max_ms == 200
    assert compare(reps(rng, noise=0.01), reps(rng, noise=0.01, shift=1.10), relaxed).verdict == "improved"


def test_summary_names_numbers_and_method():
    rng = random.Random(10)
    result = compare(reps(rng, noise=0.01), reps(rng, noise=0.01, shift=1.10), Objective())
    assert result.verdict == "improved"
    assert "t-test" in result.method and "t-test on logs" in result.summary
    assert "95% CI" in result.summary and "3 vs 3 repetitions" in result.summary
    assert 1.05 < result.ratio < 1.15
    assert len(result.per_level) == 3


def test_restart_noise_keeps_aa_across_launches_at_the_nominal_rate():
    """Baseline and candidate run in different launches, each with its own speed factor.

    Repetitions within a launch cannot see that spread: ignoring it calls noise an effect far more
    often than 5%; declaring it (`launch_noise`) brings A/A back to the nominal rate while a real
    10% gain is still found.
    """
    rng = random.Random(7)

    def launch(sd: float, shift: float = 1.0) -> list[SweepResult]:
        return reps(rng, shift=shift * 2.718281828 ** rng.gauss(0, sd), noise=0.005)

    def calls(sd: float, declared: float, shift: float, n: int = 300) -> dict[str, int]:
        counts = {"improved": 0, "regressed": 0, "no_change": 0, "inconclusive": 0}
        for _ in range(n):
            cmp = compare(launch(sd), launch(sd, shift), min_effect=0.02, launch_noise=declared)
            counts[cmp.verdict] += 1
        return counts

    naive, declared = calls(0.02, 0.0, 1.0), calls(0.02, 0.02, 1.0)
    assert naive["improved"] + naive["regressed"] > 0.25 * 300, naive
    assert declared["improved"] <= 15 and declared["regressed"] <= 15, declared
    assert calls(0.01, 0.01, 1.10, n=100)["improved"] >= 90
