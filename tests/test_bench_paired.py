"""The A/B/A comparison and the Pareto rule (tools/bench/paired.py), on synthetic repetitions with
seeded log-normal noise: drift between blocks, gains at one level, regressions, sequential hints."""

from __future__ import annotations

import math
import random

from tools.bench.objective import objective_from_goal
from tools.bench.paired import paired_compare
from tools.bench.results import LevelResult, SweepResult
from tools.config import BenchConfig

LEVELS = {1: 120.0, 8: 400.0, 64: 1200.0}
THROUGHPUT = objective_from_goal("improve throughput")


def sweep(
    rng: random.Random, *, shift: float = 1.0, noise: float = 0.01, at: dict | None = None
) -> SweepResult:
    levels = []
    for c, tput in LEVELS.items():
        f = shift * (at or {}).get(c, 1.0) * 2.718281828 ** rng.gauss(0, noise)
        levels.append(LevelResult(max_concurrency=c, num_prompts=8, completed=8, output_throughput=tput * f))
    return SweepResult(endpoint="http://x", api="completions", levels=levels)


def block(rng, n=3, **kw):
    return [sweep(rng, **kw) for _ in range(n)]


def test_drift_that_makes_a_no_op_look_better_is_caught_by_the_after_block():
    rng = random.Random(1)
    before = block(rng, shift=0.85)  # the machine was loaded while known-good was measured
    cand, after = block(rng), block(rng)  # load gone: the candidate changes nothing
    ab = paired_compare(before, cand, None, THROUGHPUT, launch_noise=0.01)
    aba = paired_compare(before, cand, after, THROUGHPUT, launch_noise=0.01)
    assert ab.verdict == "improved"  # what an unpaired look would keep
    assert aba.verdict != "improved" and abs(aba.overall.drift) > 0.1


def test_linear_drift_cancels_and_a_real_gain_is_kept():
    rng = random.Random(2)
    # a 4% linear drift across the trial: the midpoint of the A blocks sits where B was measured
    before, cand, after = block(rng, shift=0.98), block(rng, shift=1.06), block(rng, shift=1.02)
    aba = paired_compare(before, cand, after, THROUGHPUT, launch_noise=0.005)
    assert aba.verdict == "improved" and 1.03 < aba.ratio < 1.09


def test_pareto_keeps_a_gain_at_one_level_that_the_geometric_mean_dilutes():
    rng = random.Random(3)
    before, after = block(rng, n=4), block(rng, n=4)
    cand = block(rng, n=4, at={64: 1.06})
    pareto = paired_compare(before, cand, after, THROUGHPUT, launch_noise=0.005)
    assert pareto.rule == "pareto" and pareto.verdict == "improved"
    assert any(i.concurrency == 64 and i.ci_low > 1 for i in pareto.per_level)
    at_one = paired_compare(
        before, cand, after, objective_from_goal("maximize output throughput at concurrency 1")
    )
    assert at_one.rule == "objective" and at_one.verdict != "improved"


def test_pareto_refuses_a_gain_paid_for_by_another_level():
    rng = random.Random(4)
    before, after = block(rng, n=4), block(rng, n=4)
    cand = block(rng, n=4, at={64: 1.10, 1: 0.94})
    cmp = paired_compare(before, cand, after, THROUGHPUT, launch_noise=0.005)
    assert cmp.verdict in ("regressed", "inconclusive")
    assert cmp.verdict != "improved"


def test_sequential_hints_stop_on_no_change_and_continue_when_promising():
    rng = random.Random(5)
    same = paired_compare(block(rng), block(rng), None, THROUGHPUT, launch_noise=0.0)
    assert same.clear_no and not same.promising
    noisy = random.Random(6)
    before = block(noisy, n=2, noise=0.04)
    maybe = paired_compare(before, block(noisy, n=2, noise=0.04, shift=1.04), None, THROUGHPUT)
    assert maybe.verdict == "inconclusive" and maybe.promising and not maybe.clear_no


def test_a_candidate_with_errors_is_never_improved():
    rng = random.Random(7)
    cand = block(rng, shift=1.2)
    cand[0].partial = True
    cmp = paired_compare(block(rng), cand, block(rng), THROUGHPUT)
    assert cmp.verdict == "regressed"


def test_known_good_blocks_that_jump_between_launches_widen_the_interval():
    from tools.bench.launches import block_spread

    rng = random.Random(8)
    quiet = [block(rng) for _ in range(4)]
    jumpy = [block(rng, shift=s) for s in (0.92, 1.0, 1.08, 0.95)]
    assert block_spread(quiet, THROUGHPUT, [64]) < 0.01 < 0.03 < block_spread(jumpy, THROUGHPUT, [64])
    before, cand, after = block(rng), block(rng, shift=1.07), block(rng)
    calm = paired_compare(before, cand, after, THROUGHPUT, launch_noise=0.01, history=quiet)
    loaded = paired_compare(before, cand, after, THROUGHPUT, launch_noise=0.01, history=jumpy)
    assert calm.verdict == "improved" and loaded.verdict != "improved"


def test_one_unlucky_known_good_launch_does_not_take_over_the_restart_spread():
    from tools.bench.launches import block_spread

    rng = random.Random(13)
    # five known-good launches, one of them 2.8% low: the spread they show (1.3%, 4 df) is what a
    # 1% restart spread gives by chance about one run in five
    history = [block(rng, noise=0.002, shift=s) for s in (1.0, 1.0, 0.972, 1.0, 1.005)]
    seen = block_spread(history, THROUGHPUT, [64])
    before, after = block(rng, noise=0.002), block(rng, noise=0.002)
    cand, again = block(rng, noise=0.002, shift=1.03), block(rng, noise=0.002, shift=1.03)
    cmp = paired_compare(before, cand, after, THROUGHPUT, launch_noise=0.01, history=history, confirm=again)
    assert 0.01 < cmp.per_level[-1].launch_spread < seen  # pooled with the declared 1%, not the larger
    assert cmp.verdict == "improved"  # +3% on two launches; taking the larger spread left it open


def test_known_good_launches_apart_by_the_restart_spread_are_not_counted_again_as_drift():
    rng = random.Random(12)
    before, cand = block(rng, noise=0.002), block(rng, noise=0.002)

    def width(after_shift: float) -> float:
        after = block(rng, noise=0.002, shift=after_shift)
        c = paired_compare(before, cand, after, THROUGHPUT, launch_noise=0.01).overall
        return math.log(c.ci_high / c.ci_low)

    # 1.2% apart is what two launches with a 1% restart spread typically are: the launch term has it
    assert abs(width(1.012) / width(1.0) - 1) < 0.02
    assert width(1.06) > 1.5 * width(1.0)  # a 6% step is load, not launches: it widens the interval


def test_the_declared_restart_spread_is_not_inflated_by_few_repetitions():
    # quiet repetitions, 1% restart spread: the interval is the spread's own (z), not t with 4 df
    rng = random.Random(9)
    cmp = paired_compare(
        block(rng, noise=0.001), block(rng, noise=0.001), None, THROUGHPUT, launch_noise=0.01
    )
    half = cmp.overall.ci_high / cmp.overall.ratio - 1
    assert 1.9 * 0.01414 < half < 2.1 * 0.01414  # sqrt(2) launches x 1%, times ~1.96
    assert cmp.overall.within_share < 0.05  # more repetitions of these launches would not help


def test_a_second_launch_of_the_candidate_narrows_the_interval_and_counts():
    rng = random.Random(10)
    before, after = block(rng, noise=0.003), block(rng, noise=0.003)
    cand, again = block(rng, noise=0.003, shift=1.03), block(rng, noise=0.003, shift=1.03)
    aba = paired_compare(before, cand, after, THROUGHPUT, launch_noise=0.01)
    both = paired_compare(before, cand, after, THROUGHPUT, launch_noise=0.01, confirm=again)
    width = lambda c: c.overall.ci_high / c.overall.ci_low  # noqa: E731
    assert both.overall.launches_candidate == 2 and both.overall.n_candidate == 6
    assert width(both) - 1 < 0.85 * (width(aba) - 1)  # 1.5 -> 1 launch variances
    assert both.verdict == "improved" and "on 2 launches" in both.summary
    # a second launch that shows nothing pulls the estimate down: no keep
    flat = paired_compare(before, cand, after, THROUGHPUT, launch_noise=0.01, confirm=block(rng, noise=0.003))
    assert flat.verdict != "improved" and flat.overall.ratio < both.overall.ratio


def test_which_candidates_earn_a_second_launch_and_more_repetitions():
    from agent.trial.judge import looks_like_a_winner, worth_more

    rng = random.Random(11)
    before, after = block(rng, noise=0.003), block(rng, noise=0.003)
    # +2.5% everywhere, 1.5% restart spread: not established by one launch, but it looks like a win
    maybe = paired_compare(
        before, block(rng, noise=0.003, shift=1.025), after, THROUGHPUT, launch_noise=0.015
    )
    assert maybe.verdict == "inconclusive" and looks_like_a_winner(maybe, BenchConfig())
    # the restart spread dominates: repetitions of the same launch would not narrow the interval
    assert not worth_more(maybe, BenchConfig())
    flat = paired_compare(before, block(rng, noise=0.003, shift=1.005), after, THROUGHPUT, launch_noise=0.015)
    assert not looks_like_a_winner(flat, BenchConfig())
    # noisy repetitions, quiet restarts: one more repetition is what sharpens the answer
    noisy = random.Random(6)
    before = block(noisy, n=2, noise=0.04)
    maybe = paired_compare(
        before, block(noisy, n=2, noise=0.04, shift=1.04), None, THROUGHPUT, launch_noise=0.002
    )
    assert maybe.promising and worth_more(maybe, BenchConfig())


def test_a_noisy_level_below_the_tolerance_does_not_block_a_clear_gain_elsewhere():
    from agent.trial.judge import looks_like_a_winner, worth_more

    rng = random.Random(12)

    def noisy_c1(shift_64: float = 1.0, c1: float = 1.0) -> list[SweepResult]:
        out = []
        for _ in range(3):
            s = sweep(rng, noise=0.003, at={64: shift_64})
            s.levels[0].output_throughput *= c1 * 2.718281828 ** rng.gauss(0, 0.05)  # c=1: 5% per rep
            out.append(s)
        return out

    before, after = noisy_c1(), noisy_c1()
    cand = noisy_c1(shift_64=1.06, c1=0.95)  # c=64 +6%; c=1 drew low
    cmp = paired_compare(before, cand, after, THROUGHPUT, launch_noise=0.01)
    c1 = cmp.per_level[0]
    assert cmp.verdict == "inconclusive" and c1.ratio < 0.97 and c1.ci_high > 1  # blocks, not significant
    assert looks_like_a_winner(cmp, BenchConfig())  # worth a second launch
    assert worth_more(cmp, BenchConfig())  # and more repetitions: c=1's noise is repetition noise


def test_a_regression_is_called_only_when_significant_over_the_family_of_levels():
    """Three levels are three chances for noise: "regressed" (reject at once) needs p < alpha / 3;
    between alpha / 3 and alpha the level is below the tolerance and still blocks the keep."""
    rng = random.Random(12)
    before, after = block(rng, noise=0.002), block(rng, noise=0.002)
    found = []
    for c1 in (0.94, 0.95, 0.96, 0.965):
        cmp = paired_compare(
            before, block(rng, noise=0.002, at={1: c1, 64: 1.06}), after, THROUGHPUT, launch_noise=0.015
        )
        level1 = cmp.per_level[0]
        found.append((level1.p_value, cmp.verdict, cmp.significantly_worse))
    between = [f for f in found if 0.05 / 3 <= f[0] < 0.05]
    assert between, found  # some c=1 estimate is significant alone but not over the family
    for _p, verdict, worse in between:
        assert verdict == "inconclusive" and worse == []
    strong = [f for f in found if f[0] < 0.05 / 3]
    assert strong and all(v == "regressed" and w == [1] for _, v, w in strong)


def test_two_blocks_of_one_launch_settle_into_one_unless_a_load_slowed_one():
    from tools.bench.launches import settle

    rng = random.Random(11)
    first, second = block(rng, noise=0.004), block(rng, noise=0.004)
    used, aside, why = settle(first, second, THROUGHPUT)
    assert aside is None and why == "" and used == first + second  # they agree: one block of six
    loaded = block(rng, shift=0.97, noise=0.004)  # a transient load during the later block
    used, aside, why = settle(first, loaded, THROUGHPUT)
    assert used is first and aside is loaded and "later, slower one was set aside" in why
    used, aside, _ = settle(loaded, second, THROUGHPUT)  # the earlier block is the loaded one
    assert used is second and aside is loaded
    # a level without the goal's metric in one block is left out of the check, not a crash
    for rep in loaded:
        rep.levels[-1].output_throughput = None
    used, aside, why = settle(first, loaded, THROUGHPUT)
    assert used is first and aside is loaded and "c=64" not in why


def test_a_loaded_known_good_block_no_longer_passes_a_no_op_for_a_gain():
    from tools.bench.launches import settle

    rng = random.Random(12)
    kw = dict(launch_noise=0.01)
    # known-good's launch measured under load after the last trial, then again before the candidate;
    # the candidate and known-good's next launch run at the same speed as known-good (a no-op)
    loaded, again = block(rng, shift=0.96, noise=0.004), block(rng, noise=0.004)
    cand, after = block(rng, noise=0.004), block(rng, noise=0.004)
    assert paired_compare(loaded, cand, None, THROUGHPUT, **kw).verdict == "improved"
    before, aside, _ = settle(loaded, again, THROUGHPUT)
    assert aside is loaded
    assert paired_compare(before, cand, None, THROUGHPUT, **kw).verdict != "improved"
    assert paired_compare(before, cand, after, THROUGHPUT, **kw).verdict != "improved"


def _with_ttft(reps: list[SweepResult], ttft: dict[int, float]) -> list[SweepResult]:
    """`reps` with each level's p99 time to first token set to `ttft`'s."""
    return [
        r.model_copy(
            update={
                "levels": [lv.model_copy(update={"p99_ttft_ms": ttft[lv.max_concurrency]}) for lv in r.levels]
            }
        )  # fmt: skip
        for r in reps
    ]


def test_a_gain_that_breaks_the_goal_s_latency_limit_is_not_kept():
    goal = objective_from_goal("improve throughput keeping p99 TTFT under 500 ms")
    assert goal.slo is not None and goal.slo.max_ms == 500

    rng = random.Random(7)
    under = {1: 80.0, 8: 200.0, 64: 450.0}
    before, after = _with_ttft(block(rng), under), _with_ttft(block(rng), under)
    faster = block(rng, shift=1.10)  # +10% everywhere, a clear throughput win
    kept = paired_compare(before, _with_ttft(faster, under), after, goal, launch_noise=0.005)
    assert kept.verdict == "improved", kept.summary
    # the same gain, with c=64's p99 time to first token at 620 ms: not kept, whatever it gains
    broken = paired_compare(before, _with_ttft(faster, {**under, 64: 620.0}), after, goal, launch_noise=0.005)
    assert broken.verdict == "regressed" and broken.clear_no
    assert broken.summary.startswith(
        "regressed: p99_ttft_ms at concurrency 64 is 620.0 ms over 3 repetitions, above the limit of 500 ms"
    )


def test_a_level_where_known_good_breaks_the_limit_too_is_judged_by_the_objective_alone():
    goal = objective_from_goal("improve throughput keeping p99 TTFT under 500 ms")

    rng = random.Random(8)
    queued = {1: 80.0, 8: 200.0, 64: 900.0}  # c=64 queues: known-good is over the limit there
    before, after = _with_ttft(block(rng), queued), _with_ttft(block(rng), queued)
    faster = block(rng, shift=1.10)
    kept = paired_compare(before, _with_ttft(faster, {**queued, 64: 850.0}), after, goal, launch_noise=0.005)
    assert kept.verdict == "improved", kept.summary  # c=64 was not under the limit to begin with
    # where known-good keeps the limit, the candidate must too
    broken = paired_compare(before, _with_ttft(faster, {**queued, 8: 520.0}), after, goal, launch_noise=0.005)
    assert broken.verdict == "regressed" and "p99_ttft_ms at concurrency 8 is 520.0 ms" in broken.summary
