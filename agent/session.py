"""`optagent run` as a session: preflight, context, baseline, planning and trials, final state, report.

Every step is printed and saved to the transcript as it happens. However the session ends (the
planner fails, the budget runs out, a bug), the target is left on its best measured configuration:
the trial runner never leaves a candidate in flight, and a final `rollback()` is a no-op otherwise.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.prepare import RunOptions, prepare_session
from agent.trial.record import Baseline, mean_throughput
from agent.trial.runner import TrialRunner
from agent.ui import RunUI

if TYPE_CHECKING:
    from agent.policy.planner import PlannerDeps

__all__ = ["RunOptions", "RunResult", "run_session"]


@dataclass
class RunResult:
    """How a run ended: the report path, the kept trial, the numbers, restarts and wall time."""

    status: str
    failed: bool = False
    """The work failed (the planner stopped, or the server was unhealthy at the end): exit status 1."""
    transcript: Path | None = None
    report: Path | None = None
    baseline: dict[int, float] = field(default_factory=dict)
    final: dict[int, float] = field(default_factory=dict)
    trials: list[Any] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    restarts: int = 0
    seconds: float = 0.0
    conclusion: str = ""
    budget: str = ""
    """The wall-time budget and whether it was spent, in words."""
    untried: dict[str, str] = field(default_factory=dict)
    """Candidate change -> why it was never trialled."""
    rule: str = ""
    """How a change was judged (the report explains it)."""
    measured: list[str] = field(default_factory=list)
    """What the run measured about the deployment itself: its launch spread, its load at baseline."""
    review: Any = None
    """The transcript read back (`agent.transcripts.review.Review`, set by the report): the user's
    workload before and after, what is known of each flag tried together."""


async def run_session(config: Any, opts: RunOptions, ui: RunUI) -> RunResult:
    """The whole run against `config`'s target; returns how it ended (raises `SessionError` early)."""
    from agent.policy.loadstate import largest_gain, load_state
    from agent.policy.planner import build_planner
    from agent.transcripts.report import explain_run, time_use
    from agent.trial.spread import known_spread, measure_spread

    async with prepare_session(config, opts, ui) as prep:
        config, deps, runner, baseline = prep.config, prep.deps, prep.deps.runner, prep.baseline
        phases = prep.phases
        state = load_state(deps.ctx.facts, config.bench, baseline.reps)
        ui.record("load_state", {"levels": state.levels, "facts": state.facts, "text": state.describe()})
        ui.note(f"load at baseline: {state.describe()}")
        mark = time.monotonic()
        if runner is not None:
            runner.expect_gain(largest_gain(deps.candidates, state))
        spread = await measure_spread(runner) if runner is not None else known_spread(config.bench)
        phases.append(("launch spread", time.monotonic() - mark))
        spread_restarts = len(runner.launch_seconds) if runner is not None else 0
        ui.record("launch_spread", {**spread.as_dict(), "text": spread.describe()})
        ui.note(spread.describe())
        deps.state, deps.spread = state, spread.value
        ui.step("planning, research and trials")
        mark = time.monotonic()
        planner = build_planner(prep.models.planner)
        conclusion, status = await _plan(ui, deps, planner, opts, prep.instructions)
        ui.todo_final()
        if prep.models.label != "builtin":  # the offline policy calls no model: nothing to count
            ui.note(f"model usage: {deps.tokens.line()}")
        ui.record("usage", {"agent": "run", "by_kind": deps.tokens.by_kind()})
        if runner is not None:
            status = await _combine_if_needed(ui, runner, status)
            await prep.deployment.rollback()  # no-op unless something is still in flight
        phases.append(("research, planning and trials", time.monotonic() - mark))
        measured = [spread.describe(), f"load at baseline: {state.describe()}", *_order_notes(deps)]

        def explain(r: RunResult) -> None:
            explain_run(r, deps, runner, opts, config)
            used = time_use(r.seconds, phases, runner, spread_restarts)
            ui.record("time_use", {"text": used})  # `optagent transcripts show` lists it too
            ui.note(used, record=False)
            r.measured.extend([*measured, used])

        if status == "completed" and deps.unresearched:  # the deadline came first, before any trial's
            status = f"budget spent: {len(deps.unresearched)} candidates not researched (wall-time budget)"
        return await _final(
            ui, config, runner, baseline, conclusion, status, prep.started, prep.bench_s, explain=explain
        )


def _order_notes(deps: PlannerDeps) -> list[str]:
    """What the baseline's load made of each candidate's value (only those it changed)."""
    from agent.policy.planner import candidates_view

    out = [
        f"{c['flag']} x{c['state_factor']:g} ({'; '.join(c['state_why'])})"
        for c in candidates_view(deps)
        if c.get("state_factor", 1.0) != 1.0 and c["status"] == "candidate"
    ]
    return ["order from the load: " + ", ".join(out)] if out else []


async def _plan(ui: RunUI, deps: Any, planner: Any, opts: RunOptions, instructions: str) -> tuple[str, str]:
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.usage import UsageLimits
    from rich.markup import escape

    from agent.policy.agentrun import run_saving
    from agent.policy.toolerrors import ToolErrorLimit

    deps.usage_limits = UsageLimits(
        request_limit=400, tool_calls_limit=600, total_tokens_limit=opts.max_tokens
    )

    def on_response(msg: int) -> None:
        deps.current_msg = msg

    try:
        result = await run_saving(
            planner,
            f"Goal: {opts.goal.text}. Make a plan, research the candidates, run trials and conclude.",
            deps=deps,
            transcript=ui.transcript,
            name="planner",
            usage_limits=deps.usage_limits,
            instructions=instructions,
            on_response=on_response,
            on_usage=deps.tokens.add,
        )
        return str(result.output), "completed"
    except (ToolErrorLimit, UsageLimitExceeded) as e:  # the run's own limits: a clean end
        ui.note(f"[yellow]planning stopped on a limit:[/] {escape(str(e))}")
        return f"Planning stopped on a limit: {e}", f"limit: {e}"
    except Exception as e:  # an LLM failure ends planning; the target stays on its best config
        ui.note(f"[red]planner stopped:[/] {type(e).__name__}: {escape(str(e))}")
        return f"The planner stopped early: {type(e).__name__}: {e}", f"planner failed: {type(e).__name__}"


async def _combine_if_needed(ui: RunUI, runner: TrialRunner, status: str) -> str:
    """The combined trial is not optional: if two or more flags were kept alone, try them together."""
    from agent.trial.record import BudgetExhausted

    if any(t.kind == "combined" for t in runner.trials) or not runner.eligible():
        return status
    try:
        record = await runner.combine()
    except BudgetExhausted as e:
        ui.note(f"combined trial skipped: {e}")
        return status
    if record is not None:
        ui.note(record.headline())
    return status


async def _final(
    ui: RunUI,
    config: Any,
    runner: TrialRunner | None,
    baseline: Baseline,
    conclusion: str,
    status: str,
    started: float,
    bench_s: float,
    explain: Any = None,
) -> RunResult:
    from agent.transcripts.report import write_report
    from tools.deploy.health import wait_healthy

    ui.step("final state")
    health = await wait_healthy(config.target.endpoint, timeout=60.0)
    best_reps = runner.best_reps if runner else None
    final_levels = mean_throughput(baseline.reps)  # nothing kept: the baseline stays deployed
    if best_reps:
        if runner.best is not None and runner.best.workload:  # judged on another workload
            best_reps = await _final_on_baseline_workload(ui, config) if health.ok else None
        final_levels = mean_throughput(best_reps) if best_reps else {}  # {}: shown as missing
    kept = [c.describe() for c in runner.kept_changes] if runner else []
    # checked again now: the final benchmark may have taken the server down since the check above
    health = await wait_healthy(config.target.endpoint, timeout=3.0, request_timeout=10.0)
    ui.note(f"deployed: {', '.join(kept) or 'baseline configuration'}; healthy: {health.ok}")
    if status == "completed" and runner is not None and (runner.exhausted or runner.halted):
        status = f"budget spent: {runner.exhausted}" if not runner.halted else f"stopped: {runner.halted}"
    result = RunResult(
        status=status if health.ok else f"{status}; server unhealthy at the end: {health.reason}",
        failed=status.startswith(("planner failed", "stopped")) or not health.ok,
        transcript=getattr(ui.transcript, "path", None),
        baseline=mean_throughput(baseline.reps),
        final=final_levels,
        trials=list(runner.trials) if runner else [],
        kept=kept,
        restarts=runner.restarts if runner else 0,
        seconds=time.monotonic() - started,
        conclusion=conclusion,
    )
    if explain is not None:  # the budget sentence, the decision rule, the untried candidates
        explain(result)
        ui.note(result.budget)
    result.report = write_report(result, baseline_reps=baseline.reps, best_reps=best_reps, ui=ui)
    ui.console.print(conclusion)
    return result


async def _final_on_baseline_workload(ui: RunUI, config: Any) -> list[Any] | None:
    """A block of the running (final) configuration on the baseline's settings (`config.bench`),
    for a winner judged on another workload (a scheduling flag on the shared-prefix mix): the run's
    before/after then compares the same prompts (random prompts against the mix put the seed at
    +26% at c=64 for two changes of +3% each). None when it fails: the report shows no before/after."""
    from tools.bench.loadgen import run_repeated
    from tools.bench.stats import partial_errors

    with ui.progress("final benchmark, on the baseline's workload") as progress:
        reps = await run_repeated(config.target.endpoint, config.bench, on_progress=progress)
    if not reps or any(s.partial for s in reps):
        why = "; ".join(partial_errors(reps)) or "no result"
        ui.note(f"[yellow]the final configuration's benchmark on the baseline's workload failed: {why}[/]")
        return None
    return reps
