"""Setting up a chat: what `optagent run` prepares (`agent.prepare.prepare_session`), then the
planner; on `--resume`, the saved history, todo list, verdicts, trials and baseline are restored. The
baseline and the code index wait until a step needs them (`agent.chat.needs`): the prompt comes at
once."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from agent.policy.planner import PlannerDeps
    from agent.transcripts.load import LoadedTranscript


@dataclass
class ChatSetup:
    """What a chat runs on."""

    planner: Any
    deps: PlannerDeps
    history: list[Any]
    instructions: str


def restore_state(deps: PlannerDeps, loaded: LoadedTranscript) -> list[str]:
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
        deps.runner.resumed(trials, spent_restarts(loaded))
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
    config: Any, *, goal: Any, model: str, base_url: str | None, ui: Any, resume: Any = None
) -> AsyncIterator[ChatSetup]:
    """What a run prepares (`agent.prepare.prepare_session`), interactively: the baseline (the saved
    one on `--resume` when it still applies) and the code index wait for the step that needs them;
    then the planner ready for chat, with the saved history and state on `--resume`. `goal` is the
    `tools.bench.objective.Goal` the command line read (on `--resume`, the saved session's)."""
    from agent.policy.planner import build_planner
    from agent.prepare import RunOptions, prepare_session

    opts = RunOptions(
        goal=goal,
        model=model,
        base_url=base_url,
        max_trials=config.agent.max_trials,
        max_restarts=config.agent.max_restarts,
        max_wall_minutes=None,
        allow_lossy=config.agent.allow_lossy,
    )
    async with prepare_session(config, opts, ui, interactive=True, resume=resume) as prep:
        history: list[Any] = []
        if resume is not None:
            history = resume.model_messages(agent="planner")
            for note in restore_state(prep.deps, resume):  # plain: `[--flag]` in a headline is no markup
                ui.console.print(note, highlight=False, markup=False)
                ui.record("note", {"text": note})
        planner_model = prep.models.planner
        if model == "builtin":
            from pydantic_ai.models.function import FunctionModel

            from agent.chat.policy import chat_policy

            planner_model = FunctionModel(chat_policy, model_name="builtin-chat")
        yield ChatSetup(build_planner(planner_model), prep.deps, history, prep.instructions)
        await prep.deployment.rollback()  # no-op unless a change is still in flight


def chat_console() -> Console:
    """The console chat prints to (stdout)."""
    return Console(highlight=False)
