"""How often does a trial keep a change of a given true size, and how many restarts does it spend?
A Monte Carlo through the agent's own trial code (`agent.trial.paired.PairedTrial` and the interval
of `tools.bench.paired`): the early stop after the A/B look, the A/B/A comparison, the second
launch of a likely winner and the third launch of a near miss, with adaptive repetitions.

Only the deployment and the measurements are simulated: every deploy or rollback is a new launch
with a log-normal speed factor (the restart spread), every repetition has its own noise at each
level, and the candidate's true gain applies at the levels chosen (`--where`). The run has already
measured `--history` known-good launches (their spread is pooled with the declared one). A true
gain of 0 gives the false-keep rate of a no-op; a true restart spread above the declared 1% shows
what a wrong `bench.launch_noise` costs.

    python benchmarks/bench_rule_power.py [--trials 1000] [--where c64|all] [--history 4] [--earlier 3] [--no-third]
        [--step 0.04] [--transient 0.2 [--load-at 64]] [--drift 0.001 --gap 4] [--measured --floor-weight 2]
        [--block-reps 2] [--another-look]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
from dataclasses import dataclass, field

import agent.trial.paired as pt
import agent.trial.steps as steps
from agent.trial.measure import rep_seed
from agent.trial.record import Baseline, TrialChange
from agent.trial.runner import TrialRunner
from agent.trial.spread import spread_of_blocks
from tools.bench.objective import objective_from_goal
from tools.bench.results import LevelResult, SweepResult
from tools.config import BenchConfig

LEVELS = {1: 120.0, 8: 400.0, 64: 1200.0}
UNIT = "[Service]\nExecStart=/usr/bin/python -m sglang.launch_server --model-path /m --port 30000\n"


@dataclass
class Launches:
    """The target: known-good or the candidate runs in the current launch, at that launch's speed."""

    rng: random.Random
    gain: dict[int, float]
    launch_sd: float
    rep_sd: float
    prompt_sd: float = 0.0
    fresh_prompts: bool = False
    factor: float = 1.0
    candidate: bool = False
    restarts: int = 0
    sweeps: int = 0
    """Repetitions measured (the trial's measuring time, in repetitions)."""
    events: list[str] = field(default_factory=list)
    prompts: dict[tuple[int, int], float] = field(default_factory=dict)
    """(seed, level): the speed of that seed's prompts at that level, the same on every launch."""
    blocks: int = 0
    bench: BenchConfig = field(default_factory=BenchConfig)
    drift: float = 0.0
    """How much faster every configuration runs with each block measured (log scale): slow drift
    over the run's hours, as a warming room or a neighbour's load would make it."""
    trend: float = 0.0
    transient: float = 0.0
    """The chance that a block of the trial is measured under a transient load of `step`."""
    step: float = 0.0
    load: float = 1.0
    load_at: int | None = None
    """The one level a transient load hits (None: every level of the block)."""

    def relaunch(self, candidate: bool) -> None:
        self.candidate, self.factor = candidate, math.exp(self.rng.gauss(0, self.launch_sd))
        self.restarts += 1

    async def deploy(self, text: str, *, reason: str) -> object:
        from tools.deploy.deployment import DeployOutcome

        self.relaunch(True)
        return DeployOutcome(ok=True)

    async def rollback(self) -> object:
        from tools.deploy.deployment import DeployOutcome

        self.relaunch(False)
        return DeployOutcome(ok=True)

    async def commit(self) -> None:
        self.events.append("commit")

    async def keepalive(self) -> bool:
        return True

    def sweep(self, rep: int) -> SweepResult:
        """Repetition `rep` of a block: seed `rep` mod reps as the trial code sends (`agent.trial.measure`),
        or with `fresh_prompts` a seed no other block used (each block with prompts of its own)."""
        self.sweeps += 1
        if rep == 0:
            self.blocks += 1
            self.trend += self.drift
            if self.transient:
                self.load = 1 - self.step if self.rng.random() < self.transient else 1.0
        seed = self.blocks * 1000 + rep if self.fresh_prompts else rep_seed(rep, self.bench)

        def tput(c: int, base: float) -> float:
            g = self.gain.get(c, 0.0) if self.candidate else 0.0
            if (seed, c) not in self.prompts:
                self.prompts[seed, c] = self.rng.gauss(0, self.prompt_sd)
            return (
                base
                * self.factor
                * (self.load if self.load_at in (None, c) else 1.0)
                * math.exp(g + self.trend + self.prompts[seed, c] + self.rng.gauss(0, self.rep_sd))
            )

        levels = [
            LevelResult(max_concurrency=c, num_prompts=8, completed=8, output_throughput=tput(c, t))
            for c, t in LEVELS.items()
        ]
        return SweepResult(endpoint="http://sim", api="completions", levels=levels, seed=seed)


def simulate_measurements(sweep) -> None:  # type: ignore[no-untyped-def]
    """The trial code measures with `sweep()` (one repetition each, adaptive as in `measure`), with
    no warm-up and identical outputs."""

    async def measure(  # type: ignore[no-untyped-def]
        endpoint: str, bench: BenchConfig, *, more=None, max_reps: int, start=None, on_progress=None
    ):
        reps = [sweep(r) for r in range(start or bench.reps)]
        while more is not None and len(reps) < max_reps and more(reps):
            reps.append(sweep(len(reps)))
        return reps

    async def nothing(*args: object) -> None:
        return None

    steps.measure, steps.warm, steps.Trial.probe_ok = measure, nothing, nothing  # type: ignore[assignment,method-assign]


def one_trial(  # type: ignore[no-untyped-def]
    rng: random.Random,
    gain: dict[int, float],
    launch_sd: float,
    rep_sd: float,
    history: int,
    step: float = 0.0,
    measured: bool = False,
    earlier_configs: int = 0,
    prompt_sd: float = 0.0,
    fresh_prompts: bool = False,
    drift: float = 0.0,
    gap: int = 0,
    floor_weight: float = 0.0,
    block_reps: int = 0,
    another_look: bool = False,
    transient: float = 0.0,
    load_at: int | None = None,
):
    """(kept, restarts, candidate launches, repetitions measured) of one trial after `history` known-good launches, the
    last block of them (the previous trial's block after, still running) measured `step` slower
    than its launch (a transient load). `measured`: the run measured its restart spread on its
    `history` known-good launches (`agent.trial.spread`) and its intervals use that figure.
    `earlier_configs`: configurations launched three times each by earlier trials (their spread is
    pooled in, `TrialRunner.launch_groups`). `prompt_sd`: how far one seed's prompts move a
    repetition (the same on every launch); `fresh_prompts`: every block on prompts of its own;
    `drift`: every block measured that much faster than the one before it (`Launches.drift`);
    `gap`: blocks of other trials between two of the known-good launches (they age in the drift);
    `floor_weight`: launches' worth the declared spread keeps where the measured one is lower (a
    floor the agent does not use: it did not pay, see README); `block_reps`: repetitions a trial's
    block starts with (0: `bench.reps`, as the known-good launches before it took); `another_look`:
    a first launch that came short without ruling the change out is followed by one more trial of
    it, judged together with that launch (`agent.trial.firstlook`), as a run with restarts left
    gives it. `transient`: the chance that a block of the trial itself is measured `step` slower (a
    load that comes and goes at random, as another job on the host would); `load_at`: the one level
    it hits (a load during that level's part of a block), every level when None."""
    bench = BenchConfig()
    target = Launches(rng, gain, launch_sd, rep_sd, prompt_sd, fresh_prompts, bench=bench, drift=drift)

    simulate_measurements(target.sweep)
    earlier = []
    for i in range(history):
        target.trend += gap * target.drift * (i > 0)
        target.relaunch(False)
        speed = target.factor
        if i == history - 1 and not transient:  # the last block of known-good, under a load step
            target.factor *= 1 - step
        earlier.append([target.sweep(r) for r in range(bench.reps)])
        target.factor = speed
    runner = TrialRunner(
        deployment=target, endpoint="http://sim", bench=bench,
        objective=objective_from_goal("improve throughput"), baseline=Baseline(reps=[], probe=None, text=UNIT),
        reference=earlier[-1], known_good_blocks=earlier, block_reps=block_reps,
    )  # fmt: skip
    if measured:
        value, df = spread_of_blocks(earlier, runner.objective, bench.launch_noise).prior
        if floor_weight:
            value = max(
                value, math.sqrt((floor_weight * bench.launch_noise**2 + df * value**2) / (floor_weight + df))
            )
        runner.launch_prior = value, df
        runner.prior_blocks = earlier[:-1]  # as `agent.trial.spread.measure_spread` leaves them
    running, now = target.factor, target.trend
    for i in range(earlier_configs):  # launches drawn beside the run's, known-good still running
        for k in range(3):
            target.relaunch(False)
            runner.launch_blocks[-1 - 3 * i - k] = (
                f"earlier {i}",
                [target.sweep(r) for r in range(bench.reps)],
            )
    # beside the run: the trial starts right after known-good's last block (the running launch's)
    target.factor, target.trend, target.restarts, target.sweeps = running, now, 0, 0
    target.transient, target.step, target.load_at = transient, step, load_at
    record = asyncio.run(runner.run([TrialChange(flag="--enable-mixed-chunk")], reason="power"))
    launches = ((record.comparison or {}).get("overall") or {}).get("launches_candidate", 1)
    if another_look and record.first_look:  # the run's leftover restarts: one more look, pooled
        record = asyncio.run(runner.run([TrialChange(flag="--enable-mixed-chunk")], reason="another look"))
    return record.decision == "kept", target.restarts, launches, target.sweeps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument(
        "--where", choices=["c1", "c8", "c64", "all"], default="c64", help="levels the true gain applies at"
    )
    ap.add_argument("--rep-noise", type=float, default=0.006, help="relative sd of one repetition at a level")
    ap.add_argument(
        "--prompt-noise", type=float, default=0.0,
        help="relative sd of one seed's prompts at a level, the same on every launch (the simulated "
        "seed's speculative decoding: ~0.025 at c=1 and c=8 with --rep-noise ~0.003)",
    )  # fmt: skip
    ap.add_argument(
        "--fresh-prompts", action="store_true", help="every block on prompts of its own (before 2026-12-04)"
    )
    ap.add_argument("--history", type=int, default=4, help="known-good launches earlier in the run")
    ap.add_argument("--no-third", action="store_true", help="never a third launch (to see what it buys)")
    ap.add_argument(
        "--step", type=float, default=0.0,
        help="a transient load: the running known-good launch's block from the last trial measured this "
        "much slower (as bench_agent's A/A trials inject with a CPU hog)",
    )  # fmt: skip
    ap.add_argument(
        "--measured", action="store_true",
        help="the restart spread measured on the --history known-good launches (as a run does), not declared",
    )  # fmt: skip
    ap.add_argument(
        "--earlier", type=int, default=0,
        help="configurations earlier trials launched three times each (their spread is pooled in)",
    )  # fmt: skip
    ap.add_argument(
        "--drift", type=float, default=0.0,
        help="slow drift: every block measured this much faster than the one before it (0.005: +0.5%%)",
    )  # fmt: skip
    ap.add_argument(
        "--gap", type=int, default=0, help="blocks of other trials between two known-good launches (with --drift)"
    )  # fmt: skip
    ap.add_argument(
        "--floor-weight", type=float, default=0.0,
        help="launches' worth the declared spread keeps where the measured one is lower (with --measured)",
    )  # fmt: skip
    ap.add_argument(
        "--block-reps", type=int, default=0,
        help="repetitions a trial's block starts with (0: bench.reps, 3; the agent picks 2 where restarts dominate)",
    )  # fmt: skip
    ap.add_argument(
        "--another-look", action="store_true",
        help="one more trial, pooled with the first launch, of a change whose first launch came short",
    )  # fmt: skip
    ap.add_argument(
        "--transient", type=float, default=0.0,
        help="the chance that a block of the trial is measured --step slower (a load that comes and goes)",
    )  # fmt: skip
    ap.add_argument(
        "--load-at", type=int, default=None,
        help="the one level a --transient load hits (default: every level of the block)",
    )  # fmt: skip
    ap.add_argument("--gains", default="0,0.02,0.025,0.03,0.04,0.05,0.08", help="true gains, comma separated")
    ap.add_argument(
        "--spreads", default="0.005,0.01,0.015,0.02", help="true restart spreads, comma separated"
    )
    args = ap.parse_args()
    if args.no_third:
        pt.near_miss = lambda cmp, bench: False  # type: ignore[assignment]
    gains = tuple(float(g) for g in args.gains.split(","))
    at = list(LEVELS) if args.where == "all" else [int(args.where[1:])]
    print(
        f"restart spread {f'measured on {args.history} launches' if args.measured else 'declared 1%'}"
        f"{f' (the declared 1% as {args.floor_weight:g} launches below it)' if args.measured and args.floor_weight else ''}, minimum effect 2%, load step {args.step:.0%}{f' on {args.transient:.0%} of the trial blocks at random' if args.transient else ''}{f' (at c={args.load_at} only)' if args.load_at else ''}, gain at {', '.join(f'c={c}' for c in at)}, "
        f"repetition noise {args.rep_noise:.1%}, prompts {args.prompt_noise:.1%} "
        f"({'each block its own' if args.fresh_prompts else 'the same in every block'}), "
        f"trial blocks of {args.block_reps or 3} repetitions{', one more look pooled with a first launch that came short' if args.another_look else ''}, slow drift {args.drift:+.2%} a block ({args.gap} between known-good launches), {args.trials} trials a cell; keep rate / mean restarts / share with a third launch / mean repetitions; a keep "
        f"rate near 60% is within +-{196 * math.sqrt(0.24 / args.trials):.0f} points of the truth (95%): "
        "read smaller differences between runs or variants as noise"
    )
    print("| true restart spread | " + " | ".join(f"true {g:+.1%}" for g in gains) + " |")
    print("|---:|" + "---:|" * len(gains))
    for launch_sd in (float(x) for x in args.spreads.split(",")):
        cells = []
        for g in gains:
            rng = random.Random(1)
            gain = {c: math.log1p(g) for c in at}
            runs = [
                one_trial(
                    rng,
                    gain,
                    launch_sd,
                    args.rep_noise,
                    args.history,
                    step=args.step,
                    measured=args.measured,
                    earlier_configs=args.earlier,
                    prompt_sd=args.prompt_noise,
                    fresh_prompts=args.fresh_prompts,
                    drift=math.log1p(args.drift),
                    gap=args.gap,
                    floor_weight=args.floor_weight,
                    block_reps=args.block_reps,
                    another_look=args.another_look,
                    transient=args.transient,
                    load_at=args.load_at,
                )  # fmt: skip
                for _ in range(args.trials)
            ]
            kept = sum(k for k, *_ in runs) / len(runs)
            restarts = sum(r for _, r, *_ in runs) / len(runs)
            third = sum(n == 3 for _, _, n, _ in runs) / len(runs)
            sweeps = sum(n for *_, n in runs) / len(runs)
            cells.append(f"{kept:.1%} / {restarts:.1f} / {third:.0%} / {sweeps:.1f}")
        print(f"| {launch_sd:.1%} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
