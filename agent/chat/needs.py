"""What a chat measures or builds only when a step needs it, so that its prompt comes at once: the
baseline before the first trial that deploys (its probe and numbers are what a trial is compared
with), the code index before the first research. (`--resume` reuses the saved baseline while the unit
file and the benchmark settings are the ones it was measured with: `agent.prepare.saved_baseline`.)

Measured when needed rather than in the background: on a small machine a benchmark running beside
research (an index build, SGLang's own start-up) would measure the load, not the server.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic_ai.toolsets import WrapperToolset

from tools.flagname import flag_name

if TYPE_CHECKING:
    from pydantic_ai import RunContext

    from agent.policy.planner import PlannerDeps


@dataclass
class Prerequisites(WrapperToolset):
    """Wraps the planner's tools: `research_flag` waits for the code index (a spinner while it is
    built) and starts that flag's research clock; a `run_trial` that will deploy waits for the
    baseline (measured then, with its progress bar)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[PlannerDeps], tool: Any
    ) -> Any:
        deps = ctx.deps
        if name == "research_flag":
            async with self.lock:  # concurrent research calls: one build, one spinner
                await ensure_index(deps)
            deps.ui.research_started(flag_name(str(tool_args.get("flag", ""))))
        elif name == "run_trial" and (held := _already_deployed(deps, tool_args)):
            return _nothing_to_try(deps, held)
        elif name == "run_trial" and _will_deploy(deps, tool_args):
            async with self.lock:
                await ensure_baseline(deps)
        return await self.wrapped.call_tool(name, tool_args, ctx, tool)


def _already_deployed(deps: PlannerDeps, args: dict[str, Any]) -> list[str]:
    """The requested changes, when the deployed configuration holds every one of them already
    (`agent.chat.deployed.already_deployed`); [] otherwise (a trial may change something)."""
    from agent.chat.deployed import already_deployed
    from tools.deploy.units.file import UnitFile, UnitFileError

    changes = args.get("changes") or []
    runner = deps.runner
    if runner is None or not changes or not isinstance(changes, list):
        return []
    try:
        flags = UnitFile.parse(runner.deployed_text).command.flags
    except UnitFileError:
        return []
    held = already_deployed(
        flags, changes
    )  # dicts, or `TrialChange`s once the tool's arguments are validated
    return held if len(held) == len(changes) else []


def _nothing_to_try(deps: PlannerDeps, held: list[str]) -> dict[str, Any]:
    """The answer to a trial of changes already deployed, at once: no baseline, no approval, no
    restart (the trial runner found the same only after the baseline was measured)."""
    what = ", ".join(held)
    deps.ui.record("note", {"text": f"already deployed, no trial: {what}"}, msg=deps.current_msg)
    return {
        "already_deployed": held,
        "restarts": 0,
        "note": f"{what} is already deployed: the configuration would not change; no trial, no restart",
    }


def _will_deploy(deps: PlannerDeps, args: dict[str, Any]) -> bool:
    """Whether a `run_trial` call passes the planner's checks (`agent.policy.planner.refusal`: the
    checks of `optagent deploy --set`, research first, ...) and changes the deployed configuration;
    a refused one, or one of changes already deployed, deploys nothing."""
    from agent.policy.planner import refusal
    from agent.trial.record import TrialChange

    if _already_deployed(deps, args):
        return False
    try:
        changes = [TrialChange.model_validate(c) for c in args.get("changes", [])]
    except Exception:
        return False  # the tool's own validation answers it; nothing is deployed
    return refusal(deps, changes, args.get("override_reason")) is None


def _needs_approval(ctx: RunContext[PlannerDeps], tool_def: Any, args: dict[str, Any]) -> bool:
    """Target-changing calls need approval, except those that change nothing: an undo with nothing
    to undo, a trial the planner's checks refuse (the refusal goes back at once)."""
    if tool_def.name == "undo_last_kept":
        runner = getattr(ctx.deps, "runner", None)
        return runner is not None and runner.best is not None
    if tool_def.name == "run_trial":
        return _will_deploy(ctx.deps, args)
    return False


def ApprovalGate() -> Any:  # noqa: N802 - a capability instance, named like the class it builds
    """A capability that makes every target-changing tool call approval-required, and gives each
    tool what it needs first (`Prerequisites`, run once approved)."""
    from pydantic_ai.capabilities.abstract import AbstractCapability
    from pydantic_ai.toolsets.approval_required import ApprovalRequiredToolset

    lock = asyncio.Lock()  # one for the whole chat: the toolset is wrapped again for each turn

    class _Gate(AbstractCapability):
        def get_wrapper_toolset(self, toolset: Any) -> Any:
            inner = Prerequisites(toolset, lock=lock)
            return ApprovalRequiredToolset(inner, approval_required_func=_needs_approval)

    return _Gate()


async def ensure_index(deps: PlannerDeps) -> None:
    """Load the code index of the running version (built once per source tree, shown while built)."""
    tree = getattr(deps.ctx, "tree", None)
    if tree is None:
        return
    from tools.research.index import load_index

    with deps.ui.waiting() as progress:
        try:
            await asyncio.to_thread(load_index, tree, progress=progress)
        except Exception:  # the researcher reports a damaged index in its own words
            return


async def ensure_baseline(deps: PlannerDeps) -> None:
    """Measure the baseline now if the chat has none yet (probe and repeated sweeps of what runs)."""
    from agent.policy.loadstate import load_state
    from agent.prepare import measure_baseline
    from agent.trial.record import mean_throughput

    runner = deps.runner
    if runner is None or runner.baseline.probe is not None:
        return
    deps.ui.note(
        "measuring the baseline first: the trial's outputs and numbers are compared with it (once per chat)",
        record=False,
    )
    baseline, _ = await measure_baseline(
        deps.ui, runner.endpoint, runner.bench, runner.deployed_text, runner.deployment
    )
    runner.rebaselined(baseline)  # measured just now, in the launch the trial starts from
    deps.baseline_levels = mean_throughput(baseline.reps)
    # what the baseline shows about the load orders the candidates from here on, as in a run
    deps.state = load_state(deps.ctx.facts, runner.bench, baseline.reps)
