"""How much known-good itself moves between launches on this deployment, measured before any trial.

Repetitions inside one launch cannot see the restart-to-restart spread; every trial's interval adds
it for each launch involved (`tools.bench.paired.interval`). A declared figure (`bench.launch_noise`,
1%) was a guess: on the simulated seed on two shared cores known-good moved 2-3% between launches,
so a +3% lever was "not established" twice and a lucky no-op could pass. The figure a run uses is,
in this order:

1. recorded: `bench.launch_spread` with its `launch_spread_df` (`optagent bench --restarts N`);
2. measured: the baseline phase relaunches known-good `bench.spread_launches` times (a marked copy
   of its unit file deployed, then the rollback: the same server, a fresh launch each) and measures
   a block on each; the spread of the block means beyond their repetitions, at each level;
3. declared: `bench.launch_noise`, when neither is possible.

A measured figure counts with its own degrees of freedom (the t quantile of every interval widens
accordingly, so three launches that happened to agree cannot make a trial overconfident); the
run's later launches of every configuration launched more than once (known-good's, earlier
candidates': `TrialRunner.launch_groups`, `tools.bench.launches.pooled_spread`) are pooled with it
(`tools.bench.launches.launch_spread`). They tell how far a launch moves, not where known-good
stands now: a trial's known-good level is its own launches' (`tools.bench.paired.interval`). Weighing
the declared 1% in as two launches pulled a true 2.5% spread down and kept 6% of no-ops
(`python benchmarks/bench_rule_power.py --measured --history 3 --gains 0`, 300 trials a cell: 3.7%
without it, 8.7% with the declared figure alone).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from agent.trial.state import RunnerState

DECLARED_WEIGHT = 0
"""Launches' worth of evidence the declared spread keeps once the deployment's own is measured
(none: the measured figure replaces it)."""
MARK = "# optagent: a relaunch of known-good to measure the restart spread (no flag changed)\n"


UNSTEADY = 0.1
"""Launches of one configuration that differ by this much (relative sd) are no restart's spread (a
few percent at most; 0.2-2.1% measured on the simulated deployments): the machine or the server
did not serve steadily (a load beside it, a throttling GPU), and no change of a few percent can
be established against it."""


Z_INTERVAL, Z_POWER = 1.96, 0.84
"""A 95% interval's half width, and the distance beyond a bar at which four estimates in five clear it."""


def establishable(spread: float, min_effect: float) -> float:
    """The smallest gain at one level that one trial (two launches of each side, so the launch
    term's variance is one launch's) establishes about four times in five with restart spread
    `spread`. The rule asks two things of the estimate, both with the launch term as its noise: an
    interval above no change (1.96 spreads) and at least the minimum effect; a lever worth exactly
    the larger of the two is kept half the time, so four in five need 0.84 spreads more."""
    return max(min_effect, Z_INTERVAL * spread) + Z_POWER * spread


def unsteady(
    spread: LaunchSpread, *, largest_gain: float | None = None, min_effect: float = 0.02
) -> str | None:
    """Why no trial can be judged against this measured spread, or None. With `largest_gain` (the
    largest gain a candidate may bring here), an unsteady deployment still trials when that gain
    is one a trial can establish against the spread (a batch cap far below the traffic on a CPU
    server that moves 13% from launch to launch): the intervals carry the spread, so a smaller
    change is simply not established, never kept on noise."""
    if spread.measured is None or spread.measured < UNSTEADY:
        return None
    bar = establishable(spread.measured, min_effect)
    if largest_gain is not None and largest_gain >= bar:
        return None
    return (
        f"launches of known-good differ by {spread.measured:.0%} (over {spread.launches} launches; a "
        "restart moves a steady server a few percent at most): something beside the server moved "
        f"them, and no change below {bar:.0%} can be established against that"
        + (
            f" (the largest a candidate may bring here is {largest_gain:.0%})"
            if largest_gain is not None
            else ""
        )
        + "; measure again when the machine is quiet"
    )


@dataclass
class LaunchSpread:
    """The restart spread (relative sd per launch) a run's intervals assume, and where it came from."""

    value: float
    df: float | None
    """Degrees of freedom (None: a declared figure, taken as exact)."""
    source: str
    """declared | recorded | measured"""
    measured: float | None = None
    """What the deployment showed (recorded or measured), before weighting with the declared one."""
    launches: int = 0
    """Launches of known-good measured (the baseline's included)."""
    per_level: dict[int, float] | None = None
    declared: float = 0.01
    block_reps: int | None = None
    """Repetitions a trial's block starts with (`block_reps`; None: `bench.reps`, not measured)."""
    rep_noise: dict[int, float] | None = None
    """Per level, how far one repetition moves within a launch (relative sd), where measured."""
    skipped: str = ""
    """Why the spread was not measured although the config asked for it ("" when it was, or not asked)."""

    @property
    def prior(self) -> tuple[float, float | None]:
        """(value, df) for `tools.bench.paired.paired_compare(launch_noise=, prior_df=)`."""
        return self.value, self.df

    def describe(self) -> str:
        """One sentence for the report."""
        if self.source == "declared":
            why = self.skipped or "not measured on this deployment"
            return f"launch spread: declared {self.value:.1%} ({why})"
        if self.source == "recorded":
            return (
                f"launch spread: {self.value:.1%} recorded by `optagent bench --restarts` "
                f"({self.df:g} degrees of freedom); the declared {self.declared:.1%} not used"
            )
        levels = ", ".join(f"c={c} {v:.1%}" for c, v in (self.per_level or {}).items())
        weighed = (
            f"weighed with the declared {self.declared:.1%} as {DECLARED_WEIGHT} launches: {self.value:.1%} used"
            if DECLARED_WEIGHT
            else f"used instead of the declared {self.declared:.1%}"
        )
        return (
            f"launch spread: measured {self.measured:.1%} over {self.launches} launches of known-good "
            f"({levels}); {weighed} ({self.df:g} degrees of freedom)" + self._blocks()
        )

    def _blocks(self) -> str:
        if self.block_reps is None or not self.rep_noise:
            return ""
        noise = ", ".join(f"c={c} {v:.1%}" for c, v in self.rep_noise.items())
        return (
            f"; one repetition moves a launch's result {noise}: a trial's blocks start at "
            f"{self.block_reps} repetitions"
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe for the transcript."""
        return asdict(self)


def known_spread(bench: Any) -> LaunchSpread:
    """The recorded figure when the config has one, else the declared one."""
    if bench.launch_spread is not None and bench.launch_spread_df >= 1:
        return LaunchSpread(
            value=bench.launch_spread, df=bench.launch_spread_df, source="recorded",
            measured=bench.launch_spread, declared=bench.launch_noise,
        )  # fmt: skip
    return LaunchSpread(value=bench.launch_noise, df=None, source="declared", declared=bench.launch_noise)


def spread_of_blocks(blocks: list[list[Any]], objective: Any, declared: float) -> LaunchSpread:
    """The spread of known-good's launches (one block each), per level and overall (root mean
    square of the levels' spreads), weighed with `declared` as `DECLARED_WEIGHT` launches. At a
    level where the launches agree within what a block's repetitions resolve, that resolution is
    the figure: a few launches that happen to agree cannot show that a restart moves nothing (a
    spread of 0 would leave the launch term out of every interval)."""
    from tools.bench.launches import block_resolution, block_spread

    levels = sorted({lv.max_concurrency for lv in blocks[0][0].levels}) if blocks and blocks[0] else []
    per_level = {
        c: math.expm1(max(block_spread(blocks, objective, [c]), block_resolution(blocks, objective, [c])))
        for c in levels
    }
    measured = math.sqrt(sum(v**2 for v in per_level.values()) / len(per_level)) if per_level else 0.0
    df = len(blocks) - 1
    pooled = math.sqrt((DECLARED_WEIGHT * declared**2 + df * measured**2) / (DECLARED_WEIGHT + df))
    return LaunchSpread(
        value=pooled, df=DECLARED_WEIGHT + df, source="measured", measured=measured,
        launches=len(blocks), per_level=per_level, declared=declared,
    )  # fmt: skip


WITHIN_SHARE = 0.25
"""Repetition noise below this share of a comparison's variance is not worth another repetition
(as `agent.trial.judge.worth_more` decides within a trial)."""
MIN_BLOCK_REPS = 2
"""Fewest repetitions a block starts with: two blocks of one launch are compared over their
repetitions (`tools.bench.launches.settle`), which one repetition each cannot do."""


def block_reps(
    blocks: list[list[Any]], objective: Any, spread: float, most: int
) -> tuple[int, dict[int, float]]:
    """(repetitions a trial's block starts with, per level the relative sd of one repetition) from
    known-good's launches (`blocks`, one each) and the restart spread the run uses: the fewest, from
    MIN_BLOCK_REPS to `most`, at which a block mean's repetition noise stays below WITHIN_SHARE of
    it plus one launch's spread at every level. Every launch of a comparison adds the spread and a
    block's repetitions cannot shrink it: where a restart moves the server several times more than a
    repetition does, a third repetition narrows no interval (`bench_rule_power.py --block-reps 2`
    keeps the same share of true +2.5..3% levers and of no-ops) and costs a third of a trial's
    measuring, which buys more launches instead. `most` (and no per-level figures) with fewer
    than two launches or no spread."""
    from tools.bench.launches import block_resolution

    if len(blocks) < 2 or spread <= 0:
        return most, {}
    size = sum(map(len, blocks)) / len(blocks)
    levels = sorted({lv.max_concurrency for lv in blocks[0][0].levels}) if blocks[0] else []
    one = {c: block_resolution(blocks, objective, [c]) * math.sqrt(size) for c in levels}
    launch = math.log1p(spread) ** 2
    need = max(
        (math.ceil(v**2 * (1 - WITHIN_SHARE) / WITHIN_SHARE / launch) for v in one.values()), default=most
    )
    return min(most, max(MIN_BLOCK_REPS, need)), {c: math.expm1(v) for c, v in one.items()}


def spread_restarts(bench: Any) -> int:
    """Restarts `measure_spread` spends on this configuration (0 when a spread is recorded)."""
    if known_spread(bench).source == "recorded":
        return 0
    return bench.spread_launches + bench.spread_launches % 2


async def measure_spread(r: RunnerState) -> LaunchSpread:
    """Relaunch known-good `r.bench.spread_launches` times (rounded up to even: each deploy of the
    marked copy is followed by the rollback, so known-good ends deployed), a block on each launch,
    and set `r.launch_prior`. The restarts count in the run's. Falls back to `known_spread` when the
    config records a figure, no relaunch is asked, or a relaunch fails."""
    spread = known_spread(r.bench)
    n = spread_restarts(r.bench)
    if n == 0 or not r.reference:
        r.assume_spread(spread.prior)
        return spread
    cost = n * (r.restart_estimate() + r.bench.reps * r.rep_estimate())
    if not r.fits(cost + r.trial_estimate()):  # the budget is for trials first
        r.assume_spread(spread.prior)
        spread.skipped = f"not measured: {n} relaunches (~{cost / 60:.0f} min) and one trial do not fit the wall-time budget"
        return spread
    first = r.reference
    relaunched, _ = await relaunch_known_good(r, n)
    blocks = [first, *relaunched]
    if len(blocks) < 3:
        r.assume_spread(spread.prior)
        return spread
    measured = spread_of_blocks(blocks, r.objective, r.bench.launch_noise)
    measured.block_reps, measured.rep_noise = block_reps(blocks, r.objective, measured.value, r.bench.reps)
    # known-good's history (its spread is in the prior already: not pooled again)
    r.assume_spread(measured.prior, block_reps=measured.block_reps, launches=blocks)
    # no restart spent on trials that cannot be judged
    if why := unsteady(measured, largest_gain=r.largest_gain, min_effect=r.bench.min_effect):
        r.halt(why)
    return measured


async def launch_block(r: RunnerState, label: str) -> tuple[list[Any], str]:
    """The probe's warm-up (as every launch of a trial gets), then a block of `r.bench.reps` sweeps
    on the running launch: (the block, why it is incomplete or "")."""
    from agent.trial.steps import measure_block, warm  # at call time: stand-ins patch `steps`

    await warm(r)
    block = await measure_block(r, None, label, start=r.bench.reps, max_reps=r.bench.reps)
    if block and not any(s.partial for s in block):
        return block, ""
    return (
        block,
        f"the benchmark of {label} is incomplete: {'; '.join(e for s in block for e in s.errors) or 'no result'}",
    )


async def relaunch_known_good(
    r: RunnerState, n: int, *, label: str = "spread launch"
) -> tuple[list[list[Any]], str]:
    """Relaunch known-good `n` times through `r.deployment` (the marked copy of its unit file
    deployed, then the rollback, in turn: a fresh launch of the same server each) and measure a block
    of `r.bench.reps` repetitions on each, after the probe's warm-up. Returns the blocks and why it
    stopped short ("" when all `n` were measured). Known-good ends deployed: after an odd `n`, or a
    stop on the marked copy, one more rollback (not measured). Every restart counts in
    `r.restarts`; `r.reference` is the last launch's block (None when known-good was restarted
    after it) and then the only entry of `r.known_good_blocks`."""
    blocks: list[list[Any]] = []
    on_marked, why = False, ""
    for i in range(n):
        if i % 2 == 0:
            outcome = await r.deployment.deploy(
                r.deployed_text + MARK, reason="launch spread: relaunch known-good"
            )
        else:
            outcome = await r.deployment.rollback()
        r.note_restart(outcome)
        # a failed deploy rolled back by itself: one more restart (a rollback's own outcome says
        # rolled_back too, and is one restart)
        r.count_restarts(1 + int(i % 2 == 0 and bool(getattr(outcome, "rolled_back", False))))
        on_marked = i % 2 == 0 and outcome.ok
        if not outcome.ok:
            why = f"relaunch {i + 1} failed: {outcome.error or 'not healthy'}"
            break
        await r.deployment.keepalive()
        block, why = await launch_block(r, f"{label} {i + 1}")
        if why:
            break
        blocks.append(block)
        r.measured_launch(block)
    if on_marked:  # stopped on the marked copy: known-good back
        outcome = await r.deployment.rollback()
        r.count_restarts()
        if not outcome.ok:
            why = "; ".join(filter(None, [why, f"the rollback to known-good failed: {outcome.error}"]))
    r.history_from_reference()
    return blocks, why
