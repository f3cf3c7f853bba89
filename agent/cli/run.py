"""`optagent run`: plan, research, trial and keep what measurably helps."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from agent.cli.common import (
    ConfigOption,
    check_transcripts_dir,
    confirm,
    console,
    err_console,
    fail,
    fail_locked,
    get_config,
    one_line,
)

SIM_WALL_MINUTES = 15.0
"""Default wall-time budget against the simulated deployment (the README's main command): a first
look at the tool, not an afternoon. The seed's simulated clock runs twice as fast (its figures stay
in simulated seconds), so on a 2-core machine context, baseline and launch spread take ~3 min and a
winning trial ~3 min: research, two or more trials and a kept change fit. A thorough run is
`--max-minutes 60`; against a real server the default is `agent.max_wall_minutes`."""


def compact_bench(bench: object) -> object:
    """The simulated target's default benchmark: levels 1, 8, 64, short outputs, 3 repetitions."""
    return bench.model_copy(update={"concurrency": [1, 8, 64], "output_len": 128, "warmup": 1, "reps": 3})


def budget_minutes(cfg: object, option: float | None, *, simulated: bool) -> float:
    """The run's wall-time budget: --max-minutes, else agent.max_minutes, else the simulated
    default (SIM_WALL_MINUTES) or agent.max_wall_minutes against a real server."""
    if option is not None:
        return option
    if cfg.agent.max_minutes is not None:
        return cfg.agent.max_minutes
    return SIM_WALL_MINUTES if simulated else cfg.agent.max_wall_minutes


def sim_config(config_path: Path | None, out: object = console):
    """The simulated deployment, started if needed (only when no config file is in use)."""
    from sim.host import ensure_up
    from tools.config import DEFAULT_SIM_DIR

    out.print(
        f"no optagent.toml: using the simulated deployment in {DEFAULT_SIM_DIR}/ (starting it if needed)"
    )
    from sim.host import SimHostError
    from sim.scenario import ScenarioError
    from tools.deploy.remote import TransportError
    from tools.deploy.service import ServiceError

    try:
        config = ensure_up(DEFAULT_SIM_DIR)
    except (SimHostError, ScenarioError, ServiceError, TransportError, OSError, ValueError) as e:
        from tools.deploy.serverlog import error_line  # one clear line, not a traceback or an argument dump

        first, said = str(e).split("\n", 1)[0], error_line(str(e))
        fail(
            f"cannot start the simulated deployment in {DEFAULT_SIM_DIR}/: {first}"
            + (f" {said}" if said else "")
        )
    return config.model_copy(update={"bench": compact_bench(config.bench)})


def read_goal_option(text: str, cfg: Any, *, strict: bool = True) -> tuple[Any, Any, str]:
    """The goal read once (`tools.bench.objective.read_goal`, exits 2 with goals that work when it
    names none and `strict`), `cfg` with the benchmark lengths and concurrency levels it asks for,
    and the words that say what was chosen and which of the goal's words chose it."""
    from tools.bench.objective import GoalError, read_goal

    try:
        goal = read_goal(text, strict=strict)
    except GoalError as e:
        fail(str(e), code=2)
    objective = goal.objective
    if objective.kind == "goodput":  # every benchmark of the session is a goodput search
        from tools.bench.goodput import GOODPUT_PROMPTS

        runs = cfg.bench.prompts_per_level or GOODPUT_PROMPTS
        limits = {s.metric: s.max_ms for s in objective.limits}
        cfg = cfg.model_copy(
            update={"bench": cfg.bench.model_copy(update={"goodput_limits": limits, "concurrency": [runs]})}
        )
    said = f"from {objective.words!r}" if objective.words else "the default"
    chosen = f"objective: {objective.description} ({said})"
    if objective.slo is not None:
        where = f" at concurrency {objective.slo.level}" if objective.slo.level else ""
        chosen += f"; limit: {objective.slo.metric} <= {objective.slo.max_ms:g} ms{where}"
    if goal.lengths:
        cfg = cfg.model_copy(update={"bench": cfg.bench.model_copy(update=goal.lengths)})
        lengths = ", ".join(f"{k.replace('_len', '')} {v} tokens" for k, v in goal.lengths.items())
        chosen += f"; benchmark {lengths} (from {goal.length_words!r})"
    cfg, added = with_goal_levels(cfg, objective)
    return cfg, goal, chosen + added


def _interrupted(state_dir: Path) -> str:
    """What an interrupted run left: a trial's candidate rolls itself back before the command
    returns, so the journal says whether anything is still in flight."""
    from tools.deploy.journal import Journal

    try:
        in_flight = Journal(state_dir).read() is not None
    except Exception:  # an unreadable journal: `optagent recover` sorts it out
        in_flight = True
    if in_flight:
        return "interrupted with a change in flight: run `optagent recover` to restore known-good"
    return (
        "interrupted: nothing in flight, the server runs the last known-good configuration "
        "(changes kept before the interrupt stay)"
    )


def with_goal_levels(cfg: Any, objective: Any) -> tuple[Any, str]:
    """`cfg` with the concurrency levels the goal names added to the benchmark's (a goal at a level
    nothing measures could judge no trial), and the words that say so ("" when none was missing)."""
    from tools.bench.objective import unmeasured_levels

    missing = unmeasured_levels(objective, cfg.bench.concurrency)
    if not missing:
        return cfg, ""
    levels = sorted({*cfg.bench.concurrency, *missing})
    cfg = cfg.model_copy(update={"bench": cfg.bench.model_copy(update={"concurrency": levels})})
    return cfg, f"; benchmark adds concurrency {', '.join(map(str, missing))} (the goal names it)"


def run(
    goal: str = typer.Option("improve throughput", "--goal", "-g", help="What to optimize, in plain words."),
    config: Path | None = ConfigOption,
    model: str | None = typer.Option(None, "--model", help="pydantic-ai model name, or 'builtin'."),
    base_url: str | None = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint for the model."),
    max_trials: int | None = typer.Option(None, "--max-trials", help="At most this many trials."),
    max_restarts: int | None = typer.Option(
        None,
        "--max-restarts",
        help="Restarts trials may spend (default: optagent.toml's agent.max_restarts, else one per "
        "playbook lever not set already, at least 8).",
    ),
    max_minutes: float | None = typer.Option(
        None,
        "--max-minutes",
        help=f"Wall-time budget in minutes (default: optagent.toml's agent.max_minutes; "
        f"{SIM_WALL_MINUTES:g} on the simulated deployment).",
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before changing the target."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Plan and research; deploy nothing."),
    allow_lossy: bool = typer.Option(
        False, "--allow-lossy", help="Allow keeping changes that alter outputs."
    ),
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", help="Model tokens the run may spend (default: agent.max_tokens; no limit)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print a JSON summary on stdout (progress goes to stderr)."
    ),
) -> None:
    """Plan, research and trial server flags; keep only what is measurably better.
    \f

    One piece because it is a typer command read top to bottom: the options checked in the order
    they are read, the approval, then one session whose transcript every exit below closes with
    its own status and exit code; most of its length is the option list.
    """
    import asyncio
    import time

    started = time.monotonic()  # the budget's clock: the run's own start-up counts against it
    from agent.policy.models import ModelChoiceError, choose_model
    from agent.prepare import SessionError
    from agent.session import RunOptions, run_session
    from agent.transcripts.transcript import Transcript
    from agent.trial.deadline import BudgetTooSmall
    from agent.ui import RunUI
    from tools.deploy.lock import LockedError
    from tools.deploy.outcome import DeployError, UnitInvalidError
    from tools.redact import redact_text

    if max_trials is not None and max_trials < 0:
        fail("--max-trials must be 0 or more", code=2)
    if max_restarts is not None and max_restarts < 0:
        fail("--max-restarts must be 0 or more", code=2)
    if max_minutes is not None and not max_minutes > 0:
        fail("--max-minutes must be more than 0", code=2)
    if max_tokens is not None and max_tokens < 1:
        fail("--max-tokens must be 1 or more", code=2)
    cfg = get_config(config)
    check_transcripts_dir(cfg)
    if cfg.simulated and config is None:
        cfg = sim_config(config, err_console if as_json else console)
    cfg, read, chosen = read_goal_option(goal, cfg)
    try:
        name, url = choose_model(model, base_url or cfg.agent.base_url, configured=cfg.agent.model)
    except ModelChoiceError as e:
        fail(str(e), code=2)
    if not (yes or dry_run or cfg.simulated):
        server = redact_text(cfg.target.endpoint, secrets=[cfg.target.api_key])  # no URL password
        if not sys.stdin.isatty():
            fail(f"this run changes {server}: pass --yes to allow it (or --dry-run)", code=2)
        if not confirm(f"optagent will restart the server at {server} for trials. Continue?"):
            fail("not confirmed; nothing changed", code=1)
    wall = budget_minutes(cfg, max_minutes, simulated=cfg.simulated and config is None)
    opts = RunOptions(
        goal=read,
        model=name,
        base_url=url,
        max_trials=cfg.agent.max_trials if max_trials is None else max_trials,
        max_restarts=cfg.agent.max_restarts if max_restarts is None else max_restarts,
        max_wall_minutes=wall,
        started=started,
        dry_run=dry_run,
        allow_lossy=allow_lossy or cfg.agent.allow_lossy,
        max_tokens=cfg.agent.max_tokens if max_tokens is None else max_tokens,
    )
    label = name if not url else f"{name} @ {url}"
    transcript = Transcript.create(
        cfg.agent.transcripts_dir, kind="run", goal=goal, model=label, target=cfg.target.endpoint, config=cfg
    )
    out = err_console if as_json else console  # stdout carries the JSON alone
    ui = RunUI(out, transcript)
    ui.record(
        "approval",
        {"yes": yes, "dry_run": dry_run, "allow_lossy": opts.allow_lossy, "simulated": cfg.simulated},
    )
    out.print(escape(f"transcript: {transcript.path}\n{chosen}"), highlight=False)  # goal words: no markup
    ui.record("goal", {"goal": goal, "chosen": chosen})
    try:
        result = asyncio.run(run_session(cfg, opts, ui))
    except ModelChoiceError as e:
        transcript.close({"status": f"bad model: {e}"})
        fail(str(e), code=2)
    except BudgetTooSmall as e:  # stopped before a baseline it had no time for: nothing changed
        transcript.close({"status": f"budget spent: {e}"})
        fail(str(e))
    except SessionError as e:
        transcript.close({"status": f"failed: {e}"})
        fail(one_line(str(e), simulated=cfg.simulated))
    except LockedError as e:  # another optagent works on the target: this run never started
        fail_locked(e, transcript)
    except DeployError as e:  # drift, a unit file that does not parse, a refused deploy: said plainly
        transcript.close({"status": f"failed: {e}"})
        fail(redact_text(str(e)), code=2 if isinstance(e, UnitInvalidError) else 1)
    except KeyboardInterrupt:
        transcript.close({"status": "interrupted"})
        fail(_interrupted(cfg.target.state_dir))
    except Exception as e:
        transcript.close({"status": f"error: {type(e).__name__}: {e}"})
        fail(one_line(f"{type(e).__name__}: {e}", simulated=cfg.simulated))
    decided = [t.headline() for t in result.trials if t.decision == "kept"]  # the decisions' own numbers
    transcript.close(
        {"kept": result.kept, "decided": decided, "status": result.status, "restarts": result.restarts}
    )
    from agent.transcripts.report import end_lines

    kept = "".join(f"\n  {escape(line)}" for line in end_lines(result))  # with your workload's before/after
    out.print(
        f"[bold]done[/] in {result.seconds:.0f} s: {len(result.trials)} trials, {result.restarts} restarts; "
        f"deployed: {', '.join(result.kept) or 'baseline'}{kept}\nreport: {result.report}",
        highlight=False,
    )
    if as_json:
        from agent.transcripts.report import run_summary
        from tools.printable import json_text

        print(json_text(run_summary(result), indent=2))
    if result.failed:
        fail(f"the run did not complete: {result.status}")
