"""The restart spread a run measures on its own deployment before any trial (agent/trial/spread.py)
and how the intervals use it (tools/bench/paired.py). The deployment is the scripted-launch fake of
tests/test_paired_trial.py: every deploy and rollback is a launch at the next scripted speed."""

from __future__ import annotations

import asyncio
import math
import random

from agent.prepare import restart_budget
from agent.trial.record import Baseline, TrialChange
from agent.trial.runner import TrialRunner
from agent.trial.spread import MARK, block_reps, measure_spread, spread_of_blocks
from tests.test_paired_trial import UNIT, Launches, script_blocks
from tools.bench.launches import launch_spread, pooled_spread
from tools.bench.objective import objective_from_goal
from tools.bench.paired import paired_compare
from tools.config import BenchConfig

GOAL = objective_from_goal("improve throughput")


class Marked(Launches):
    """Launches that remember the unit texts deployed."""

    texts: list[str]

    async def deploy(self, text: str, *, reason: str):  # type: ignore[no-untyped-def]
        self.texts = [*getattr(self, "texts", []), text]
        return await super().deploy(text, reason=reason)


def runner_on(monkeypatch, launches: Launches, bench: BenchConfig, probe: bool = True) -> TrialRunner:  # type: ignore[no-untyped-def]
    script_blocks(monkeypatch, launches, probe=probe)
    baseline = Baseline(reps=launches.block(), probe=None, text=UNIT)
    return TrialRunner(
        deployment=launches, endpoint="http://127.0.0.1:9", bench=bench, objective=GOAL, baseline=baseline
    )


def test_the_baseline_phase_relaunches_known_good_and_measures_how_far_it_moves(monkeypatch):
    # known-good's three launches at 1.00, 1.03 and 0.97 of one speed (a relaunch is the marked copy)
    launches = Marked(a=[1.0, 0.97], b=[1.03])
    runner = runner_on(monkeypatch, launches, BenchConfig())
    runner.max_restarts = restart_budget(None, 9)  # a grid of 9 levers: 9 restarts for the whole run
    spread = asyncio.run(measure_spread(runner))
    assert launches.events == ["deploy", "rollback"] and runner.restarts == 2
    # the relaunches are spent from that budget: 7 restarts are left for the trials, not 9
    assert runner.restarts_left(7) and not runner.restarts_left(8)
    assert launches.texts == [UNIT + MARK]  # the same server command: only a comment differs
    assert spread.source == "measured" and spread.launches == 3
    assert 0.025 < spread.measured < 0.035  # sd of log(1.00, 1.03, 0.97) = 3.0%
    # used instead of the declared 1%, with its own two degrees of freedom
    assert spread.value == spread.measured and runner.launch_prior == (spread.value, 2)
    # all three are known-good's history; the last is the next trial's A, and the two before it
    # are not pooled into the spread again (the prior holds them)
    assert len(runner.known_good_blocks) == 3 and runner.known_good_blocks[-1] is runner.reference
    assert [id(b) for b in runner.prior_blocks] == [id(b) for b in runner.known_good_blocks[:2]]
    assert (
        "over 3 launches of known-good (c=1 3." in spread.describe() and "declared 1.0%" in spread.describe()
    )


def test_a_recorded_spread_is_used_without_a_restart_and_none_asked_keeps_the_declared(monkeypatch):
    launches = Launches(a=[1.0], b=[])
    recorded = BenchConfig(launch_spread=0.025, launch_spread_df=7)
    runner = runner_on(monkeypatch, launches, recorded)
    spread = asyncio.run(measure_spread(runner))
    assert launches.events == [] and runner.restarts == 0
    assert spread.source == "recorded" and runner.launch_prior == (0.025, 7)
    runner = runner_on(monkeypatch, Launches(a=[1.0], b=[]), BenchConfig(spread_launches=0))
    assert asyncio.run(measure_spread(runner)).source == "declared" and runner.launch_prior == (0.01, None)


def test_a_relaunch_that_fails_leaves_known_good_deployed_and_the_declared_figure(monkeypatch):
    from tools.deploy.deployment import DeployOutcome

    class Fails(Launches):
        async def deploy(self, text: str, *, reason: str) -> DeployOutcome:
            self.events.append("deploy")
            return DeployOutcome(ok=False, error="port in use", rolled_back=True)

    launches = Fails(a=[1.0, 1.0], b=[])
    runner = runner_on(monkeypatch, launches, BenchConfig())
    spread = asyncio.run(measure_spread(runner))
    # the failed start and deploy()'s own rollback to known-good: two restarts, nothing more to undo
    assert spread.source == "declared" and runner.restarts == 2 and launches.events == ["deploy"]
    assert runner.launch_prior == (0.01, None) and runner.reference is None


def test_launches_that_differ_far_beyond_a_restart_stop_the_trials_before_any_restart(monkeypatch):
    import pytest

    from agent.trial.record import BudgetExhausted

    # known-good at 1.00, 1.40 and 0.70 of one speed: a load beside the server, not a restart
    launches = Launches(a=[1.0, 0.7], b=[1.4])
    runner = runner_on(monkeypatch, launches, BenchConfig())
    spread = asyncio.run(measure_spread(runner))
    assert spread.measured > 0.3 and runner.halted and f"differ by {spread.measured:.0%}" in runner.halted
    assert "measure again when the machine is quiet" in runner.halted
    with pytest.raises(BudgetExhausted, match="trials stopped: launches of known-good differ"):
        asyncio.run(runner.run([TrialChange(flag="--enable-mixed-chunk")], reason="t"))
    assert launches.events == ["deploy", "rollback"]  # the spread's two relaunches, then nothing
    # a steady deployment's spread stops nothing (the first test's 3%)
    steady = runner_on(monkeypatch, Launches(a=[1.0, 0.97], b=[1.03]), BenchConfig())
    asyncio.run(measure_spread(steady))
    assert steady.halted is None


def test_a_measured_spread_widens_the_interval_of_the_same_blocks():
    fake = Launches(a=[1.0, 1.0], b=[1.04], rng=__import__("random").Random(5))
    before = fake.block()
    fake.factor = 1.04
    cand = fake.block()
    fake.factor = 1.0
    after = fake.block()
    declared = paired_compare(before, cand, after, GOAL)
    measured = paired_compare(before, cand, after, GOAL, launch_noise=0.025, prior_df=4)
    c64 = lambda cmp: next(i for i in cmp.per_level if i.concurrency == 64)  # noqa: E731
    assert declared.verdict == "improved" and measured.verdict != "improved"
    assert c64(measured).ci_low < c64(declared).ci_low < 1.04 < c64(declared).ci_high < c64(measured).ci_high


def test_the_pooled_spread_counts_a_measured_prior_with_its_own_degrees_of_freedom():
    assert launch_spread(0.01, (0.0, 0)) == (0.01, math.inf)  # declared, nothing seen: taken as exact
    assert launch_spread(0.02, (0.0, 0), 4) == (0.02, 4)
    value, df = launch_spread(0.02, (0.04, 2), 4)
    assert df == 6 and abs(value - math.sqrt((4 * 0.02**2 + 2 * 0.04**2) / 6)) < 1e-12


def blocks_at(fake: Launches, factors: tuple[float, ...]) -> list:  # type: ignore[type-arg]
    out = []
    for f in factors:
        fake.factor = f
        out.append(fake.block())
    return out


def test_the_spread_seen_is_pooled_over_configurations_each_around_its_own_mean():
    fake = Launches(a=[1.0], b=[])
    # two configurations 10% apart, each launched three times with the same spread (~2%)
    one, other = blocks_at(fake, (1.0, 1.02, 0.98)), blocks_at(fake, (1.1, 1.122, 1.078))
    alone, df_alone = pooled_spread([one], GOAL, [64])
    both, df = pooled_spread([one, other], GOAL, [64])
    assert df_alone == 2 and df == 4  # the difference between them is their effect, not spread
    assert 0.015 < alone < 0.025 and 0.015 < both < 0.025
    assert pooled_spread([one[:2]], GOAL, [64]) == (0.0, 0)  # one degree of freedom: too little
    # as one configuration, the 10% between them would be taken for spread
    assert pooled_spread([one + other], GOAL, [64])[0] > 0.04


def test_a_trial_counts_the_launches_of_earlier_configurations_but_not_its_candidate_s(monkeypatch):
    launches = Launches(a=[1.0, 1.0, 1.0], b=[1.0, 1.0, 1.0])
    runner = runner_on(monkeypatch, launches, BenchConfig(), probe=False)
    runner.launch_prior = (0.01, 2)  # measured 1% on three launches
    fake = Launches(a=[1.0], b=[])
    # an earlier trial's candidate, launched three times 5% apart: this deployment's restarts move it
    for i, block in enumerate(blocks_at(fake, (1.0, 1.05, 0.95))):
        runner.launch_blocks[-1 - i] = ("an earlier candidate", block)
    record = asyncio.run(runner.run([TrialChange(flag="--enable-mixed-chunk")], reason="test"))
    spread = record.comparison["overall"]["launch_spread"]
    assert spread > 0.03  # the earlier candidate's 5% (4 df) outweighs the 1% prior (2 df)
    # this trial's launches count for later ones: known-good's two (the block before settled with
    # the baseline's of the same launch, the one after the rollback) and the candidate's one
    assert set(record.blocks) == {"before", "candidate", "after"}
    assert sorted(len(g) for g in runner.launch_groups) == [1, 2, 3]
    # the candidate's launches, however far apart, never set the spread its own trial is judged with
    runner2 = runner_on(monkeypatch, Launches(a=[1.0, 1.0, 1.0], b=[1.03, 0.97, 1.0]), BenchConfig(), False)
    runner2.launch_prior = (0.01, 2)
    record2 = asyncio.run(runner2.run([TrialChange(flag="--enable-mixed-chunk")], reason="test"))
    assert record2.comparison["overall"]["launch_spread"] < 0.02


def test_the_last_trial_a_budget_allows_is_deployed(monkeypatch):
    # the trial count must not refuse the trial it has just counted (a one-trial run deployed nothing)
    launches = Launches(a=[1.0, 1.0], b=[1.0])
    runner = runner_on(monkeypatch, launches, BenchConfig(), probe=False)
    runner.max_trials = 1
    record = asyncio.run(runner.run([TrialChange(flag="--enable-mixed-chunk")], reason="test"))
    assert launches.events[:2] == ["deploy", "rollback"] and record.deployed


def test_spread_of_blocks_is_per_level_and_overall():
    fake = Launches(a=[1.0], b=[])
    blocks = []
    for f in (1.0, 1.02, 0.98, 1.0):
        fake.factor = f
        blocks.append(fake.block())
    spread = spread_of_blocks(blocks, GOAL, 0.01)
    assert set(spread.per_level) == {1, 8, 64} and spread.launches == 4 and spread.df == 3
    assert all(0.01 < v < 0.025 for v in spread.per_level.values())


def test_launches_that_agree_within_their_repetitions_give_the_block_s_resolution_not_zero():
    # three launches at one speed: repetition noise 0.2%, so a block's mean resolves ~0.1%
    fake = Launches(a=[1.0], b=[])
    blocks = [fake.block() for _ in range(3)]
    spread = spread_of_blocks(blocks, GOAL, 0.01)
    assert all(0.0005 < v < 0.003 for v in spread.per_level.values())
    assert spread.value > 0.0005


def test_known_good_s_level_in_a_trial_is_its_own_launches_not_the_spread_phase_s(monkeypatch):
    # the server got 1.5% faster after the spread phase's first two launches (a slow drift: a room
    # warming, a neighbour gone) and a no-op is tried on it now; averaging those two launches into
    # known-good's level would make the no-op look +0.75% better, too little for any test to call
    launches = Marked(a=[0.985, 1.0, *[1.0] * 6], b=[0.985, *[1.0] * 6])
    runner = runner_on(monkeypatch, launches, BenchConfig(), probe=False)
    spread = asyncio.run(measure_spread(runner))
    record = asyncio.run(runner.run([TrialChange(flag="--enable-mixed-chunk")], reason="test"))
    overall = record.comparison["overall"]
    assert record.decision != "kept"
    assert abs(overall["ratio"] - 1) < 0.004, overall["ratio"]
    # the step between the spread phase's launches still counts, in the restart spread
    assert 0.006 < spread.value < 0.012  # sd of log(0.985, 0.985, 1.0)
    assert overall["launch_spread"] > 0.006


def _blocks_at(factors: list[float], noise: float, reps: int = 3) -> list[list]:
    """One block of `reps` repetitions per launch at each speed factor, each repetition `noise` (relative sd) apart."""
    fake = Launches(a=[1.0], b=[], rng=random.Random(7))
    out = []
    for f in factors:
        fake.factor = f
        out.append([_jitter(s, fake.rng, noise) for s in fake.block()[:reps]])
    return out


def _jitter(sweep, rng, noise: float):  # type: ignore[no-untyped-def]
    for lv in sweep.levels:
        lv.output_throughput *= math.exp(rng.gauss(0, noise))
    return sweep


def test_a_trial_s_blocks_start_at_two_repetitions_where_restarts_move_the_server_far_more():
    # launches 2% apart, repetitions 0.3%: a third repetition would narrow no interval
    blocks = _blocks_at([1.0, 1.02, 0.98], 0.003)
    n, noise = block_reps(blocks, GOAL, 0.02, 3)
    assert n == 2 and set(noise) == {1, 8, 64} and all(0.001 < v < 0.008 for v in noise.values())
    # repetitions as noisy as launches: every block keeps the configured three
    noisy = _blocks_at([1.0, 1.01, 0.99], 0.02)
    assert block_reps(noisy, GOAL, 0.01, 3)[0] == 3
    # nothing to tell them apart by (one launch, or no spread): the configured number
    assert block_reps(blocks[:1], GOAL, 0.02, 3) == (3, {})
    assert block_reps(blocks, GOAL, 0.0, 3)[0] == 3
    assert block_reps(blocks, GOAL, 0.02, 1)[0] == 1  # never more than the configured number


def test_the_spread_phase_sets_the_block_size_every_trial_block_starts_at(monkeypatch):
    import agent.trial.steps as steps

    launches = Marked(a=[1.0, 0.97, *[1.0] * 6], b=[1.03, *[1.05] * 4])
    runner = runner_on(monkeypatch, launches, BenchConfig(), probe=False)
    spread = asyncio.run(measure_spread(runner))
    assert runner.block_reps == spread.block_reps == 2
    assert "a trial's blocks start at 2 repetitions" in spread.describe()
    asked = []

    async def measure(*args: object, start: int | None = None, **kw: object):  # type: ignore[no-untyped-def]
        asked.append(start)
        return launches.block()[: start or 3]

    monkeypatch.setattr(steps, "measure", measure)
    record = asyncio.run(runner.run([TrialChange(flag="--enable-mixed-chunk")], reason="test"))
    assert record.deployed and asked and set(asked) == {2}
    assert record.blocks["candidate"] == 2


def test_an_unsteady_deployment_still_trials_a_gain_it_can_establish():
    # the real SGLang on two CPU cores: launches of known-good 13% apart, while a batch cap of 2
    # under 8 requests at once may multiply throughput; only a gain above the bar is worth restarts
    from agent.trial.spread import LaunchSpread, establishable, unsteady

    spread = LaunchSpread(value=0.13, df=2, source="measured", measured=0.13, launches=3)
    bar = establishable(0.13, 0.02)
    assert 0.3 < bar < 0.4
    assert unsteady(spread, largest_gain=0.5) is None
    why = unsteady(spread, largest_gain=0.06)
    assert why and "no change below 36%" in why and "largest a candidate may bring here is 6%" in why
    assert (
        unsteady(spread)
        and unsteady(LaunchSpread(value=0.05, df=2, source="measured", measured=0.05)) is None
    )
