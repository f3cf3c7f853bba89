"""How much of the oracle does a whole run keep on average? One `bench_agent.py` run per scenario is
one draw: a change of +2.5% is kept about two times in three, so one run says little about the
policy. This replays the trial phase of a real run many times.

From a run's transcript (`optagent run` or `bench_agent.py` on a simulated scenario) it takes the
facts, the playbook's candidates and the research verdicts; then, `--runs` times, the builtin
planner's choice of the next trial (`agent.builtin.trial_queue`: expected value per restart, second
looks at near misses) and the agent's own trial code (`TrialRunner`, `run_paired`: early stops,
A/B/A, second and third launches, the restart budget) run against simulated launches. A launch's
true output rate per level is the noise-free model (`sim.offline`) of the configuration deployed,
times a log-normal launch factor (the restart spread); each repetition adds its own noise. Wall
time is not simulated: the restart budget is the only limit (as in `optagent run`'s default).

Prints the mean share of the oracle kept, how often a run reaches 90% of it, restarts, and how
often a flag that changes nothing (noise-free effect below 0.5% at every level) was kept.

    python benchmarks/bench_policy.py --transcript T.jsonl --scenario NAME [--runs 200] [--no-second-look]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import shlex
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_agent import LEVELS, levels_for_flags, objective, oracle, sim_catalog  # noqa: E402

import agent.paired_trial as pt  # noqa: E402
from agent.builtin import trial_queue  # noqa: E402
from agent.playbook import evaluate, grid_size, load_playbook  # noqa: E402
from agent.session import restart_budget  # noqa: E402
from agent.transcript import load_transcript  # noqa: E402
from agent.trial import Baseline, BudgetExhausted, TrialChange, TrialRunner  # noqa: E402
from tools.bench.objective import objective_from_goal  # noqa: E402
from tools.bench.results import LevelResult, SweepResult  # noqa: E402
from tools.config import BenchConfig  # noqa: E402
from tools.deploy import DeployOutcome  # noqa: E402

PREFIX = "/usr/bin/python -m sglang.launch_server --model-path /m"


@dataclass
class Target:
    """The simulated deployment: the configuration running, at its launch's speed factor."""

    scenario: str
    rng: random.Random
    launch_sd: float
    rep_sd: float
    good: str = ""
    running: str = ""
    factor: float = 1.0
    restarts: int = 0

    def _launch(self, text: str) -> bool:
        self.running, self.factor = text, math.exp(self.rng.gauss(0, self.launch_sd))
        self.restarts += 1
        return truth(self.scenario, text) is not None

    async def deploy(self, text: str, *, reason: str) -> DeployOutcome:
        if self._launch(text):
            return DeployOutcome(ok=True)
        self._launch(self.good)
        return DeployOutcome(ok=False, error="the server did not start", rolled_back=True)

    async def rollback(self) -> DeployOutcome:
        if self.running == self.good:
            return DeployOutcome(ok=True, changed=False)
        self._launch(self.good)
        return DeployOutcome(ok=True)

    async def commit(self) -> None:
        self.good = self.running

    async def keepalive(self) -> bool:
        return True

    def sweep(self) -> SweepResult:
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
        return SweepResult(endpoint="http://sim", api="completions", levels=out)


_TRUTH: dict[tuple[str, str], dict[int, float] | None] = {}


def truth(scenario: str, text: str) -> dict[int, float] | None:
    """Noise-free output tok/s per level of the unit `text` (None: it does not start)."""
    if (scenario, text) not in _TRUTH:
        line = next(x for x in text.splitlines() if x.startswith("ExecStart="))
        flags = shlex.split(line.removeprefix("ExecStart=").removeprefix(PREFIX))
        _TRUTH[scenario, text] = levels_for_flags(scenario, flags)
    return _TRUTH[scenario, text]


def one_run(
    scenario: str, cands: list[dict], verdicts: dict, unit: str, budget: int, rng: random.Random, args
):  # type: ignore[no-untyped-def]
    """(kept changes, restarts) of one replayed trial phase."""
    target = Target(scenario, rng, args.launch_sd, args.rep_sd, good=unit)
    target._launch(unit)

    async def measure(endpoint: str, bench: BenchConfig, *, more=None, max_reps: int, on_progress=None):  # type: ignore[no-untyped-def]
        reps = [target.sweep() for _ in range(bench.reps)]
        while more is not None and len(reps) < max_reps and more(reps):
            reps.append(target.sweep())
        return reps

    async def nothing(*a: object) -> None:
        return None

    pt.measure, pt._warm, pt._probe_ok = measure, nothing, nothing  # type: ignore[assignment]
    bench = BenchConfig()
    runner = TrialRunner(
        deployment=target, endpoint="http://sim", bench=bench, objective=objective_from_goal("improve throughput"),
        baseline=Baseline(reps=[target.sweep() for _ in range(bench.reps)], probe=None, text=unit),
        max_restarts=budget,
    )  # fmt: skip
    target.restarts = 0
    tried: dict[str, list[dict]] = {}
    while queue := [q for q in trial_queue(cands, verdicts, tried) if q[1] == "untried" or args.second_look]:
        c, why = queue[0]
        try:
            record = asyncio.run(
                runner.run([TrialChange(flag=c["flag"], value=c["value"], action=c["action"])], reason=why)
            )
        except BudgetExhausted:
            break
        tried.setdefault(c["flag"], []).append({"near_miss": record.near_miss, "decision": record.decision})
    return [ch.describe() for ch in runner.kept_changes], target.restarts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transcript", required=True, help="a run's transcript (.jsonl) on that scenario")
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--launch-sd", type=float, default=0.01, help="true restart spread (relative sd)")
    ap.add_argument("--rep-sd", type=float, default=0.004, help="relative sd of one repetition at a level")
    ap.add_argument("--max-restarts", type=int, help="default: the run's default budget (half the grid)")
    ap.add_argument(
        "--no-second-look", dest="second_look", action="store_false", help="never try a near miss again"
    )
    args = ap.parse_args()
    tx = load_transcript(Path(args.transcript))
    facts = tx.events_of("context")[0]["data"]["facts"]
    resolved = evaluate(load_playbook(), facts, sim_catalog())
    cands = [
        {"flag": c.flag, "value": c.value, "action": c.action, "status": c.status, "priority": c.lever.priority,
         "lossy": c.lever.lossy, "lossy_allowed": False, "helps": c.lever.helps}
        for c in resolved
    ]  # fmt: skip
    verdicts = {e["data"]["flag"]: e["data"] for e in tx.events_of("verdict")}
    unit = _unit(args.scenario)
    budget = args.max_restarts or restart_budget(None, grid_size(load_playbook(), facts, sim_catalog()))
    base = truth(args.scenario, unit)
    best, alone = oracle(args.scenario, resolved, base)
    rng = random.Random(1)
    shares, restarts, noop_runs, sets = [], [], 0, Counter()
    for _ in range(args.runs):
        kept, n = one_run(args.scenario, cands, verdicts, unit, budget, rng, args)
        got = truth(args.scenario, _with(unit, resolved, kept)) or base
        shares.append((objective(base, got) - 1) / (best["all"][0] - 1))
        restarts.append(n)
        sets[f"{shares[-1]:.0%} {sorted(kept)}"] += 1
        noop_runs += any(
            (a := alone.get(k)) and all(abs(a[c] / base[c] - 1) < 0.005 for c in LEVELS) for k in kept
        )
    n = len(shares)
    print(
        f"{args.scenario}: oracle {best['all'][0] - 1:+.1%} {best['all'][1]}, rule oracle {best['rule'][0] - 1:+.1%}; "
        f"{n} runs, budget {budget} restarts{' (no second look)' if not args.second_look else ''}"
    )
    print(
        f"  kept {sum(shares) / n:.0%} of the oracle on average; >= 90% in {sum(s >= 0.9 for s in shares) / n:.0%} "
        f"of runs; restarts {sum(restarts) / n:.1f}; runs that kept a no-op {noop_runs / n:.1%}"
    )

    for kept, count in sets.most_common(4):
        print(f"  {count / n:4.0%} of runs kept {kept}")


def _unit(scenario: str) -> str:
    from sim.scenario import load_scenario

    return f"[Service]\nExecStart={PREFIX} {shlex.join(load_scenario(scenario).launch.flags)}\n"


def _with(unit: str, resolved: list, kept: list[str]) -> str:
    from agent.trial import apply_changes

    by_change = {c.change: c for c in resolved}
    return apply_changes(
        unit,
        [TrialChange(flag=c.flag, value=c.value, action=c.action) for k in kept if (c := by_change.get(k))],
    )


if __name__ == "__main__":
    main()
