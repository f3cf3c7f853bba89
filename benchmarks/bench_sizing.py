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
    python benchmarks/bench_sizing.py --real max-running-requests [stream-interval ...] [--reps 2]

With `--real` the curve is the real SGLang 0.5.23 server's on this machine's CPU (`optagent sim up
--real` sets it up): each value of the ladder launched once and swept `--reps` times at the real
deployment's levels; the searches then run on that measured curve.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_agent import LEVELS, MIN_EFFECT, noise_free, sim_catalog  # noqa: E402

from agent.policy.playbook import evaluate, load_playbook  # noqa: E402
from agent.policy.sizing import Ladder, next_size  # noqa: E402
from tools.config import BenchConfig  # noqa: E402

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


def ladders(info: dict, top: int) -> list[tuple[str, Ladder, float]]:
    """(flag, ladder, the playbook's value) of each sized lever the resolved server args `info`
    leave room to move (`top`: the highest concurrency of the traffic), as a run's playbook
    resolves them on SGLang 0.5.23's catalog."""
    facts = {"bench.max_concurrency": top, **{f"server.{k}": v for k, v in info.items()}}
    out = []
    for c in evaluate(load_playbook(), facts, sim_catalog()):
        steps = c.ladder
        if c.status == "not-in-version" or steps is None or steps.current is None:
            continue
        if float(c.value) != steps.current:  # type: ignore[arg-type]
            out.append((c.flag, steps, float(c.value)))  # type: ignore[arg-type]
    return out


def measure(
    now: dict[int, float], cand: dict[int, float], rng: random.Random, sd: float
) -> tuple[dict, bool]:
    """(per-level measured ratios, kept by the Pareto rule) of one noisy trial."""
    measured = {c: cand[c] / now[c] * math.exp(rng.gauss(0, sd)) for c in now}
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
        nxt = next_size(steps, trials, MIN_EFFECT, TOLERANCE)
        value = nxt[0] if nxt else None
    return deployed, len(trials)


def gain_of(base: dict[int, float], now: dict[int, float]) -> float:
    """The objective's gain: the geometric mean over the levels of the ratio to `base`."""
    return math.exp(sum(math.log(now[c] / base[c]) for c in base) / len(base)) - 1


def row(flag: str, steps: Ladder, first: float, levels, runs: int, sd: float) -> dict:  # type: ignore[no-untyped-def]
    """The grid and the searches of one lever; `levels(value)`: output tok/s per level (None: it
    cannot start)."""
    base = levels(steps.current)
    grid = [v for v in steps.values if v != steps.current]
    gains = {v: gain_of(base, lv) for v in grid if (lv := levels(v)) is not None}
    best = max(gains, key=lambda v: gains[v]) if gains else steps.current
    rng = random.Random(0)
    found, spent, grid_found = [], [], []

    def gain(v: float) -> float:
        return gains.get(v, 0.0) if v != steps.current else 0.0

    for _ in range(runs):
        final, n = search(steps, first, levels, rng, sd)
        found.append(gain(final))
        spent.append(n)
        grid_found.append(gain(noisy_grid(steps, levels, rng, sd)))
    return {
        "flag": flag, "current": steps.show(steps.current),  # type: ignore[arg-type]
        "ladder": ", ".join(steps.show(v) for v in steps.values), "grid_best": steps.show(best),
        "grid_gain": max(gains.get(best, 0.0), 0.0), "grid_trials": len(grid), "grid_found": sum(grid_found) / runs,
        "found": sum(found) / runs, "trials": sum(spent) / runs,
        "curve": ", ".join(f"{steps.show(v)}: {g:+.1%}" for v, g in sorted(gains.items())),
    }  # fmt: skip


def simulated(name: str, runs: int, sd: float) -> list[dict]:
    """The rows of one shipped scenario, on the noise-free model."""
    from sim.args import parse_launch_args
    from sim.offline import plan_for

    scn, _, plan = plan_for(name)
    args = parse_launch_args(["--model-path", str(scn.model_dir), *scn.launch.flags])
    info = {**vars(args), **plan.resolved}  # `/get_server_info`'s top level
    rows = []
    for flag, steps, first in ladders(info, max(LEVELS)):
        memo: dict[float, dict[int, float] | None] = {}

        def levels(v: float, flag: str = flag, steps: Ladder = steps, memo: dict = memo) -> dict | None:
            if v not in memo:
                memo[v] = noise_free(name, [] if v == steps.current else [f"{flag} {steps.show(v)}"])
            return memo[v]

        rows.append({"scenario": name, **row(flag, steps, first, levels, runs, sd)})
    return rows


def real(levers: list[str], runs: int, sd: float, reps: int) -> list[dict]:
    """The rows of the real SGLang server on this machine's CPU (`optagent sim up --real`'s
    deployment): every value of each lever's ladder launched once and measured `reps` times (the
    mean per level is its curve), then searched on that curve as on the simulator's."""
    from sim.real import layout
    from sim.real.environment import ensure_environment

    env = ensure_environment()
    settings = BenchConfig(**{**layout.BENCH, "reps": reps})
    top = max(settings.concurrency)
    base_flags = [*layout.CPU_FLAGS, *layout.PRODUCTION_FLAGS]
    info, base = _launch_and_measure(env, base_flags, settings)
    rows = []
    for flag, steps, first in ladders(info, top):
        if flag not in levers:
            continue
        memo: dict[float, dict[int, float] | None] = {steps.current: base}  # type: ignore[dict-item]

        def levels(v: float, flag: str = flag, steps: Ladder = steps, memo: dict = memo) -> dict | None:
            if v not in memo:
                memo[v] = _launch_and_measure(env, _with(base_flags, flag, steps.show(v)), settings)[1]
            return memo[v]

        for v in steps.values:  # the grid's launches, measured once each
            print(f"<!-- real {flag} {steps.show(v)}: {levels(v)} -->", file=sys.stderr, flush=True)
        rows.append({"scenario": "real CPU server", **row(flag, steps, first, levels, runs, sd)})
    return rows


def _with(flags: list[str], flag: str, value: str) -> list[str]:
    """`flags` with `flag` set to `value` (replaced where set, else added)."""
    out = list(flags)
    if flag in out:
        out[out.index(flag) + 1] = value
        return out
    return [*out, flag, value]


def _launch_and_measure(env, flags: list[str], settings: BenchConfig) -> tuple[dict, dict | None]:  # type: ignore[no-untyped-def]
    """(its server args, mean output tok/s per level) of one launch of the real server with `flags`;
    the levels are None when it did not become healthy."""
    import asyncio
    import os
    import subprocess
    import time

    import httpx

    from sim.host import pick_port
    from sim.real import layout
    from tools.bench.loadgen import run_sweep

    port = pick_port(None)
    argv = [str(env.python), "-m", "sglang.launch_server", "--model-path", str(env.model_dir), *flags]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        argv, env={**os.environ, **layout.ENVIRONMENT}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(endpoint + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            return {}, None
        reps = [asyncio.run(run_sweep(endpoint, settings, seed=r)) for r in range(settings.reps)]
        info = reps[0].server_info or {}
        per_level = {
            c: math.exp(sum(math.log(s.level(c).output_throughput) for s in reps) / len(reps))
            for c in settings.concurrency
        }
        return info, per_level
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", nargs="*", default=SCENARIOS)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument(
        "--sd", type=float, default=0.01, help="log-normal error of one trial's estimate per level"
    )
    ap.add_argument(
        "--real", nargs="+", metavar="FLAG",
        help="on the real SGLang server on this machine's CPU instead: these levers, without dashes (each value a launch)",
    )  # fmt: skip
    ap.add_argument("--reps", type=int, default=2, help="with --real: repetitions of each launch's sweep")
    a = ap.parse_args()
    print(
        "| scenario | lever | deployed | ladder | best value | its gain | grid gain (noisy) | grid trials "
        "| search gain | search trials |"
    )
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    totals = [0.0, 0.0, 0, 0.0, 0.0]
    rows = real(["--" + f.lstrip("-") for f in a.real], a.runs, a.sd, a.reps) if a.real else []
    for name in [] if a.real else a.scenario:
        rows += simulated(name, a.runs, a.sd)
    for r in rows:
        print(
            f"| {r['scenario']} | `{r['flag']}` | {r['current']} | {r['ladder']} | {r['grid_best']} "
            f"| {r['grid_gain']:+.1%} | {r['grid_found']:+.1%} | {r['grid_trials']} | {r['found']:+.1%} "
            f"| {r['trials']:.1f} |",
            flush=True,
        )
        print(f"<!-- {r['scenario']} {r['flag']} curve: {r['curve']} -->", file=sys.stderr)
        for i, k in enumerate(("grid_gain", "found", "grid_trials", "trials", "grid_found")):
            totals[i] += r[k]
    print(
        f"\nsummed: best values {totals[0]:+.1%}; grid {totals[4]:+.1%} in {totals[2]} trials; "
        f"search {totals[1]:+.1%} in {totals[3]:.1f} trials"
    )


if __name__ == "__main__":
    main()
