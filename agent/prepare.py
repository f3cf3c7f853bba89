"""What a run and a chat do before planning, in one place (`prepare_session`): the target's
preflight, the deployment's context, the playbook's candidates, the baseline (reference outputs and
repeated sweeps of the running configuration), the trial runner with its restart budget, the
planner's deps and its instructions."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.policy.order import slow_start_flags
from agent.trial.budget import TRIAL_RESTARTS
from agent.trial.deadline import Deadline, repetitions_within
from agent.trial.record import Baseline, lossy_flags, mean_throughput, mechanism_flags
from agent.trial.runner import TrialRunner
from agent.ui import RunUI
from tools.bench.objective import Goal

if TYPE_CHECKING:
    from tools.deploy.deployment import Deployment


class SessionError(Exception):
    """The run cannot proceed (unreachable host, drift, unhealthy server); the message says why."""


@dataclass
class RunOptions:
    """What a session may do: the command line of `optagent run` resolved, or a chat's `[agent]`."""

    goal: Goal
    """The goal, read once where it entered (`tools.bench.objective.read_goal`)."""
    model: str = "builtin"
    base_url: str | None = None
    max_trials: int = 12
    max_restarts: int | None = None
    """None: half of trying each playbook lever alone (`restart_budget`)."""
    max_wall_minutes: float | None = 240.0
    """None: no wall-time budget (a chat ends when the user says so)."""
    started: float | None = None
    """`time.monotonic()` when the command started: the budget's clock counts its start-up too
    (None: from when the session is prepared)."""
    dry_run: bool = False
    allow_lossy: bool = False
    playbook: Path | None = None
    """Another playbook file (default: agent/policy/playbook.toml)."""
    max_tokens: int | None = None
    """Model tokens the run may spend (None: no limit); spent, the run stops cleanly."""


@dataclass
class PreparedSession:
    """What a run or a chat plans on (`prepare_session`)."""

    config: Any
    """The configuration with the benchmark fitted to the deployment (`DeploymentContext.fit_bench`)."""
    deployment: Any
    deps: Any
    """The planner's `PlannerDeps`: the context, the candidates, the runner (None in a dry run)."""
    baseline: Baseline
    """Measured, saved (a chat's `--resume`) or empty until the first trial (a chat)."""
    objective: Any
    models: Any
    instructions: str
    started: float
    phases: list[tuple[str, float]] = field(default_factory=list)
    """(what, seconds) of the preparation: preflight and context, the baseline when measured."""
    bench_s: float = 0.0
    """Seconds the baseline benchmark took (0 when not measured now)."""
    grid: int = 0
    """Playbook levers that apply here (`agent.policy.playbook.grid_size`)."""


@contextlib.asynccontextmanager
async def prepare_session(
    config: Any, opts: RunOptions, ui: RunUI, *, interactive: bool = False, resume: Any = None
) -> AsyncIterator[PreparedSession]:
    """Preflight and context against `config`'s target, the playbook's candidates (less those the
    server's resolved configuration makes pointless), the baseline, the trial runner, the planner's
    deps and its instructions: what `optagent run` and `optagent chat` plan on, prepared the same
    way. The deployment stays open (and locked) until the block ends.

    `interactive` (a chat) changes only what waits, so that the prompt comes at once: the code index
    is loaded before the first research and the baseline measured before the first trial
    (`agent.chat.needs`), or with `resume` (a loaded transcript) the saved one is reused while the
    unit file and the benchmark levels are those it ran on; the instructions get their chat section.

    One piece because every step runs inside the one open (and locked) deployment and transport it
    yields from, in the order the steps are shown (preflight, context, baseline), each feeding the next.
    """
    from agent.context import gather_context
    from agent.policy.models import make_models
    from agent.policy.planner import PlannerDeps
    from agent.policy.playbook import PLAYBOOK_PATH, evaluate, grid_size, load_playbook
    from agent.policy.researcher import build_researcher
    from agent.trial.resolved import drop_pointless
    from prompts import render
    from tools.deploy.deployment import Deployment
    from tools.deploy.remote import make_transport

    deadline = Deadline(opts.max_wall_minutes, started=opts.started or time.monotonic())
    started, prepared = deadline.started, time.monotonic()  # one clock: the budget's and the report's
    models = make_models(opts.model, opts.base_url)
    target = config.target
    ui.step("preflight")
    transport = make_transport(target)
    try:
        async with Deployment(target, on_progress=ui.deploy_progress, pace=True) as deployment:
            await _preflight(ui, deployment, target, will_deploy=not opts.dry_run)
            ui.step("context")
            ctx = await gather_context(
                config, transport, on_step=lambda s: ui.note(f"reading {s}", record=False),
                waiting=ui.waiting, index=not interactive, deadline=deadline,
            )  # fmt: skip
            ui.record("context", {**ctx.summary(), "facts": ctx.facts})
            config = config.model_copy(update={"bench": ctx.fit_bench(config.bench)})
            phases = [
                ("start-up", prepared - started),
                ("preflight and context", time.monotonic() - prepared),
            ]
            _show_context(ui, ctx)
            playbook = load_playbook(opts.playbook or PLAYBOOK_PATH)
            candidates = drop_pointless(evaluate(playbook, ctx.facts, ctx.catalog or None), ctx.resolved_args)
            objective = opts.goal.objective
            text = Path(target.local_unit).read_text()
            saved, bench_s = None, 0.0
            if interactive:
                saved = saved_baseline(resume, text, config.bench) if resume is not None else None
                baseline = saved[0] if saved else Baseline(reps=[], probe=None, text=text)
                ui.note(
                    f"baseline: the saved one, measured {saved[1]} on this unit file" if saved else
                    "baseline: measured before the first trial (not now: the prompt comes at once)",
                    record=False,
                )  # fmt: skip
            else:
                ui.step("baseline")
                baseline, bench_s = await measure_baseline(
                    ui, target.endpoint, config.bench, text, deployment, deadline=deadline
                )
                phases.append(("baseline", bench_s))
                if objective.slo is not None and (broken := objective.slo.broken_by(baseline.reps)):
                    ui.note(
                        f"the baseline breaks the goal's limit: {broken}; where it does, a change is judged "
                        "by the objective alone, and held to the limit wherever known-good meets it"
                    )
            grid = grid_size(playbook, ctx.facts, ctx.catalog or None)
            runner = None
            if not opts.dry_run:
                runner = make_runner(
                    deployment, config, objective, baseline, candidates, ui,
                    allow_lossy=opts.allow_lossy, max_trials=opts.max_trials, deadline=deadline,
                    max_restarts=restart_budget(opts.max_restarts, grid),
                )  # fmt: skip
                if saved:  # another launch, maybe hours ago: the first trial measures known-good anew
                    runner.reference, runner.known_good_blocks = None, []
            deps = PlannerDeps(
                goal=opts.goal,
                ctx=ctx,
                candidates=candidates,
                ui=ui,
                researcher=build_researcher(models.researcher),
                runner=runner,
                baseline_levels=mean_throughput(baseline.reps),
                allow_lossy=opts.allow_lossy,
                max_parallel_research=config.agent.max_parallel_research,
                deadline=deadline,
            )
            instructions = render(
                "planner.md.j2",
                goal=opts.goal.text,
                allow_lossy=opts.allow_lossy,
                max_trials=opts.max_trials,
                dry_run=opts.dry_run,
                context=ctx.summary(),
                objective=str(getattr(objective, "describe", lambda: objective)()),
                baseline=deps.baseline_levels,
                chat=interactive,
            )
            yield PreparedSession(
                config=config, deployment=deployment, deps=deps, baseline=baseline, objective=objective,
                models=models, instructions=instructions, started=started, phases=phases,
                bench_s=bench_s, grid=grid,
            )  # fmt: skip
    finally:
        await transport.close()


def _show_context(ui: RunUI, ctx: Any) -> None:
    """The context in a few lines: version, model, GPUs (or the CPU host), and what could not be read."""
    model = ctx.model.summary() if hasattr(ctx.model, "summary") else ctx.model
    hw = ctx.hardware.summary() if hasattr(ctx.hardware, "summary") else ctx.hardware
    ui.note(
        f"SGLang {ctx.version} ({getattr(ctx.tree, 'origin', 'no source')}), {len(ctx.catalog)} flags",
        record=False,
    )
    ui.note(f"model: {model}", record=False)
    if getattr(ctx, "cpu", None) is not None:  # SGLang's CPU engine: the host is the device
        ui.note(f"CPU: {ctx.cpu.summary()}", record=False)
    else:
        ui.note(f"GPUs: {hw}", record=False)
    for piece, why in ctx.missing.items():
        ui.note(f"[yellow]missing {piece}:[/] {why}")


async def measure_baseline(
    ui: RunUI,
    endpoint: str,
    bench: Any,
    text: str,
    deployment: Any = None,
    *,
    deadline: Deadline | None = None,
) -> tuple[Baseline, float]:
    """Probe reference outputs and repeated sweeps of the running configuration. When the sweeps
    fail and `deployment` is given, a server the load took down is brought back (`_bring_back`).
    With a `deadline`, no repetition starts that the budget cannot hold (`repetitions_within`: it
    raises `BudgetTooSmall`, known-good serving as before)."""
    from tools.bench.loadgen import run_repeated
    from tools.bench.probe import run_probe

    started = time.monotonic()
    probe = await run_probe(endpoint)
    within = None
    if deadline is not None and deadline.minutes is not None:
        within = repetitions_within(deadline, bench, probe.token_seconds(), record=ui.record)
    with ui.progress("baseline benchmark") as progress:
        reps = await run_repeated(endpoint, bench, on_progress=progress, before_rep=within)
    if not reps or any(s.partial for s in reps):
        errors = "; ".join(e for s in reps for e in s.errors) or "no result"
        after = await _bring_back(ui, deployment) if deployment is not None else ""
        raise SessionError(f"the baseline benchmark failed: {errors}{after}")
    levels = mean_throughput(reps)
    ui.note("baseline: " + ", ".join(f"c={c}: {v:,.1f} tok/s" for c, v in levels.items()), record=False)
    if goodputs := [lv.goodput for s in reps for lv in s.levels if lv.goodput is not None]:
        limits = " and ".join(f"{k} <= {v:g} ms" for k, v in bench.goodput_limits.items())
        runs = sum(len(s.rate_curve) for s in reps)
        ui.note(f"baseline goodput: {', '.join(f'{g:.3g}' for g in goodputs)} req/s with {limits} "
                f"(one search a repetition, {runs} rate runs)", record=False)  # fmt: skip
    ui.record(
        "baseline",
        {
            "output_tok_s": levels,
            "sweeps": [_sweep_summary(s) for s in reps],
            # enough to rebuild `Baseline` when a session is resumed (per-request lists left out)
            "reps": [s.model_dump(mode="json", exclude={"levels": {"__all__": {"requests"}}}) for s in reps],
            "probe": probe.model_dump(mode="json") if hasattr(probe, "model_dump") else None,
            "unit_text": text,
        },
    )
    return Baseline(reps=reps, probe=probe, text=text), time.monotonic() - started


async def _bring_back(ui: RunUI, deployment: Any) -> str:
    """What a failed baseline left of the server, as the end of the run's error: nothing when it
    still serves. Otherwise the benchmark's own load took it down (it served when the run began):
    what its log said, and known-good restarted through the deployment's rollback, so that a run
    never leaves the server down."""
    from agent.trial.steps import down_reason, went_down

    said = await down_reason(deployment)
    if said is None:
        return ""
    ui.note("the server went down under the baseline's load: restarting the known-good configuration")
    outcome = await deployment.rollback()
    back = (
        "the known-good configuration was restarted and serves again"
        if outcome.ok
        else f"the known-good configuration could not be brought back: {outcome.error}"
    )
    fix = (
        "leave more memory outside the static pool (a lower --mem-fraction-static) or prefill smaller "
        "chunks (--chunked-prefill-size)"
        if "out of memory" in said.lower()
        else "fix it"
    )
    return (
        f"{went_down(said)}; {back}. A configuration that fails under the benchmark's load is not "
        f"tuned: {fix} first, or measure at lower levels (bench.concurrency)"
    )


def saved_baseline(loaded: Any, text: str, bench: Any) -> tuple[Any, str] | None:
    """The latest baseline a saved session measured, as a `Baseline`, and when (None when it ran
    on another unit file or other benchmark settings, or cannot be read back)."""
    from agent.trial.record import Baseline
    from tools.bench.probe import ProbeResult
    from tools.bench.results import SweepResult

    events = loaded.events_of("baseline")
    if not events:
        return None
    data = events[-1].get("data") or {}
    try:
        reps = [SweepResult.model_validate(r) for r in data.get("reps") or []]
        probe = ProbeResult.model_validate(data["probe"])
    except Exception:
        return None
    levels = {lv.max_concurrency for s in reps for lv in s.levels}
    if data.get("unit_text") != text or not reps or levels != set(bench.concurrency):
        return None
    return Baseline(reps=reps, probe=probe, text=text), _when(reps[-1].finished_at)


def _when(stamp: Any) -> str:
    try:
        ago = time.time() - datetime.fromisoformat(str(stamp)).timestamp()
    except (TypeError, ValueError):
        return "earlier"
    return f"{ago / 60:.0f} min ago" if ago < 5400 else f"{ago / 3600:.1f} h ago"


def _sweep_summary(sweep: Any) -> dict[str, Any]:
    return {
        "seed": sweep.seed,
        "partial": sweep.partial,
        "levels": [lv.model_dump(mode="json", exclude={"requests"}) for lv in sweep.levels],
    }


def restart_budget(given: int | None, grid: int) -> int:
    """The restarts a run may spend: `given`, else half of what a one-at-a-time grid of `grid`
    levers costs (deploy and roll back each: one per lever), at least two trials' worth. The
    relaunches of known-good that measure the launch spread are spent from it too: "half a grid"
    is what the whole run restarts."""
    return given if given is not None else max(grid, 2 * TRIAL_RESTARTS)


def make_runner(
    deployment: Deployment,
    config: Any,
    objective: Any,
    baseline: Baseline,
    candidates: list[Any],
    ui: Any,
    *,
    allow_lossy: bool,
    max_trials: int,
    deadline: Deadline | None = None,
    max_restarts: int | None = None,
) -> TrialRunner:
    """The trial runner of a run or a chat: the playbook's lossy levers marked, every trial recorded,
    `max_restarts` restarts to spend (see `restart_budget`), trials ending by the run's `deadline`
    (none: no wall-time budget)."""
    deadline = deadline or Deadline()
    return TrialRunner(
        deployment=deployment,
        endpoint=config.target.endpoint,
        bench=config.bench,
        objective=objective,
        baseline=baseline,
        allow_lossy=allow_lossy,
        lossy=lossy_flags(candidates),
        mechanisms=mechanism_flags(candidates),
        slow_starts=slow_start_flags(candidates),
        max_trials=max_trials,
        max_restarts=max_restarts,
        deadline=deadline.at,
        closing_seconds=deadline.closing_seconds,
        on_event=lambda kind, data: ui.record(kind, data),
        on_progress=ui.bench_progress,  # a trial's benchmark is shown live, not a stale "waiting" bar
    )


async def _preflight(ui: RunUI, deployment: Any, target: Any, *, will_deploy: bool = True) -> None:
    """Recover an unfinished change, record the target's status, and check the server is healthy;
    when the session `will_deploy`, known-good is established first (`Deployment.known_good`: a
    local unit file edited since the last deploy, or a service not seen running, is refused here,
    before the baseline, not at the first trial)."""
    from tools.deploy.health import wait_healthy
    from tools.redact import redact_text

    if deployment.recovered:
        ui.note(f"[yellow]recovered an unfinished change first:[/] {deployment.recovered}")
        ui.record("deploy", {"recovered": deployment.recovered})
    status = await deployment.status()
    ui.record("deploy", {"preflight": _jsonable(status)})
    if will_deploy:
        await deployment.known_good()
    health = await wait_healthy(target.endpoint, timeout=min(target.health_timeout_s, 120.0))
    shown = redact_text(target.endpoint, secrets=[target.api_key])  # never a URL's password
    if not health.ok:
        raise SessionError(redact_text(f"the server at {shown} is not healthy: {health.reason}"))
    ui.note(f"server healthy at {shown} ({health.reason})")


def _jsonable(obj: Any) -> Any:
    """`obj` as JSON data: a mapping stays one (its repr as text made `transcripts show` print
    Python dict syntax), anything unknown becomes its text."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return _jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if obj is None or isinstance(obj, str | int | float | bool):
        return obj
    return str(obj)
