"""Does the agent find the real gains? `optagent run` (builtin policy, default playbook, default goal)
on every shipped scenario against the simulated server, compared with the noise-free model.

Per scenario it prints:
- oracle gain: the best noise-free objective (geometric mean of output tok/s over the benchmark's
  levels) of any combination of the playbook's levers for that deployment (exhaustive search on
  `sim.offline`; combinations that cannot start, are lossy, or lose more than the 3% tolerance at a
  level are excluded),
- rule oracle: the same, over combinations in which every lever adds at least the goal's 2%
  minimum effect at some level (the most the Pareto rule can keep, however long a run lasts); a
  lever acting on caching, scheduling or memory is judged on the random/shared-prefix mix its trial
  runs on (what it adds there, and the set within the tolerance there too),
- gain kept: the noise-free objective of the configuration the run left deployed,
- restarts of the run vs a one-at-a-time grid (deploy + rollback of every lever of the playbook
  that exists in this version and is not already set),
- no-op kept: kept flags whose own noise-free effect is below 0.5% at every level,
- wall time;
- rule reach: the rule oracle with each member weighed by the chance one trial keeps a change of
  its margin (what it adds at its best level over the set without it; `KEEP_CHANCE`, from
  `bench_rule_power.py`): what a run can expect of the rule oracle, whatever its budget; each
  member's margin is listed under the table, and where each run's wall time went (its report's
  time line: baseline, launch spread, research and planning, trials with their restarts apart).
`--rows LOG...` prints the tables again from earlier runs' output (their `row:` lines), so runs made
one scenario at a time read as one table.
A second table values the oracle's sets and the kept set as the benchmark's own client measures
them on the simulator with its noise off, at the run's time scale (one launch of 6 repetitions
each): where the offline model and the served simulator disagree (arrival timing, HTTP, the client),
what the deployment actually delivers is the yardstick.
Then a false-keep rate: A/A trials (a flag that changes nothing) with drift injected by a CPU hog
that runs only while the known-good block before the candidate is measured, judged A/B/A (what the
agent does) and unpaired A/B (the candidate vs that block alone).

Each scenario runs at the fastest time scale that keeps its c=64 stream below `--wall-rate` tok/s of
wall time (above ~4,000 the client beside the server on 2 cores compresses differences: the first
runs of this script at 0.2 found 0% of the oracle on the two fastest deployments).

The run measures its own launch spread before its first trial (two relaunches of known-good,
counted in its restarts); each row says the figure, what was tried together and which members were
left out. The A/A trials measure the spread first too (`--aa-declared`: not).

    python benchmarks/bench_agent.py [--scenario NAME|FILE]... [--time-scale 0.1] [--wall-rate 4000] [--aa 30]
        [--aa-only] [--aa-scale S] [--no-live] [--keep DIR]
    python benchmarks/bench_agent.py --rows LOG...
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median

import numpy as np
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.policy.playbook import evaluate, grid_size, load_playbook  # noqa: E402
from sim import host  # noqa: E402
from sim.scenario import SCENARIO_DIR, load_scenario  # noqa: E402

LEVELS = [1, 8, 64]
OUT_LEN = 128
TOLERANCE = 0.03
MIN_EFFECT = 0.02  # the default goal's minimum effect (tools/config.py BenchConfig.min_effect)
ORACLE_DRAWS = 6
"""The noise-free model's value of a configuration is the mean over this many draws of its prompts and
speculative acceptance: one draw of 8-16 requests put `--enable-mixed-chunk` on the seed anywhere
from +0.9% to +3.3% at c=64 (mean +2.0%), so whether the rule oracle held it was a coin flip."""


def fast_scenario(name: str, tmp: Path, changes: list[str] | None = None, quiet: bool = False) -> Path:
    """The scenario (a shipped name or a scenario file) with a 5 s simulated start-up (the time
    scale shortens it further); with `changes`, launched with them; `quiet`: without the
    simulator's run and step noise."""
    scn = load_scenario(name)
    text = re.sub(r"startup_s = [\d.]+", "startup_s = 5", scn.source.read_text())
    # the copy lives elsewhere: its model config by absolute path
    text = re.sub(r'(?m)^config = ".*"$', f"config = {json.dumps(str(scn.model_dir))}", text)
    if changes is not None:
        flags = json.dumps(launch_flags(name, changes))
        text = re.sub(r"(?s)\[launch\]\nflags = \[.*?\]\n", f"[launch]\nflags = {flags}\n", text)
    if quiet:
        text = re.sub(r"(run|step)_sigma = [\d.]+", r"\1_sigma = 0", text)
    path = tmp / f"{Path(name).stem}.toml"
    path.write_text(text)
    return path


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def up(name: str, tmp: Path, scale: float, changes: list[str] | None = None, quiet: bool = False):  # type: ignore[no-untyped-def]
    config = host.ensure_up(
        tmp / "sim", scenario=fast_scenario(name, tmp, changes, quiet), port=free_port(), time_scale=scale
    )
    bench = config.bench.model_copy(
        update={"concurrency": LEVELS, "output_len": OUT_LEN, "warmup": 1, "reps": 3}
    )
    return config.model_copy(
        update={
            "bench": bench,
            # a start takes seconds at these time scales, torch.compile's 120 simulated s the longest:
            # a candidate not healthy by then has failed
            "target": config.target.model_copy(
                update={"max_restarts_per_minute": 100, "health_timeout_s": max(30.0, 180 * scale)}
            ),
            "agent": config.agent.model_copy(update={"transcripts_dir": tmp / "transcripts"}),
        }
    )


def sim_catalog() -> dict[str, object]:
    """The simulated version's flags (deprecated ones marked), so levers resolve as in the run."""
    from types import SimpleNamespace

    table = json.loads((Path(__file__).resolve().parents[1] / "sim" / "flags-0.5.23.json").read_text())
    return {
        name: SimpleNamespace(
            deprecated="deprecated" in (f.get("help") or "").lower(), default=f.get("default")
        )
        for f in table["flags"]
        for name in f["names"]
    }


def launch_flags(name: str, changes: list[str]) -> list[str]:
    """The scenario's baseline flags with `changes` (`--flag value`, `--flag`, `unset --flag`) applied."""
    flags = list(load_scenario(name).launch.flags)
    for ch in changes:
        flag = ch.removeprefix("unset ").split(" ", 1)[0]
        if flag in flags:  # drop the old setting (and its value, when it has one)
            i = flags.index(flag)
            has_value = i + 1 < len(flags) and not flags[i + 1].startswith("--")
            del flags[i : i + 1 + has_value]
        if not ch.startswith("unset "):
            flags += ch.split(" ", 1)
    return flags


def noise_free(name: str, changes: list[str], workload: str = "random") -> dict[int, float] | None:
    """Output tok/s per level of the scenario's baseline with `changes`; None when it cannot start.
    `workload`: "random" (the benchmark's configured prompts) or "mix" (`TRIAL_MIX`, what a trial of a
    flag acting on caching, scheduling or memory is judged on)."""
    return levels_for_flags(name, launch_flags(name, changes), workload)


def bench_settings(workload: str = "random"):  # type: ignore[no-untyped-def]
    """The run's benchmark settings (`up`), on `workload`."""
    from tools.bench.workload import TRIAL_MIX
    from tools.config import BenchConfig

    mix = {"random": "random", "mix": dict(TRIAL_MIX)}[workload]
    return BenchConfig(concurrency=LEVELS, output_len=OUT_LEN, workload=mix)


def levels_for_flags(name: str, flags: list[str], workload: str = "random") -> dict[int, float] | None:
    """Output tok/s per level of the scenario's model and GPUs launched with `flags` (noise-free);
    None when it cannot start; the mean of `ORACLE_DRAWS` draws. On "mix" the client's own prompts
    of that workload are sent (the same radix cache as the served simulator; random prompts share
    nothing, so they are left as the model's plain requests)."""
    from sim.offline import plan_for, throughput_for_plan
    from tools.bench.workload import level_prompts

    settings = bench_settings(workload)
    try:
        scn, model, plan = plan_for(name, flags, replace_baseline=True)
        if plan.hangs_in_warmup:
            return None
        return {
            c: sum(
                throughput_for_plan(
                    scn,
                    model,
                    plan,
                    concurrency=c,
                    output_len=OUT_LEN,
                    requests=max(2 * c, 8),
                    seed=1 + k,
                    prompts=level_prompts(settings, c, seed=k) if workload != "random" else None,
                )
                for k in range(ORACLE_DRAWS)
            )
            / ORACLE_DRAWS
            for c in LEVELS
        }
    except (Exception, SystemExit):  # StartupError, or argparse refusing the flags
        return None


def measured(name: str, changes: list[str], scale: float, reps: int = 6) -> dict[int, float] | None:
    """Output tok/s per level (simulated seconds) that the benchmark's own client measures on the
    simulator launched with `changes`, its noise off, at the run's time scale: the value of a
    configuration as this environment delivers it (the offline model has no HTTP, no client and no
    arrival timing; on the seed, mixed chunked prefill on top of --cuda-graph-max-bs-decode 64
    gains +3.5% at c=64 offline, +1.5-2.5% served).
    None when it does not start."""
    from tools.bench.loadgen import run_repeated

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        try:
            config = up(name, tmp, scale, changes, quiet=True)
        except Exception:  # noqa: BLE001 (cannot start: not a configuration the oracle may count)
            host.down(tmp / "sim")
            return None
        try:
            sweeps = asyncio.run(run_repeated(config.target.endpoint, config.bench, reps=reps))
        finally:
            host.down(tmp / "sim")
    if any(s.partial for s in sweeps):
        return None
    return {c: sum(s.level(c).output_throughput for s in sweeps) / len(sweeps) * scale for c in LEVELS}


def time_scale_for(name: str, fastest: float, wall_rate: float) -> float:
    """The fastest time scale (>= `fastest`, at most real time) at which the scenario's noise-free c=64
    output rate stays below `wall_rate` tok/s of wall time, rounded up to 0.05."""
    rate = (noise_free(name, []) or {}).get(64, 0.0)
    return round(min(1.0, max(fastest, math.ceil(rate / wall_rate / 0.05) * 0.05)), 2)


def objective(base: dict[int, float], now: dict[int, float]) -> float:
    return math.exp(sum(math.log(now[c] / base[c]) for c in LEVELS) / len(LEVELS))


def oracle(
    name: str, candidates: list, base: dict[int, float]
) -> tuple[dict[str, tuple[float, list[str]]], dict, list[dict]]:
    """Best objective over every combination of the playbook's levers (any status but absent from
    the version; lossy ones excluded), and each lever's own levels.

    Two oracles: `all`, any combination; `rule`, combinations in which every lever adds at least
    MIN_EFFECT at some level over the same set without it (what the goal's Pareto rule can keep:
    a lever worth +0.5% is not one a run with a 2% minimum effect may keep, however long it runs).
    A lever acting on caching, scheduling or memory is judged as its trial judges it, on the mix of
    random and shared-prefix prompts (`workload_for`): what it adds is what it adds there, and a set
    holding one must stay within the tolerance on the mix too. The value of a set is on the
    benchmark's random prompts, as the kept set's."""
    from tools.bench.workload import touches_cache

    levers = [c for c in candidates if c.status != "not-in-version" and not c.lever.lossy]
    on_mix = {c.change for c in levers if touches_cache(c.flag, c.lever.mechanism or None)}
    memo: dict[tuple[frozenset, str], dict[int, float] | None] = {}

    def levels(changes: list[str], workload: str = "random") -> dict[int, float] | None:
        key = (frozenset(changes), workload)
        if key not in memo:
            memo[key] = noise_free(name, sorted(key[0]), workload) if key[0] or workload != "random" else base
        return memo[key]

    def within(changes: list[str], got: dict[int, float]) -> bool:
        if any(got[c] < base[c] * (1 - TOLERANCE) for c in LEVELS):
            return False
        if not on_mix & set(changes):
            return True
        mixed, mixed_base = levels(changes, "mix"), levels([], "mix")
        return mixed is not None and all(mixed[c] >= mixed_base[c] * (1 - TOLERANCE) for c in LEVELS)

    def each_adds(changes: list[str]) -> bool:
        for ch in changes:
            workload = "mix" if ch in on_mix else "random"
            got, without = levels(changes, workload), levels([x for x in changes if x != ch], workload)
            if (
                got is None
                or without is None
                or not any(got[lv] >= without[lv] * (1 + MIN_EFFECT) for lv in LEVELS)
            ):
                return False
        return True

    alone = {c.change: levels([c.change]) for c in levers}
    # combinations of the levers that help alone somewhere (one that helps nowhere alone is left out)
    useful = [
        c
        for c in levers
        if (a := alone[c.change]) is not None and any(a[x] > base[x] * 1.001 for x in LEVELS)
    ]
    best: dict[str, tuple[float, list[str]]] = {"all": (1.0, []), "rule": (1.0, [])}
    for k in range(1, len(useful) + 1):
        for combo in itertools.combinations(useful, k):
            changes = [c.change for c in combo]
            got = levels(changes)
            if got is None or not within(changes, got):
                continue
            value = objective(base, got)
            if value > best["all"][0]:
                best["all"] = (value, changes)
            if value > best["rule"][0] and each_adds(changes):
                best["rule"] = (value, changes)
    return best, alone, margins(best["rule"][1], levels, on_mix, base)


def margins(
    rule_set: list[str],
    levels: Callable[..., dict[int, float] | None],
    on_mix: set[str],
    base: dict[int, float],
) -> list[dict]:
    """Per member of the rule oracle: what it adds over the set without it at its best level, on the
    workload its trial runs on (the margin the rule must establish), and its share of the set's
    objective on the benchmark's random prompts (log of the set's value over the set without it)."""
    rows = []
    for ch in rule_set:
        others = [x for x in rule_set if x != ch]
        workload = "mix" if ch in on_mix else "random"
        got, without = levels(rule_set, workload), levels(others, workload)
        level = max(LEVELS, key=lambda c: got[c] / without[c])  # type: ignore[index]
        value, rest = levels(rule_set), levels(others)
        rows.append({
            "change": ch, "level": level, "margin": got[level] / without[level] - 1,  # type: ignore[index]
            "share": math.log(objective(base, value) / objective(base, rest)),  # type: ignore[arg-type]
        })  # fmt: skip
    return rows


KEEP_CHANCE = (
    (0.02, 0.404), (0.025, 0.583), (0.03, 0.769), (0.035, 0.876), (0.04, 0.946),
    (0.05, 0.978), (0.06, 0.983), (0.08, 0.994), (0.12, 0.990),
)  # fmt: skip
"""(true gain at one level, chance one trial keeps it): `python benchmarks/bench_rule_power.py
--measured --history 3 --earlier 2 --where c64 --spreads 0.01 --gains 0.02,0.025,...`, 1000 trials a
cell (±3 points): a run's first trials, three launches of known-good measured, 1% restart spread, the
gain at one level. A lever that adds at several levels does a little better, a restart spread of 2%
worse. Read monotone (the last cells differ by Monte Carlo noise)."""
_GAINS = [g for g, _ in KEEP_CHANCE]
_CHANCES = np.maximum.accumulate([p for _, p in KEEP_CHANCE])


def keep_chance(gain: float) -> float:
    """The chance one trial keeps a change worth `gain` at one level (0 below the minimum effect)."""
    return 0.0 if gain < _GAINS[0] else float(np.interp(gain, _GAINS, _CHANCES))


def reach(rule_oracle: float, members: list[dict]) -> float:
    """The rule oracle as one run's statistics can reach it: each member's share of the set's
    objective weighed by the chance one trial keeps a change of its margin. A yardstick that
    separates what the rule's own power loses (a +2% lever is kept at most half the time, however
    long a run lasts) from what a run lost to its budget, its order or its judging; it assumes every
    member is tried once and alone (a bundle of small ones can do better). A member that costs on
    the random prompts (it earns its place on the mix) has no share: the set's gain is the others'."""
    if rule_oracle <= 0 or not members:
        return 0.0
    shares = [max(m["share"], 0.0) for m in members]
    weights = shares if sum(shares) > 0 else [1.0] * len(members)  # none with a share: all alike
    weighed = sum(w * keep_chance(m["margin"]) for w, m in zip(weights, members, strict=True)) / sum(weights)
    return math.expm1(math.log1p(rule_oracle) * weighed)


async def run_agent(config, tmp: Path, minutes: float, max_restarts: int | None = None):  # type: ignore[no-untyped-def]
    from agent.session import RunOptions, run_session
    from agent.transcripts.transcript import Transcript
    from agent.ui import RunUI
    from tools.bench.objective import read_goal

    transcript = Transcript.create(
        tmp / "transcripts", kind="run", goal="improve throughput", model="builtin", target="sim"
    )
    with open(tmp / "console.txt", "w") as out:
        ui = RunUI(Console(file=out, width=140), transcript)
        try:
            return await run_session(
                config,
                RunOptions(
                    goal=read_goal("improve throughput"), max_wall_minutes=minutes, max_restarts=max_restarts
                ),
                ui,
            )
        finally:
            transcript.close({"status": "bench"})


def scenario_row(
    name: str, scale: float, minutes: float, *, live: bool = True, keep: Path | None = None
) -> dict:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        config = up(name, tmp, scale)
        try:
            started = time.monotonic()
            result = asyncio.run(run_agent(config, tmp, minutes))
            wall = time.monotonic() - started
            facts = _facts(result)
        finally:
            host.down(tmp / "sim")
            if keep is not None:  # the transcript, report and console of the run, for a reviewer
                import shutil

                dest = keep / f"{Path(name).stem}-{int(time.time())}"
                shutil.copytree(tmp / "transcripts", dest, dirs_exist_ok=True)
                shutil.copy(tmp / "console.txt", dest / "console.txt")
    base = noise_free(name, [])
    cands = evaluate(load_playbook(), facts, sim_catalog())
    best, alone, members = oracle(name, cands, base)
    final = noise_free(name, result.kept) or base
    noops = [
        k for k in result.kept if (a := alone.get(k)) and all(abs(a[c] / base[c] - 1) < 0.005 for c in LEVELS)
    ]
    # the grid tries every lever not set already, including those the run rules out by the state
    grid = 2 * grid_size(load_playbook(), facts, sim_catalog())
    sets = {"base": [], "all": best["all"][1], "rule": best["rule"][1], "kept": result.kept}
    live = (
        _measured_gains(name, scale, sets) if live else dict.fromkeys(("live_all", "live_rule", "live_kept"))
    )
    return {**live,
        "scenario": Path(name).stem, "scale": scale, "oracle": best["all"][0] - 1, "oracle_set": best["all"][1],
        "rule_oracle": best["rule"][0] - 1, "rule_set": best["rule"][1], "kept": objective(base, final) - 1,
        "margins": members, "reach": reach(best["rule"][0] - 1, members),
        "kept_set": result.kept, "restarts": result.restarts, "grid": grid, "noops": noops, "wall": wall,
        "status": result.status, "conclusion": result.conclusion,
        "spread": next((m for m in result.measured if m.startswith("launch spread")), ""),
        "time": next((m for m in result.measured if m.startswith("time:")), ""),
        "bundles": [f"{', '.join(c.describe() for c in t.changes)}: {t.decision}" for t in result.trials
                    if t.kind == "bundle"],
        "left_out": [f"{', '.join(c.describe() for c in t.changes)}: {'left out' if t.decision == 'kept' else 'stays'}"
                     for t in result.trials if t.kind == "leave_out"],
    }  # fmt: skip


def _measured_gains(name: str, scale: float, sets: dict[str, list[str]]) -> dict[str, float | None]:
    """`live_<set>`: the objective of each set over the base as the benchmark measures it on the
    quiet simulator (one launch per distinct set)."""
    got: dict[frozenset, dict[int, float] | None] = {}
    for changes in sets.values():
        if frozenset(changes) not in got:
            got[frozenset(changes)] = measured(name, sorted(changes), scale)
    base = got[frozenset()]
    return {
        f"live_{k}": objective(base, v) - 1 if base and (v := got[frozenset(ch)]) else None
        for k, ch in sets.items()
        if k != "base"
    }


def _facts(result) -> dict:  # type: ignore[no-untyped-def]
    from agent.transcripts.load import load_transcript

    tx = load_transcript(result.transcript)
    return tx.events_of("context")[0]["data"]["facts"]


async def aa_trials(config, n: int, *, spread: bool = True) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    """(A/A trials, false keeps by A/B/A, false keeps by unpaired A/B) with drift injected; `spread`:
    the restart spread measured first, as a run does (else the declared one)."""
    from agent.prepare import make_runner
    from agent.trial.record import Baseline, TrialChange
    from agent.trial.spread import measure_spread
    from agent.trial.steps import known_good_block
    from tools.bench.objective import Objective
    from tools.bench.probe import run_probe
    from tools.deploy.deployment import Deployment

    paired = unpaired = 0
    async with Deployment(config.target) as dep:
        text = config.target.local_unit.read_text()
        base = Baseline(reps=[], probe=await run_probe(config.target.endpoint), text=text)
        runner = make_runner(dep, config, Objective(), base, [], _Quiet(), allow_lossy=False, max_trials=n)
        if spread:  # as a run does: known-good relaunched, its spread measured before any trial
            runner.reference = await known_good_block(runner)
            measured = await measure_spread(runner)
            print(f"  {measured.describe()}", flush=True)
        for i in range(n):
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                runner.reference = None
                await known_good_block(runner)  # measured while the machine is loaded
            finally:
                hog.kill()
                hog.wait()
            change = TrialChange(flag="--num-continuous-decode-steps", value=str(2 + i % 2))
            record = await runner.run([change], reason="A/A")
            paired += record.decision == "kept"
            if record.decision == "kept":  # undo: the next A/A starts from the same baseline
                runner.best = None
                await dep.deploy(text, reason="undo A/A keep")
                await dep.commit()
            unpaired += _unpaired_keep(record)
            aside = "; loaded block set aside" if "before_set_aside" in record.blocks else ""
            print(f"  A/A {i + 1}: {record.decision}{aside}; {record.why[:160]}", flush=True)
    return n, paired, unpaired


def _unpaired_keep(record) -> bool:  # type: ignore[no-untyped-def]
    """Would the candidate's block against the loaded block alone (A/B) have been called improved?"""
    cmp = record.comparison or {}
    return (cmp.get("ab_only") or cmp).get("verdict") == "improved"


class _Quiet:
    """The runner's UI hooks, silent."""

    bench_progress = None

    def record(self, *a: object) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--scenario", action="append", help="a shipped name or a scenario file (default: every shipped one)"
    )
    ap.add_argument("--time-scale", type=float, default=0.1, help="the fastest time scale a run may use")
    ap.add_argument(
        "--max-minutes", type=float, default=6.0, help="the agent's wall-time budget per run at --time-scale"
    )
    ap.add_argument(
        "--wall-rate",
        type=float,
        default=4000.0,
        help="slow a scenario down until its noise-free c=64 output stays below this many tok/s of wall "
        "time (the client beside the server compresses differences above it); the budget grows in "
        "proportion, so every run gets the same simulated minutes",
    )
    ap.add_argument("--aa", type=int, default=30, help="A/A trials with injected drift (0: skip)")
    ap.add_argument(
        "--aa-scale",
        type=float,
        default=None,
        help="the A/A trials' time scale (default: the seed's for --wall-rate)",
    )
    ap.add_argument(
        "--aa-declared", action="store_true", help="A/A with the declared spread (no measurement)"
    )
    ap.add_argument("--aa-only", action="store_true", help="only the A/A trials")
    ap.add_argument("--keep", type=Path, help="copy each run's transcript, report and console here")
    ap.add_argument(
        "--no-live",
        action="store_true",
        help="skip valuing the sets on the quiet simulator (the second table)",
    )
    ap.add_argument(
        "--rows",
        type=Path,
        nargs="+",
        help="print the tables of earlier runs' output (their row lines) and stop",
    )
    args = ap.parse_args()
    if args.rows:
        print_tables(rows_of(args.rows))
        return
    names = [] if args.aa_only else args.scenario or sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))
    rows = []
    for name in names:
        print(f"running {name} ...", flush=True)
        scale = time_scale_for(name, args.time_scale, args.wall_rate)
        rows.append(
            scenario_row(
                name, scale, args.max_minutes * scale / args.time_scale, live=not args.no_live, keep=args.keep
            )
        )
        r = rows[-1]
        print(
            f"  kept {r['kept_set']} ({r['status']}); oracle {r['oracle_set']}; rule oracle {r['rule_set']}",
            flush=True,
        )
        print(f"  rule oracle members: {describe_margins(r['margins']) or 'none'}", flush=True)
        print("  " + r["conclusion"].replace("\n", "\n  "), flush=True)
        print(f"  row: {json.dumps({k: v for k, v in r.items() if k != 'conclusion'})}", flush=True)
    print(
        f"\nbudget {args.max_minutes / args.time_scale:g} simulated min a run, levels {LEVELS}, 3 reps a "
        "baseline block (a trial's start at 2 where the restart spread dominates: each run's launch-spread line)"
    )
    print_tables(rows)
    if args.aa:
        with tempfile.TemporaryDirectory() as d:
            # sim.host's sync functions (up, down) run outside the event loop
            scale = args.aa_scale or time_scale_for("seed", args.time_scale, args.wall_rate)
            config = up("seed", Path(d), scale)
            try:
                n, paired, unpaired = asyncio.run(aa_trials(config, args.aa, spread=not args.aa_declared))
            finally:
                host.down(Path(d) / "sim")
        print(
            f"\nA/A with injected drift: {n} trials; false keeps A/B/A: {paired}/{n}; unpaired A/B: {unpaired}/{n}"
        )


def print_tables(rows: list[dict]) -> None:
    """The scenario table, each row's rule-oracle members, and the sets served live (when measured)."""
    print(
        "| scenario | time scale | oracle gain | rule oracle | rule reach | gain kept | % of oracle "
        "| % of rule oracle | % of reach | restarts | grid restarts | no-op kept | wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        print(
            f"| {r['scenario']} | {r['scale']:g} | {r['oracle'] * 100:+.1f}% | {r['rule_oracle'] * 100:+.1f}% | "
            f"{pct(r.get('reach'))} | {r['kept'] * 100:+.1f}% | {share(r['kept'], r['oracle'])} | "
            f"{share(r['kept'], r['rule_oracle'])} | {share(r['kept'], r.get('reach', 0.0))} | {r['restarts']} | "
            f"{r['grid']} | {', '.join(r['noops']) or 'none'} | {r['wall']:.0f} |"
        )
    print_medians(rows)
    print(
        "\nWhat each member of the rule oracle adds at its best level (the chance one trial keeps that much):"
    )
    for r in rows:
        print(f"- {r['scenario']}: {describe_margins(r.get('margins', [])) or 'no lever (or not recorded)'}")
    if any(r.get("time") for r in rows):
        print("\nWhere each run's wall time went (the report's time line):")
        for r in rows:
            print(f"- {r['scenario']}: {r.get('time') or 'not recorded'}")
    if all(r.get("live_kept") is None for r in rows):
        return
    print(
        "\nThe same sets served live (quiet simulator: no run or step noise; the benchmark's client; "
        "6 repetitions of one launch each):"
    )
    print("| scenario | oracle set | rule oracle set | kept set | % of oracle | % of rule oracle |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        o, ro, k = r["live_all"], r["live_rule"], r["live_kept"]
        print(
            f"| {r['scenario']} | {pct(o)} | {pct(ro)} | {pct(k)} | {share(k, o) if None not in (k, o) else '-'} "
            f"| {share(k, ro) if None not in (k, ro) else '-'} |"
        )


def print_medians(rows: list[dict]) -> None:
    """Where a scenario ran more than once: the median of its runs (kept gain, % of the rule reach,
    restarts, wall time), each run's % of reach, and the sums over scenarios of the median kept
    against the rule oracle and the rule reach (the issue's measure: every scenario's median
    >= 95% of its reach, the sum >= 100%)."""
    runs: dict[str, list[dict]] = {}
    for r in rows:
        runs.setdefault(r["scenario"], []).append(r)
    if all(len(v) < 2 for v in runs.values()):
        return
    print("\nMedian of each scenario's runs:")
    print(
        "| scenario | runs | oracle gain | rule oracle | rule reach | median kept | % of reach (each run) "
        "| median restarts / grid | no-op kept | median wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---:|---|---:|")
    total = {"oracle": 0.0, "rule": 0.0, "reach": 0.0, "kept": 0.0, "restarts": 0.0, "grid": 0.0}
    for name, rs in runs.items():
        first = rs[0]
        kept = median(r["kept"] for r in rs)
        reach = first.get("reach", 0.0)
        each = ", ".join(share(r["kept"], reach) for r in rs)
        restarts = median(r["restarts"] for r in rs)
        noops = sorted({n for r in rs for n in r["noops"]})
        print(
            f"| {name} | {len(rs)} | {first['oracle'] * 100:+.1f}% | {first['rule_oracle'] * 100:+.1f}% | "
            f"{pct(reach)} | {kept * 100:+.1f}% | {share(kept, reach)} ({each}) | {restarts:g} / {first['grid']} "
            f"| {', '.join(noops) or 'none'} | {median(r['wall'] for r in rs):.0f} |"
        )
        for key, value in (("oracle", first["oracle"]), ("rule", first["rule_oracle"]), ("reach", reach)):
            total[key] += value
        total["kept"] += kept
        total["restarts"] += restarts
        total["grid"] += first["grid"]
    print(
        f"Summed: median kept {total['kept'] * 100:+.1f}% of a raw oracle {total['oracle'] * 100:+.1f}% "
        f"({share(total['kept'], total['oracle'])}), a rule oracle {total['rule'] * 100:+.1f}% "
        f"({share(total['kept'], total['rule'])}) and a rule reach {total['reach'] * 100:+.1f}% "
        f"({share(total['kept'], total['reach'])}); restarts {total['restarts']:g} of the grids' "
        f"{total['grid']:g} ({total['restarts'] / max(total['grid'], 1):.2f}x)"
    )


def pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:+.1f}%"


def share(got: float, best: float) -> str:
    return f"{got / best * 100:.0f}%" if best > 0.005 else "-"


def describe_margins(members: list[dict]) -> str:
    return ", ".join(
        f"{m['change']} {m['margin'] * 100:+.1f}% at c={m['level']} ({keep_chance(m['margin']):.0%})"
        for m in members
    )


def rows_of(logs: list[Path]) -> list[dict]:
    """The rows that earlier runs of this script printed (`row: {...}` lines)."""
    return [
        json.loads(line.split("row:", 1)[1])
        for log in logs
        for line in log.read_text().splitlines()
        if line.strip().startswith("row:")
    ]


if __name__ == "__main__":
    main()
