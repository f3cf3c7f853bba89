"""Common random numbers: every block sends the same prompts (repetition r on seed r) and the
comparison takes each seed's own speed out (`tools.bench.blockfit`). The simulator's speculative
decoding accepts draft tokens per prompt, as greedy decoding of one prompt does on every launch."""

from __future__ import annotations

import math
import random

import pytest

from sim.offline import plan_for, throughput_for_plan
from tools.bench.blockfit import fit_blocks
from tools.bench.launches import pooled_spread, settle
from tools.bench.objective import objective_from_goal
from tools.bench.paired import paired_compare
from tools.bench.results import LevelResult, SweepResult
from tools.bench.workload import level_prompts
from tools.config import BenchConfig

THROUGHPUT = objective_from_goal("improve throughput")


def test_speculative_acceptance_follows_the_prompt_not_the_launch():
    scn, model, plan = plan_for("seed")  # MTP speculation on
    assert plan.spec_steps
    settings = BenchConfig(concurrency=[1], output_len=128, prompts_per_level=8)

    def tput(prompt_seed: int, launch_seed: int) -> float:
        prompts = level_prompts(settings, 1, prompt_seed)
        return throughput_for_plan(scn, model, plan, concurrency=1, seed=launch_seed, prompts=prompts)

    same = [tput(0, launch) for launch in (1, 2, 3)]
    other = [tput(seed, 1) for seed in (1, 2, 3)]
    assert max(same) == pytest.approx(min(same), rel=1e-9)  # the same prompts: the same draws
    assert max(other) / min(other) - 1 > 0.01  # other prompts accept differently


def rep(seed: int, values: dict[int, float]) -> SweepResult:
    levels = [
        LevelResult(max_concurrency=c, num_prompts=8, completed=8, output_throughput=v)
        for c, v in values.items()
    ]
    return SweepResult(endpoint="http://x", api="completions", levels=levels, seed=seed)


def blocks(rng: random.Random, prompts: list[float], launches: list[float], noise: float = 0.002, gain=0.0):
    """One block per launch factor, repetition r on seed r (speed `prompts[r]`) at c=8."""
    return [
        [rep(r, {8: 400 * f * math.exp(gain + p + rng.gauss(0, noise))}) for r, p in enumerate(prompts)]
        for f in launches
    ]


def test_fit_takes_the_seeds_out_and_falls_back_to_plain_means_without_shared_seeds():
    rng = random.Random(3)
    seeds = [rng.gauss(0, 0.03) for _ in range(4)]
    shared = [[(s, b + seeds[s] + rng.gauss(0, 0.001)) for s in range(4)] for b in (0.0, 0.02)]
    fit = fit_blocks(shared)
    diff, var = fit.contrast([-1, 1])
    assert diff == pytest.approx(0.02, abs=0.003) and math.sqrt(var) < 0.002
    own = [[(10 * k + s, v) for s, v in block] for k, block in enumerate(shared)]  # no seed in common
    fit = fit_blocks(own)
    assert list(fit.means) == pytest.approx([sum(v for _, v in b) / 4 for b in own])
    assert math.sqrt(fit.contrast([-1, 1])[1]) > 0.01  # the prompts' spread is noise again


def test_seeds_that_explain_nothing_mostly_leave_plain_means():
    """Without a prompt effect (no speculative decoding) the seeds are taken out only when the
    spread happens to look like one (`SEED_TEST`): mostly a repetition on a seed the other block
    lacks still counts; with a prompt effect they always are taken out."""
    rng = random.Random(4)

    def plain_fit(prompt_sd: float) -> bool:
        effect = [rng.gauss(0, prompt_sd) for _ in range(6)]
        blocks = [[(s, effect[s] + rng.gauss(0, 0.01)) for s in range(n)] for n in (3, 6)]
        fit = fit_blocks(blocks)
        return fit.df == 7 and list(fit.means) == pytest.approx(
            [sum(v for _, v in b) / len(b) for b in blocks]
        )

    assert 0.65 < sum(plain_fit(0.0) for _ in range(200)) / 200 < 0.85  # 1 - SEED_TEST
    assert not any(plain_fit(0.05) for _ in range(50))


def test_a_small_gain_is_established_on_the_same_prompts_and_not_on_fresh_ones():
    rng = random.Random(5)
    prompts = [rng.gauss(0, 0.03) for _ in range(3)]
    before, after = blocks(rng, prompts, [1.0, 1.0])
    (cand,) = blocks(rng, prompts, [1.0], gain=math.log(1.03))
    cmp = paired_compare(before, cand, after, THROUGHPUT, launch_noise=0.002)
    level = cmp.per_level[0]
    assert cmp.verdict == "improved" and level.ci_low > 1.02
    fresh = [rep(100 + s.seed, {8: s.levels[0].output_throughput}) for s in cand]  # other seeds
    cmp = paired_compare(before, fresh, after, THROUGHPUT, launch_noise=0.002)
    assert cmp.verdict != "improved" and cmp.per_level[0].ci_low < 1.0


def test_the_launch_spread_is_measured_beside_the_prompts_spread():
    """Launches 2% apart on prompts 3% apart: the prompts' spread is in every block alike, so it is
    neither counted as restart spread nor (subtracted as repetition noise) hides it."""
    rng = random.Random(11)
    prompts = [rng.gauss(0, 0.03) for _ in range(3)]
    estimates = []
    for _ in range(40):
        launches = [math.exp(rng.gauss(0, 0.02)) for _ in range(6)]
        estimates.append(pooled_spread([blocks(rng, prompts, launches)], THROUGHPUT, [8])[0])
    rms = math.sqrt(sum(e * e for e in estimates) / len(estimates))
    assert 0.016 < rms < 0.024


def test_a_load_inside_one_launch_is_seen_through_the_prompts_spread():
    rng = random.Random(2)
    prompts = [rng.gauss(0, 0.03) for _ in range(3)]
    first, loaded = blocks(rng, prompts, [1.0, 0.97])  # the same launch, 3% slower for a while
    used, aside, why = settle(first, loaded, THROUGHPUT)
    assert aside is loaded and used is first and "transient load" in why


def test_a_second_block_on_one_launch_finds_none_of_the_first_ones_prompts_cached(sim_server):
    """Two blocks of known-good on one launch send the same prompts (and a repetition beyond `reps`
    one of them again): the prefix cache flushed before each level keeps them from skipping prefill."""
    import asyncio
    import re

    from agent.trial.measure import measure

    srv = sim_server("seed", [], time_scale=0.002)
    bench = BenchConfig(concurrency=[4], output_len=4, warmup=0, reps=2, input_len=256)
    first = asyncio.run(measure(srv.endpoint, bench, max_reps=2))
    # one more repetition than `reps`: on seed 0 again, whose prompts the other block measured too
    second = asyncio.run(measure(srv.endpoint, bench, more=lambda reps: True, max_reps=3))
    assert [s.seed for s in first] == [0, 1] and [s.seed for s in second] == [0, 1, 0]
    assert all(s.level(4).completed == 8 for s in first + second)
    cached = [int(n) for n in re.findall(r"#cached-token: (\d+)", srv.log())]
    assert len(cached) >= 4 and sum(cached) == 0  # random prompts share nothing but themselves
