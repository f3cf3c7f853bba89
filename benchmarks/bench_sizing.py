"""Does the sized-lever search find what an exhaustive grid of the same values finds, for fewer trials?

For each sized lever of the playbook (`sizes`) that a scenario can move (its value differs from the
one the simulated server resolved), the ladder is built as a run builds it and every value's true
throughput per level comes from the noise-free model (`bench_agent.noise_free`: the simulator's
scheduler and performance model in virtual time). Then:

- the **grid** tries every value of the ladder once, alone, against the deployment's own value, and
  deploys the best (a grid with perfect numbers: the most it can find);
- the **search** (`agent.policy.sizing.next_size`) starts at the playbook's value and tries what it
  asks for, each trial measured with noise: each level's ratio off by a log-normal error of
  `--sd` (a trial's estimate with a 1% restart spread), kept under the Pareto rule of the default
  goal (a level at least +2% with its interval above 1, none below -3%). A value that cannot start
  is a failed start. Repeated `--runs` times.

Both count trials (each is a launch of the candidate and a relaunch of known-good, the same for
either); the gain is the true objective (geometric mean over levels) of the value deployed at the
end, over the deployment's own.

    python benchmarks/bench_sizing.py [--scenario seed ...] [--runs 200] [--sd 0.01]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_agent import LEVELS, MIN_EFFECT, noise_free, objective  # noqa: E402

from agent.policy.playbook import load_playbook  # noqa: E402
from agent.policy.sizing import Ladder, ladder, next_size  # noqa: E402

SCENARIOS = ["seed", "h100-llama8b", "l40s-llama8b", "h100x2-qwen30b-tp2", "a100x2-mixtral"]
TOLERANCE = 0.03


def resolved(name: str) -> dict:
    """The server args the simulated server reports for the scenario (`/get_server_info`'s top
    level: the command line with what start-up resolved)."""
    from sim.args import parse_launch_args
    from sim.offline import plan_for

    scn, _, plan = plan_for(name)
    args = parse_launch_args(["--model-path", str(scn.model_dir), *scn.launch.flags])
    return {**vars(args), **plan.resolved}


def ladders(name: str) -> list[tuple[str, Ladder, float]]:
    """(flag, ladder, the playbook's value) of each sized lever the scenario can move."""
    info = resolved(name)
    out = []
    for lever in load_playbook():
        if lever.sizes is None:
            continue
        flag = (
            lever.replaced_by.flag
            if lever.replaced_by and lever.flag == "--cuda-graph-max-bs"
            else lever.flag
        )
        dest = flag.lstrip("-").replace("-", "_")
        facts = {"bench.max_concurrency": max(LEVELS)}

        def fill(t: str, facts: dict = facts) -> str:
            return str(facts[t.strip("{}")]) if t.startswith("{") else t

        first = fill(lever.value or "")
        steps = ladder(lever.sizes, first, info.get(dest), fill)
        if steps is None or steps.current is None or float(first) == steps.current:
            continue
        out.append((flag, steps, float(first)))
    return out


def truth(name: str, flag: str, steps: Ladder, values: set[float]) -> dict[float, dict[int, float] | None]:
    """Value -> noise-free output tok/s per level (None: it cannot start)."""
    return {v: noise_free(name, [f"{flag} {steps.show(v)}"]) for v in sorted(values)}


def measure(
    now: dict[int, float], cand: dict[int, float], rng: random.Random, sd: float
) -> tuple[dict, bool]:
    """(per-level measured ratios, kept by the Pareto rule) of one noisy trial."""
    measured = {c: cand[c] / now[c] * math.exp(rng.gauss(0, sd)) for c in LEVELS}
    won = any(r >= 1 + MIN_EFFECT and r * math.exp(-1.96 * sd) > 1 for r in measured.values())
    return measured, won and min(measured.values()) >= 1 - TOLERANCE


def noisy_grid(steps: Ladder, levels, rng: random.Random, sd: float) -> float:  # type: ignore[no-untyped-def]
    """The value a grid deploys when each value is measured once, with noise, against the
    deployment's own: the best measured objective among the values the rule keeps."""
    base, best, top = levels(steps.current), steps.current, 0.0
    for v in steps.values:
        if v == steps.current or (cand := levels(v)) is None:
            continue
        measured, kept = measure(base, cand, rng, sd)
        score = sum(math.log(r) for r in measured.values())
        if kept and score > top:
            best, top = v, score
    return best


def search(steps: Ladder, first: float, levels, rng: random.Random, sd: float) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """(value deployed at the end, trials) of one search with noisy trials."""
    deployed, trials, value = steps.current, [], first
    while value is not None and len(trials) < 12:
        now, cand = levels(deployed), levels(value)
        trial = {"size": value, "kind": "single"}
        if cand is None:
            trial |= {"failed_start": True, "decision": "rolled_back"}
        else:
            measured, kept = measure(now, cand, rng, sd)
            trial |= {
                "judged_ratios": {str(c): r for c, r in measured.items()},
                "decision": "kept" if kept else "rolled_back",
            }
            deployed = value if kept else deployed
        trials.append(trial)
        nxt = next_size(steps, trials, MIN_EFFECT)
        value = nxt[0] if nxt else None
    return deployed, len(trials)


def row(name: str, flag: str, steps: Ladder, first: float, runs: int, sd: float) -> dict:
    memo: dict[float, dict[int, float] | None] = {}

    def levels(v: float) -> dict[int, float] | None:
        if v not in memo:
            memo[v] = noise_free(name, [f"{flag} {steps.show(v)}"]) if v != steps.current else base
        return memo[v]

    base = noise_free(name, [])
    assert base is not None
    grid = [v for v in steps.values if v != steps.current]
    gains = {v: objective(base, lv) - 1 for v in grid if (lv := levels(v)) is not None}
    best = max(gains, key=lambda v: gains[v]) if gains else steps.current
    rng = random.Random(0)
    found, spent, grid_found = [], [], []

    def gain(v: float) -> float:
        return objective(base, levels(v)) - 1 if v != steps.current else 0.0  # type: ignore[arg-type]

    for _ in range(runs):
        final, n = search(steps, first, levels, rng, sd)
        found.append(gain(final))
        spent.append(n)
        grid_found.append(gain(noisy_grid(steps, levels, rng, sd)))
    return {
        "scenario": name, "flag": flag, "current": steps.show(steps.current),  # type: ignore[arg-type]
        "ladder": ", ".join(steps.show(v) for v in steps.values), "grid_best": steps.show(best),
        "grid_gain": max(gains.get(best, 0.0), 0.0), "grid_trials": len(grid), "grid_found": sum(grid_found) / runs,
        "found": sum(found) / runs, "trials": sum(spent) / runs,
        "curve": ", ".join(f"{steps.show(v)}: {g:+.1%}" for v, g in sorted(gains.items())),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", nargs="*", default=SCENARIOS)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument(
        "--sd", type=float, default=0.01, help="log-normal error of one trial's estimate per level"
    )
    a = ap.parse_args()
    print(
        "| scenario | lever | deployed | ladder | best value | its gain | grid gain (noisy) | grid trials "
        "| search gain | search trials |"
    )
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    totals = [0.0, 0.0, 0, 0.0, 0.0]
    for name in a.scenario:
        for flag, steps, first in ladders(name):
            r = row(name, flag, steps, first, a.runs, a.sd)
            print(
                f"| {name} | `{flag}` | {r['current']} | {r['ladder']} | {r['grid_best']} | {r['grid_gain']:+.1%} "
                f"| {r['grid_found']:+.1%} | {r['grid_trials']} | {r['found']:+.1%} | {r['trials']:.1f} |",
                flush=True,
            )
            print(f"<!-- {name} {flag} curve: {r['curve']} -->", file=sys.stderr)
            for i, k in enumerate(("grid_gain", "found", "grid_trials", "trials", "grid_found")):
                totals[i] += r[k]
    print(
        f"\nsummed: best values {totals[0]:+.1%}; grid {totals[4]:+.1%} in {totals[2]} trials; "
        f"search {totals[1]:+.1%} in {totals[3]:.1f} trials"
    )


if __name__ == "__main__":
    main()
