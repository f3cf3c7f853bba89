"""How much of the oracle does a whole run keep on average? One `bench_agent.py` run per scenario is
one draw: a change of +2.5% is kept about two times in three, so one run says little about the
policy. This replays the trial phase of a real run many times.

From a run's transcript (`optagent run` or `bench_agent.py` on the simulated scenario; by default a
run with no restarts to spend, which gathers the facts and researches, takes ~1-2 min) it takes the
facts, the playbook's candidates and the research verdicts; then, `--runs` times, the builtin
planner's choice of the next trial (`agent.policy.builtin.policy.trial_queue`: expected value per restart, second
looks at near misses) and the agent's own trial code (`TrialRunner`, `PairedTrial`: early stops,
A/B/A, second and third launches, the restart budget) run against simulated launches. A launch's
true output rate per level is the noise-free model (`sim.offline`) of the configuration deployed,
times a log-normal launch factor (the restart spread); each repetition adds its own noise.

By default wall time is not simulated: the restart budget is the only limit. With `--minutes M`
(60: what `bench_agent.py` gives a run) the trial code runs on a simulated clock at the scenario's
time scale in `bench_agent.py` (`Clock`): a launch takes the simulator's start-up (the scenario's
plus what the flags add: torch.compile 120 s, graph capture), a repetition the time its requests take
at the configuration's noise-free rate (on the shared-prefix mix for a trial measured on it), and
the run's set-up (baseline, two more launches for the restart spread, `--research-s` of research)
comes first. The planner then sees what a run's planner sees from its runner: each candidate's
`trial_cost` and the trials the budget fits (`trials_left`), and the value waiting behind a trial.

Prints the mean share of the oracle kept, how often a run reaches 90% of it, restarts, and how
often a flag that changes nothing (noise-free effect below 0.5% at every level) was kept.

    python benchmarks/bench_policy.py [--scenario NAME]... [--transcript T.jsonl] [--runs 200] [--no-second-look]
        [--minutes 60 [--research-s 15]]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import random
import shlex
import shutil
import statistics
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_agent import (  # noqa: E402
    LEVELS,
    OUT_LEN,
    levels_for_flags,
    objective,
    oracle,
    reach,
    run_agent,
    sim_catalog,
    time_scale_for,
    up,
)
from bench_rule_power import simulate_measurements  # noqa: E402

from agent.policy.builtin.policy import trial_queue  # noqa: E402
from agent.policy.order import restart_cost, waiting_value  # noqa: E402
from agent.policy.playbook import evaluate, grid_size, load_playbook  # noqa: E402
from agent.policy.trialgate import trial_result  # noqa: E402
from agent.prepare import restart_budget  # noqa: E402
from agent.transcripts.load import load_transcript  # noqa: E402
from agent.trial import budget, paired, steps  # noqa: E402
from agent.trial import runner as runner_module
from agent.trial.deadline import CLOSING_SECONDS  # noqa: E402
from agent.trial.record import Baseline, BudgetExhausted, TrialChange  # noqa: E402
from agent.trial.runner import TrialRunner  # noqa: E402
from sim import host  # noqa: E402
from sim.scenario import SCENARIO_DIR  # noqa: E402
from tools.bench.objective import objective_from_goal  # noqa: E402
from tools.bench.results import LevelResult, SweepResult  # noqa: E402
from tools.config import BenchConfig  # noqa: E402
from tools.deploy.deployment import DeployOutcome  # noqa: E402

PREFIX = "/usr/bin/python -m sglang.launch_server --model-path /m"


@dataclass
class Clock:
    """Simulated wall seconds (`--minutes`): the trial code reads it as `time.monotonic()`; launches
    and repetitions move it on."""

    now: float = 0.0

    def monotonic(self) -> float:
        return self.now


@dataclass
class Target:
    """The simulated deployment: the configuration running, at its launch's speed factor; with a
    `clock`, launches and repetitions take their simulated time, `scale` wall seconds a simulated one."""

    scenario: str
    rng: random.Random
    launch_sd: float
    rep_sd: float
    good: str = ""
    running: str = ""
    factor: float = 1.0
    restarts: int = 0
    clock: Clock | None = None
    scale: float = 1.0
    mix: bool = False
    """The block under way is measured on the shared-prefix mix (a caching or scheduling flag's trial)."""

    def _launch(self, text: str) -> tuple[bool, float]:
        """(whether it started, wall seconds the launch took)."""
        self.running, self.factor = text, math.exp(self.rng.gauss(0, self.launch_sd))
        self.restarts += 1
        starts = truth(self.scenario, text) is not None
        seconds = start_seconds(self.scenario, text) * self.scale
        if self.clock is not None:
            self.clock.now += seconds
        return starts, seconds

    async def deploy(self, text: str, *, reason: str) -> DeployOutcome:
        started, seconds = self._launch(text)
        if started:
            return DeployOutcome(ok=True, seconds=seconds)
        seconds += self._launch(self.good)[1]
        return DeployOutcome(ok=False, error="the server did not start", rolled_back=True, seconds=seconds)

    async def rollback(self) -> DeployOutcome:
        if self.running == self.good:
            return DeployOutcome(ok=True, changed=False)
        return DeployOutcome(ok=True, seconds=self._launch(self.good)[1])

    async def commit(self) -> None:
        self.good = self.running

    async def keepalive(self) -> bool:
        return True

    def sweep(self, rep: int = 0) -> SweepResult:
        """Repetition `rep` on the running configuration (its seed; the simulated prompts have no
        effect of their own)."""
        levels = truth(self.scenario, self.running) or {}
        out = [
            LevelResult(
                max_concurrency=c,
                num_prompts=8,
                completed=8,
                output_throughput=v * self.factor * math.exp(self.rng.gauss(0, self.rep_sd)),
            )  # fmt: skip
            for c, v in levels.items()
        ]
        clock = self.clock or Clock()  # without one, every repetition is instant
        started = clock.now
        clock.now += rep_seconds(self.scenario, self.running, self.mix) * self.scale if self.clock else 0.0
        stamp = {key: datetime.fromtimestamp(t, UTC).isoformat()
                 for key, t in (("started_at", started), ("finished_at", clock.now))}  # fmt: skip
        return SweepResult(endpoint="http://sim", api="completions", levels=out, seed=rep, **stamp)


@functools.cache
def start_seconds(scenario: str, text: str) -> float:
    """Simulated seconds a launch of the unit `text` takes until healthy (`sim.server`: the
    scenario's start-up plus what its flags add), or until it fails (`sim.server`: 0.6 of it)."""
    from sim.offline import plan_for
    from sim.plan import StartupError

    try:
        scn, _, plan = plan_for(scenario, _flags(text), replace_baseline=True)
    except (StartupError, SystemExit):
        return 0.6 * plan_for(scenario, [])[0].timing.startup_s
    return scn.timing.startup_s + plan.extra_startup_s


@functools.cache
def rep_seconds(scenario: str, text: str, mix: bool) -> float:
    """Simulated seconds of one repetition (a sweep) on the unit `text`: each level's requests
    (`bench_agent.levels_for_flags`: max(2c, 8) of `OUT_LEN` tokens) at its noise-free output rate,
    on the shared-prefix mix when `mix`."""
    levels = levels_for_flags(scenario, _flags(text), "mix" if mix else "random") or {}
    return sum(max(2 * c, 8) * OUT_LEN / v for c, v in levels.items() if v > 0)


def _flags(text: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart=").removeprefix(PREFIX))


_TRUTH: dict[tuple[str, str], dict[int, float] | None] = {}


def truth(scenario: str, text: str) -> dict[int, float] | None:
    """Noise-free output tok/s per level of the unit `text` (None: it does not start)."""
    if (scenario, text) not in _TRUTH:
        _TRUTH[scenario, text] = levels_for_flags(scenario, _flags(text))
    return _TRUTH[scenario, text]


def one_run(
    scenario: str, cands: list[dict], verdicts: dict, unit: str, budget: int, rng: random.Random, args
):  # type: ignore[no-untyped-def]
    """(kept changes, restarts) of one replayed trial phase."""
    clock = Clock() if args.minutes else None
    scale = time_scale_for(scenario, 0.1, 4000.0) if clock else 1.0
    target = Target(scenario, rng, args.launch_sd, args.rep_sd, good=unit, clock=clock, scale=scale)
    target._launch(unit)
    if clock is not None:
        clock.now = 0.0  # the server runs when the command starts
    simulate_measurements(target.sweep)
    inner = steps.measure

    async def measure(endpoint, bench, **kw):  # type: ignore[no-untyped-def]
        target.mix = bench.workload != "random"
        return await inner(endpoint, bench, **kw)

    steps.measure = measure  # type: ignore[assignment]
    bench = BenchConfig(min_effect=args.min_effect)
    runner = TrialRunner(
        deployment=target, endpoint="http://sim", bench=bench, objective=objective_from_goal("improve throughput"),
        baseline=Baseline(reps=[target.sweep() for _ in range(bench.reps)], probe=None, text=unit),
        max_restarts=budget,
        slow_starts={c["flag"]: restart_cost(c) for c in cands if restart_cost(c) > 1},
    )  # fmt: skip
    if clock is not None:
        set_up(runner, target, clock, args)
        cands = [{**c, "trial_cost": runner.trial_cost(c["flag"])} for c in cands]
    target.restarts = 0
    deps = SimpleNamespace(runner=runner, baseline_levels={})
    tried: dict[str, list[dict]] = {}
    slots = runner.trials_left() if clock is not None else None
    while queue := [
        q for q in trial_queue(cands, verdicts, tried, slots) if q[1] == "untried" or args.second_look
    ]:
        c, why = queue[0]
        members = c.get("bundle") or [c]  # a second look at near misses of one level goes as one change
        changes = [TrialChange(flag=m["flag"], value=m["value"], action=m["action"]) for m in members]
        if clock is not None:
            runner.waiting(waiting_value(cands, verdicts, set(tried) | {m["flag"] for m in members}))
        try:
            record = asyncio.run(
                runner.run(changes, reason=why, kind="bundle" if len(members) > 1 else "single")
            )
        except BudgetExhausted:
            break
        result = trial_result(deps, record)  # type: ignore[arg-type]
        slots = result["trials_left"] if clock is not None else None
        for m in members:
            tried.setdefault(m["flag"], []).append({**result, "value": m["value"]})
    return [ch.describe() for ch in runner.kept_changes], target.restarts


def set_up(runner: TrialRunner, target: Target, clock: Clock, args) -> None:  # type: ignore[no-untyped-def]
    """The run before its trials, on the simulated clock: two more launches of known-good and a
    block on each (the restart spread), research and planning (`--research-s`); the budget's end
    where `--minutes` put it, less what the run keeps for its end."""
    for module in (budget, paired, runner_module, steps):
        module.time = clock  # type: ignore[attr-defined]
    for _ in range(2):
        runner.launch_seconds.append(target._launch(target.good)[1])
        for _ in range(runner.bench.reps):
            target.sweep()
    clock.now += args.research_s
    runner.deadline = args.minutes * 60 * target.scale
    runner.closing_seconds = CLOSING_SECONDS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", action="append", help="default: every shipped scenario")
    ap.add_argument("--transcript", help="a run's transcript (.jsonl) on the one --scenario given")
    ap.add_argument(
        "--transcripts", type=Path, help="keep each scenario's research run here as NAME.jsonl and reuse it"
    )
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--launch-sd", type=float, default=0.01, help="true restart spread (relative sd)")
    ap.add_argument("--rep-sd", type=float, default=0.004, help="relative sd of one repetition at a level")
    ap.add_argument(
        "--min-effect", type=float, default=BenchConfig().min_effect, help="the goal's minimum effect"
    )
    ap.add_argument("--max-restarts", type=int, help="default: the run's default budget (half the grid)")
    ap.add_argument(
        "--no-second-look", dest="second_look", action="store_false", help="never try a near miss again"
    )
    ap.add_argument(
        "--minutes",
        type=float,
        help="simulate wall time: the run's budget in simulated minutes (bench_agent: 60)",
    )
    ap.add_argument(
        "--research-s", type=float, default=15.0, help="with --minutes: wall seconds of research and planning"
    )
    args = ap.parse_args()
    names = args.scenario or sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))
    if args.transcript and len(names) != 1:
        ap.error("--transcript needs exactly one --scenario")
    print(
        f"{args.runs} replayed runs a scenario; restart spread {args.launch_sd:.1%}, repetition noise "
        f"{args.rep_sd:.1%}; second looks {'on' if args.second_look else 'off'}"
    )
    print(
        "| scenario | oracle | rule oracle | mean kept, % of oracle | runs >= 90% | rule reach "
        "| median kept, % of reach | median of 3 >= 95% of reach | restarts / budget | runs keeping a no-op |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    details = []
    for name in names:
        tx = load_transcript(
            Path(args.transcript) if args.transcript else research_run(name, args.transcripts)
        )
        row, common = replay(name, tx, args)
        print(row, flush=True)
        details += [f"{name}: {count:.0%} of runs kept {kept}" for kept, count in common]
    print("\nMost frequent outcomes (share of the oracle, set kept):")
    print("\n".join(details))


def research_run(name: str, keep: Path | None) -> Path:
    """A run on the simulated scenario with no restart to spend: context, baseline, research (its
    transcript; kept in and reused from `keep`)."""
    if keep and (keep / f"{name}.jsonl").exists():
        return keep / f"{name}.jsonl"
    tmp = Path(tempfile.mkdtemp(prefix="bench-policy-"))
    config = up(name, tmp, time_scale_for(name, 0.1, 4000.0))
    try:
        result = asyncio.run(run_agent(config, tmp, minutes=30, max_restarts=0))
    finally:
        host.down(tmp / "sim")
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(result.transcript, keep / f"{name}.jsonl")
    return Path(result.transcript)


def replay(name: str, tx, args) -> tuple[str, list[tuple[str, float]]]:  # type: ignore[no-untyped-def]
    """The table row of `args.runs` replays of the trial phase of `tx`'s run, and its most
    frequent outcomes."""
    facts = tx.events_of("context")[0]["data"]["facts"]
    resolved = evaluate(load_playbook(), facts, sim_catalog())
    cands = [
        {"flag": c.flag, "value": c.value, "action": c.action, "status": c.status, "priority": c.lever.priority,
         "lossy": c.lever.lossy, "lossy_allowed": False, "helps": c.lever.helps,
         "restart_cost": getattr(c.lever, "restart_cost", None)}
        for c in resolved
    ]  # fmt: skip
    verdicts = {e["data"]["flag"]: e["data"] for e in tx.events_of("verdict")}
    unit = _unit(name)
    budget = args.max_restarts or restart_budget(None, grid_size(load_playbook(), facts, sim_catalog()))
    base = truth(name, unit)
    best, alone, members = oracle(name, resolved, base)
    reachable = reach(best["rule"][0] - 1, members)
    rng = random.Random(1)
    shares, reached, restarts, noop_runs, sets, noop_flags = [], [], [], 0, Counter(), Counter()
    for _ in range(args.runs):
        kept, n = one_run(name, cands, verdicts, unit, budget, rng, args)
        got = truth(name, _with(unit, resolved, kept)) or base
        share = (objective(base, got) - 1) / (best["all"][0] - 1) if best["all"][0] > 1.005 else 1.0
        shares.append(share)
        reached.append((objective(base, got) - 1) / reachable if reachable > 0 else 1.0)
        restarts.append(n)
        sets[f"{share:.0%} {sorted(kept)}"] += 1
        noops = [
            k for k in kept if (a := alone.get(k)) and all(abs(a[c] / base[c] - 1) < 0.005 for c in LEVELS)
        ]
        noop_runs += bool(noops)
        noop_flags.update(noops)
    n = len(shares)
    p = sum(r >= 0.95 for r in reached) / n  # one run keeps 95% of the reach; the median of three does:
    row = (
        f"| {name} | {best['all'][0] - 1:+.1%} | {best['rule'][0] - 1:+.1%} | {sum(shares) / n:.0%} "
        f"| {sum(s >= 0.9 for s in shares) / n:.0%} | {reachable:+.1%} | {statistics.median(reached):.0%} "
        f"| {p**3 + 3 * p**2 * (1 - p):.0%} | {sum(restarts) / n:.1f} / {budget} | {noop_runs / n:.1%} |"
    )
    common = [(kept, count / n) for kept, count in sets.most_common(3)]
    return row, common + [(f"the no-op {flag}", count / n) for flag, count in noop_flags.items()]


def _unit(scenario: str) -> str:
    from sim.scenario import load_scenario

    return f"[Service]\nExecStart={PREFIX} {shlex.join(load_scenario(scenario).launch.flags)}\n"


def _with(unit: str, resolved: list, kept: list[str]) -> str:
    from agent.trial.record import apply_changes

    by_change = {c.change: c for c in resolved}
    return apply_changes(
        unit,
        [TrialChange(flag=c.flag, value=c.value, action=c.action) for k in kept if (c := by_change.get(k))],
    )


if __name__ == "__main__":
    main()
