"""The planner agent: a todo list, research subagents, trials through the trial runner, a conclusion."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import Agent, RunContext
from rich.markup import escape

from agent.context import DeploymentContext
from agent.policy.agentrun import TokenCount, run_saving
from agent.policy.claims import check_claims
from agent.policy.playbook import Candidate
from agent.policy.researcher import ResearchDeps, flag_usage, lookup_flag
from agent.policy.todo import TodoItem, TodoList
from agent.policy.toolerrors import ErrorBudget, ToolErrors, passes_through
from agent.policy.trialgate import refusal, refuse, trial, trial_result, won_at  # noqa: F401 (re-exported)
from agent.policy.verdict import FlagVerdict
from agent.trial.deadline import Deadline
from agent.trial.record import BudgetExhausted, TrialChange, mean_throughput
from agent.trial.runner import TrialRunner
from agent.ui import RunUI
from tools.bench.objective import Goal
from tools.bench.workload import mechanisms_of_readers
from tools.flagname import flag_name


@dataclass
class PlannerDeps:
    """Everything the planner's tools act on."""

    goal: Goal
    """The goal, read once where it entered (`tools.bench.objective.read_goal`)."""
    ctx: DeploymentContext
    candidates: list[Candidate]
    ui: RunUI
    researcher: Any
    runner: TrialRunner | None
    """None in a dry run: nothing is deployed."""
    baseline_levels: dict[int, float] = field(default_factory=dict)
    allow_lossy: bool = False
    max_parallel_research: int = 4
    usage_limits: Any = None
    todo: TodoList = field(default_factory=TodoList)
    verdicts: dict[str, FlagVerdict] = field(default_factory=dict)
    current_msg: int | None = None
    """msg number of the planner response being executed (parent of its subagents)."""
    code: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The code's analysis of each flag researched in this session (`usage` results)."""
    errors: ErrorBudget = field(default_factory=ErrorBudget)
    tokens: TokenCount = field(default_factory=lambda: TokenCount())
    state: Any = None
    """What the baseline showed about the load (`agent.policy.loadstate.LoadState`; None: unknown)."""
    spread: float | None = None
    """The restart spread trials assume (`agent.trial.spread`; None: the declared one)."""
    last_benchmark: dict[int, float] | None = None
    """A chat's latest `/bench` numbers (`agent.chat.actions.bench_now`; None: none measured)."""
    deadline: Deadline = field(default_factory=Deadline)
    """The run's wall-time deadline (the trial runner ends by the same one); none in a chat."""
    research_seconds: list[float] = field(default_factory=list)
    """Wall seconds each research of this session took: the next is started only if the longest fits."""
    unresearched: dict[str, str] = field(default_factory=dict)
    """Flag -> why it was never researched (`NOT_RESEARCHED`: the deadline came first)."""
    _resolved: dict[str, Any] | None = None
    _sem: asyncio.Semaphore | None = None
    trial_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One trial at a time: the restarts of `run_trial` and `leave_out` never overlap."""

    @property
    def resolved(self) -> dict[str, Any]:
        """The running server's resolved arguments (read once from the context)."""
        if self._resolved is None:
            self._resolved = self.ctx.resolved_args if hasattr(self.ctx, "resolved_args") else {}
        return self._resolved

    @property
    def semaphore(self) -> asyncio.Semaphore:
        """Bounds how many research subagents run at once."""
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.max_parallel_research)
        return self._sem


def candidates_view(deps: PlannerDeps) -> list[dict[str, Any]]:
    """The playbook candidates as the planner sees them, with what the baseline's state makes of
    each (`state_factor`, `state_why`, `acts_at_levels`, `costs_at_levels`), the smallest gain one
    trial can establish here (`establishable`, `agent.policy.order`), what a trial of it costs here
    (`trial_cost`) and the trials the budget fits (`trials_left`)."""
    from agent.policy.loadstate import acts_at, costs_at, state_factor
    from agent.policy.order import establishable

    bench = deps.runner.bench if deps.runner is not None else None
    bar = establishable(deps.spread, bench.min_effect) if bench is not None and deps.spread else None

    judged = goal_levels(deps)

    def state(c: Candidate) -> dict[str, Any]:
        if deps.state is None:
            return {}
        factor, why = state_factor(c.lever, deps.state, judged)
        return {
            "state_factor": factor,
            "state_why": why,
            "acts_at_levels": acts_at(c.lever, deps.state),
            "costs_at_levels": costs_at(c.lever, deps.state),
        }

    return [
        {
            "flag": c.flag,
            "value": c.value,
            "action": c.action,
            "status": c.status,
            "note": c.note,
            "ruled_out": c.ruled_out,
            "priority": c.lever.priority,
            "lossy": c.lever.lossy,
            "lossy_allowed": deps.allow_lossy,
            "what": c.lever.what,
            "helps": c.lever.helps,
            "risk": c.lever.risk,
            "expected_gain": getattr(c.lever, "expected_gain", None),
            "restart_cost": getattr(c.lever, "restart_cost", None),
            # ordinary trials' time a trial of it takes here (a slow start's launches, as measured)
            "trial_cost": deps.runner.trial_cost(c.flag) if deps.runner is not None else None,
            "establishable": bar,
            # a sized lever: the values its search may try here (`agent.policy.sizing`)
            "ladder": c.ladder.model_dump() if c.ladder is not None else None,
            "min_effect": bench.min_effect if bench is not None else None,
            "regress_tolerance": bench.regress_tolerance if bench is not None else None,
            # the trials the budget fits as the list is made (each trial result says it again)
            "trials_left": deps.runner.trials_left() if deps.runner is not None else None,
            **state(c),
        }
        for c in deps.candidates
    ]


def waiting_value(deps: PlannerDeps, changes: list[TrialChange]) -> float:
    """The value per trial of the best candidate no trial has touched yet, besides `changes`
    (`order.waiting_value`); 0 when none waits."""
    from agent.policy.order import waiting_value as best_waiting

    runner = deps.runner
    touched = {c.flag for t in (runner.trials if runner is not None else []) for c in t.changes}
    touched |= {c.flag for c in changes}
    verdicts = {flag: v.model_dump() for flag, v in deps.verdicts.items() if v is not None}
    return best_waiting(candidates_view(deps), verdicts, touched)


def goal_levels(deps: PlannerDeps) -> list[int] | None:
    """The levels the goal's objective decides on (a named level, a latency goal's lowest measured
    one); None when every level counts (throughput, the Pareto rule)."""
    objective = deps.goal.objective
    if objective.levels:
        return list(objective.levels)
    levels = sorted(deps.state.levels) if deps.state is not None else []
    return levels[:1] if objective.lowest_level and levels else None


NOT_RESEARCHED = "not researched: wall-time budget"
"""Why a candidate has no verdict when the run's deadline came before its research."""


class ResearchOutOfTime(Exception):
    """The deadline leaves no time for one more research: the flag stays without a verdict."""


def research_fits(deps: PlannerDeps, flag: str) -> None:
    """Raise `ResearchOutOfTime` (the flag recorded in `deps.unresearched`) unless one more research,
    as long as the longest of this session, still leaves the run's end its share: research under way
    finishes whole, so a verdict is either complete or absent, never cut short."""
    longest = max(deps.research_seconds, default=0.0)
    if deps.deadline.fits(longest):
        return
    left = max(0.0, deps.deadline.left())
    why = f"{NOT_RESEARCHED} (a research takes ~{longest:.0f} s; {left:.0f} s were left before the end)"
    deps.unresearched[flag] = why
    deps.ui.record("not_researched", {"flag": flag, "why": why})
    raise ResearchOutOfTime(why)


async def research(deps: PlannerDeps, flag: str, question: str, *, usage: Any = None) -> FlagVerdict:
    """Run one research subagent under the concurrency bound; its messages link to the planner's.
    Raises `ResearchOutOfTime` when the run's deadline leaves no time for it (`research_fits`)."""
    flag = flag_name(flag)
    parent = deps.current_msg
    rdeps = ResearchDeps(
        ctx=deps.ctx, candidates={c.flag: c for c in deps.candidates}, flag=flag, code=deps.code,
        errors=deps.errors,
    )  # fmt: skip
    prompt = f"Research the flag {flag} for this deployment. {question}".strip()
    async with deps.semaphore:
        research_fits(deps, flag)  # checked once its turn came: the wait for one may be long
        began = time.monotonic()
        result = await run_saving(
            deps.researcher,
            prompt,
            deps=rdeps,
            transcript=deps.ui.transcript,
            name=f"researcher:{flag}",
            parent=parent,
            usage=usage,
            usage_limits=deps.usage_limits,
            on_usage=deps.tokens.add,
        )
    verdict = result.output.model_copy(update={"flag": flag})
    if flag not in deps.code and deps.ctx.tree is not None:  # the code's view decides: have it
        await asyncio.to_thread(flag_usage, rdeps, flag)
    deps.research_seconds.append(time.monotonic() - began)
    verdict = check_claims(verdict, deps.ctx, deps.code.get(flag), lookup_flag(rdeps, flag))
    for line in verdict.checked:
        deps.ui.note(f"[yellow]claim checked[/] {escape(flag)}: {escape(line)}")
    deps.verdicts[flag] = verdict
    readers = (deps.code.get(flag) or {}).get("readers")
    if deps.runner is not None and readers is not None:  # what reads it says what it touches
        deps.runner.mechanisms.setdefault(flag, sorted(mechanisms_of_readers(readers)))
    if verdict.lossy and deps.runner is not None:  # the trial runner refuses it without --allow-lossy
        deps.runner.lossy.setdefault(flag, f"research: {verdict.risk or verdict.summary}")
    deps.ui.verdict(verdict, msg=parent)
    return verdict


PLANNER_EVIDENCE, PLANNER_CONDITIONS = 3, 6


def verdict_for_planner(v: FlagVerdict) -> dict[str, Any]:
    """The verdict as the planner reads it: the first pieces of evidence and conditions (the whole
    verdict is in the transcript); every planner request carries it again, so it stays short."""
    out = v.model_dump(mode="json")
    for key, n in (("evidence", PLANNER_EVIDENCE), ("conditions", PLANNER_CONDITIONS)):
        if len(out[key]) > n:
            out[f"{key}_not_shown"] = len(out[key]) - n
            out[key] = out[key][:n]
    return out


def build_planner(model: Any) -> Any:
    """The planner agent (pydantic-ai); its final output is the written conclusion. One piece
    because pydantic-ai registers tools by decorating them on the agent instance: each nested tool is
    defined here, on `agent`, and its docstring is what the model reads."""
    agent = Agent(
        model, name="planner", deps_type=PlannerDeps, output_type=str, retries=3, capabilities=[ToolErrors()]
    )

    @agent.tool
    async def todo_write(ctx: RunContext[PlannerDeps], items: list[TodoItem]) -> str:
        """Replace the todo list (every item with id, content, status, priority); the change is shown."""
        changes = ctx.deps.todo.replace(items)
        trials = ctx.deps.runner.trials if ctx.deps.runner is not None else []
        ctx.deps.ui.todo(
            ctx.deps.todo, changes, msg=ctx.deps.current_msg, trials=trials, verdicts=ctx.deps.verdicts
        )
        return "todo list updated:\n" + "\n".join(changes or ["(no change)"])

    @agent.tool
    async def list_candidates(ctx: RunContext[PlannerDeps]) -> list[dict[str, Any]]:
        """The playbook's levers resolved for this deployment: exact change, status, conditions checked."""
        return candidates_view(ctx.deps)

    @agent.tool
    async def research_flag(ctx: RunContext[PlannerDeps], flag: str, question: str = "") -> dict[str, Any]:
        """Run a research subagent on one flag in the running version's source; returns its FlagVerdict."""
        try:
            v = await research(ctx.deps, flag, question, usage=ctx.usage)
        except ResearchOutOfTime as e:  # no verdict, not a failed one: the deadline came first
            ctx.deps.ui.not_researched(flag_name(flag), str(e))
            return {"flag": flag_name(flag), "not_researched": str(e), "budget_exhausted": True}
        except Exception as e:  # the subagent gave up (no valid verdict): the planner goes on
            if passes_through(e):
                raise
            why = f"research of {flag} failed: {type(e).__name__}: {e}"
            ctx.deps.ui.note(f"[yellow]{escape(why)}[/]")
            return {"flag": flag, "error": why + "; the flag stays unresearched (no trial without research)"}
        return verdict_for_planner(v)

    @agent.tool(sequential=True)
    async def run_trial(
        ctx: RunContext[PlannerDeps],
        changes: list[TrialChange],
        reason: str,
        override_reason: str | None = None,
        together_reason: str | None = None,
    ) -> dict[str, Any]:
        """Deploy the changes, check outputs, benchmark, keep if better or roll back. One flag per trial,
        except one final trial of the flags kept individually, and a bundle: small levers (each
        expected below the candidate's `establishable` gain) tried as one change, with
        `together_reason` saying why (recorded; kept or rolled back as one). `override_reason` is
        required to deploy a flag research rejected."""
        kind = "bundle" if together_reason and len(changes) > 1 else ""
        reason = f"{reason}; {together_reason}" if kind else reason
        if ctx.deps.runner is not None:  # what a third launch of this one would take restarts from
            ctx.deps.runner.waiting(waiting_value(ctx.deps, changes))
        return await trial(ctx.deps, changes, reason, override_reason, kind=kind)

    @agent.tool(sequential=True)
    async def leave_out(ctx: RunContext[PlannerDeps], flag: str, reason: str) -> dict[str, Any]:
        """Deploy the kept configuration without one member of a kept bundle and measure both: the
        member stays only if leaving it out costs at least the minimum effect at some level,
        significantly; else the configuration without it is kept (no no-op rides on a bundle)."""
        deps = ctx.deps
        if deps.runner is None:
            return {"dry_run": True, "note": "nothing deployed"}
        flag = flag_name(flag)
        member = next((c for c in deps.runner.kept_changes if c.flag == flag), None)
        if member is None:
            return {"error": f"{flag} is not in the kept configuration; nothing to leave out"}
        async with deps.trial_lock:
            try:
                record = await deps.runner.run([member], reason=reason, kind="leave_out")
            except BudgetExhausted as e:
                return {"error": f"budget exhausted: {e}", "budget_exhausted": True}
        deps.ui.console.print(escape(record.headline()), highlight=False)
        return trial_result(deps, record)

    @agent.tool(sequential=True)
    async def benchmark(ctx: RunContext[PlannerDeps]) -> dict[str, Any]:
        """Measure the currently deployed configuration again (repeated sweep); output tok/s per level."""
        runner = ctx.deps.runner
        if runner is None:
            return {"error": "dry run: nothing to measure beyond the baseline"}
        from tools.bench.loadgen import run_repeated

        with ctx.deps.ui.progress("benchmark") as progress:
            reps = await run_repeated(runner.endpoint, runner.bench, on_progress=progress)
        levels = mean_throughput(reps)
        ctx.deps.ui.record("note", {"benchmark": levels})
        return {"output_tok_s": levels, "partial": any(s.partial for s in reps)}

    @agent.tool(sequential=True)
    async def rollback(ctx: RunContext[PlannerDeps]) -> str:
        """Undo any change in flight (the best measured configuration stays deployed)."""
        if ctx.deps.runner is None:
            return "dry run: nothing deployed"
        outcome = await ctx.deps.runner.deployment.rollback()
        return f"rollback: ok={getattr(outcome, 'ok', True)}"

    @agent.tool
    async def show_status(ctx: RunContext[PlannerDeps]) -> dict[str, Any]:
        """Trials so far, the deployed best, the restarts spent and the budget left."""
        r = ctx.deps.runner
        if r is None:
            return {"dry_run": True, "verdicts": {k: v.verdict for k, v in ctx.deps.verdicts.items()}}
        return {
            "trials": [trial_result(ctx.deps, t) for t in r.trials],
            "deployed_best": r.best.number if r.best else "baseline",
            "restarts": r.restarts,
            "budget": r.budget_left() or "available",
        }

    return agent
