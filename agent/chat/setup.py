"""Setting up a chat: the same preflight and context as `optagent run`, then the planner and its
deps; on `--resume`, the saved history, todo list, verdicts, trials and baseline are restored. The
baseline and the code index wait until a step needs them (`agent.chat.needs`): the prompt comes at
once."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console


@dataclass
class ChatSetup:
    """What a chat runs on."""

    planner: Any
    deps: Any
    history: list[Any]
    instructions: str


def restore_state(deps: Any, loaded: Any) -> list[str]:
    """Put the saved todo list, verdicts and trial records back into `deps`; returns notes for the user.

    The known-good configuration needs no restoring: it is what is deployed, and a baseline is
    measured on it unless the saved one ran on this same unit file (`needs.saved_baseline`).
    """
    from agent.policy.todo import TodoItem
    from agent.policy.verdict import FlagVerdict
    from agent.trial.record import TrialRecord

    notes = []
    todos = loaded.events_of("todo")
    if todos:
        items = (todos[-1].get("data") or {}).get("items") or []
        deps.todo.items = [TodoItem.model_validate(i) for i in items if isinstance(i, dict) and "id" in i]
        notes.append(f"todo list restored ({len(deps.todo.items)} items)")
    for e in loaded.events_of("verdict"):
        with contextlib.suppress(Exception):
            v = FlagVerdict.model_validate(e.get("data"))
            deps.verdicts[v.flag] = v
    if deps.verdicts:
        notes.append(f"{len(deps.verdicts)} research verdicts restored")
    trials = []
    for e in loaded.events_of("trial"):
        with contextlib.suppress(Exception):
            trials.append(TrialRecord.model_validate(e.get("data")))
    if trials:
        kept = [t.headline() for t in trials if t.decision == "kept"]
        notes.append(f"{len(trials)} earlier trials; kept: {'; '.join(kept) or 'none'}")
    if deps.runner is not None:
        # Earlier trials and restarts count against the budget; the deployed config is the new baseline.
        deps.runner.trials = trials
        deps.runner.restarts = spent_restarts(loaded)
        if deps.runner.restarts:
            notes.append(f"{deps.runner.restarts} restarts spent earlier count against the budget")
    return notes


def spent_restarts(loaded: Any) -> int:
    """The restarts a saved session spent. Its trial records do not hold them all (a run's
    launch-spread relaunches are in no trial), so the count a session wrote when it ended is the
    starting point, and the trials and undos recorded after that end are added to it."""
    ends = [loaded.end or {}] + [
        (e.get("data") or {}).get("previous_end") or {} for e in loaded.events_of("note")
    ]
    counted = [e for e in ends if isinstance((e.get("outcome") or {}).get("restarts"), int)]
    last = max(counted, key=lambda e: str(e.get("ts", "")), default={"ts": "", "outcome": {"restarts": 0}})
    after = [e for e in loaded.events if str(e.get("ts", "")) > str(last.get("ts", ""))]
    trials = sum(int((e.get("data") or {}).get("restarts") or 0) for e in after if e.get("kind") == "trial")
    undos = [e for e in after if e.get("kind") == "deploy" and (e.get("data") or {}).get("action") == "undo"]
    return last["outcome"]["restarts"] + trials + len(undos)


@contextlib.asynccontextmanager
async def open_chat(
    config: Any, *, model: str, base_url: str | None, ui: Any, resume: Any = None
) -> AsyncIterator[ChatSetup]:
    """Preflight and context against `config`'s target, then the planner ready for chat (the
    baseline: the saved one on `--resume` when it still applies, else measured before the first trial)."""
    from agent.chat.needs import saved_baseline
    from agent.context import gather_context
    from agent.policy.models import make_models
    from agent.policy.planner import PlannerDeps, build_planner
    from agent.policy.playbook import evaluate, grid_size, load_playbook
    from agent.policy.researcher import build_researcher
    from agent.prepare import _preflight, make_runner, restart_budget
    from agent.trial.record import Baseline, lossy_flags, mean_throughput
    from agent.trial.resolved import drop_pointless
    from prompts import render
    from tools.bench.stats import objective_from_goal
    from tools.deploy.deployment import Deployment
    from tools.deploy.remote import make_transport

    target = config.target
    goal = ui.transcript.header.get("goal") or "improve throughput"
    models = make_models(model, base_url)
    transport = make_transport(target)
    try:
        async with Deployment(target, pace=True) as deployment:
            ui.step("preflight")
            await _preflight(ui, deployment, target)
            ui.step("context")
            ctx = await gather_context(
                config, transport, on_step=lambda s: ui.note(f"reading {s}", record=False),
                waiting=ui.waiting, index=False,
            )  # fmt: skip
            ui.record("context", {**ctx.summary(), "facts": ctx.facts})
            config = config.model_copy(update={"bench": ctx.fit_bench(config.bench)})
            text = Path(target.local_unit).read_text()
            saved = saved_baseline(resume, text, config.bench) if resume is not None else None
            baseline = saved[0] if saved else Baseline(reps=[], probe=None, text=text)
            ui.note(
                f"baseline: the saved one, measured {saved[1]} on this unit file" if saved else
                "baseline: measured before the first trial (not now: the prompt comes at once)",
                record=False,
            )  # fmt: skip
            objective = objective_from_goal(goal)
            playbook = load_playbook()
            # as a run has them: what the running server's resolved configuration makes pointless is
            # already set (the first pick and the trials follow the run's order over the same list)
            candidates = drop_pointless(evaluate(playbook, ctx.facts, ctx.catalog or None), ctx.resolved_args)
            grid = grid_size(playbook, ctx.facts, ctx.catalog or None)
            runner = make_runner(
                deployment, config, objective, baseline, candidates, ui,
                allow_lossy=config.agent.allow_lossy, max_trials=config.agent.max_trials,
                max_restarts=restart_budget(config.agent.max_restarts, grid),
            )  # fmt: skip
            if saved:  # another launch, maybe hours ago: the first trial measures known-good anew
                runner.reference, runner.known_good_blocks = None, []
            deps = PlannerDeps(
                goal=goal,
                ctx=ctx,
                candidates=candidates,
                ui=ui,
                researcher=build_researcher(models.researcher),
                runner=runner,
                baseline_levels=mean_throughput(baseline.reps),
                allow_lossy=config.agent.allow_lossy,
                max_parallel_research=config.agent.max_parallel_research,
            )
            history: list[Any] = []
            if resume is not None:
                history = resume.model_messages(agent="planner")
                for note in restore_state(deps, resume):  # plain: `[--flag]` in a headline is no markup
                    ui.console.print(note, highlight=False, markup=False)
                    ui.record("note", {"text": note})
            instructions = render(
                "planner.md.j2",
                goal=goal,
                allow_lossy=config.agent.allow_lossy,
                lossy=lossy_flags(candidates),
                max_trials=config.agent.max_trials,
                dry_run=False,
                context=ctx.summary(),
                objective=str(getattr(objective, "describe", lambda: objective)()),
                baseline=deps.baseline_levels,
                chat=True,
            )
            planner_model = models.planner
            if model == "builtin":
                from pydantic_ai.models.function import FunctionModel

                from agent.chat.policy import chat_policy

                planner_model = FunctionModel(chat_policy, model_name="builtin-chat")
            yield ChatSetup(build_planner(planner_model), deps, history, instructions)
            await deployment.rollback()  # no-op unless a change is still in flight
    finally:
        await transport.close()


def chat_console() -> Console:
    """The console chat prints to (stdout)."""
    return Console(highlight=False)
