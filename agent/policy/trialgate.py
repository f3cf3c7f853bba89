"""Gatekeeping between the planner and the trial runner: the checks a proposed change passes before
any restart, the trial itself, and what the planner learns from it (split from `planner.py`)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from rich.markup import escape

from agent.policy.proposal import check_changes
from agent.trial.record import BudgetExhausted, TrialChange, TrialRecord
from agent.trial.resolved import same_as_running
from tools.bench.effect import decided_levels, headline
from tools.flagname import flag_name

if TYPE_CHECKING:
    from agent.context import DeploymentContext
    from agent.policy.verdict import FlagVerdict
    from agent.trial.runner import TrialRunner
    from agent.ui import RunUI


class TrialDeps(Protocol):
    """What the gate reads of the planner's deps (`planner.PlannerDeps`, which imports this module)."""

    ctx: DeploymentContext
    ui: RunUI
    runner: TrialRunner | None
    """None in a dry run: nothing is deployed."""
    verdicts: dict[str, FlagVerdict]
    baseline_levels: dict[int, float]
    current_msg: int | None
    trial_lock: asyncio.Lock

    @property
    def resolved(self) -> dict[str, Any]: ...


def refuse(deps: TrialDeps, changes: list[TrialChange], why: str, *, check: str) -> dict[str, Any]:
    """A proposed trial refused before any restart: shown, recorded, returned to the model."""
    what = ", ".join(c.describe() for c in changes)
    deps.ui.note(f"[yellow]refused[/] {escape(what)}: {escape(why)} (no restart)")
    deps.ui.record("refusal", {"changes": what, "why": why, "check": check}, msg=deps.current_msg)
    return {"error": f"refused, not deployed: {why}", "refused": True, "restarts": 0}


def trial_result(deps: TrialDeps, record: TrialRecord) -> dict[str, Any]:
    """What the planner learns from a trial: decision, why, numbers against the baseline."""
    leave = "leave out " if record.kind == "leave_out" else ""
    return {
        "trial": record.number,
        "kind": record.kind,
        "changes": [leave + c.describe() for c in record.changes],
        "deployed": [c.describe() for c in deps.runner.kept_changes] if deps.runner is not None else [],
        "decision": record.decision,
        "improved": record.improved,
        "why": record.why,
        "probe": record.probe,
        "output_tok_s": record.levels,
        "baseline_output_tok_s": deps.baseline_levels,
        "ratio": (record.comparison or {}).get("ratio"),
        "verdict": (record.comparison or {}).get("verdict"),
        # the estimates the rule decides on (level, or "all": the objective), for a sized search
        "judged_ratios": judged_ratios(record.comparison),
        # what the decision compared: known-good vs candidate blocks, change with its 95% interval
        "decided": decided_levels(record.model_dump(mode="json")),
        "headline": headline(record.model_dump(mode="json")),
        "restarts": record.restarts,
        "environment": record.environment,
        "failed_start": bool(record.deploy_error) and not record.environment,
        "near_miss": record.near_miss,
        "first_look": record.first_look,
        "disturbed": record.disturbed,
        "won_at": won_at(record, deps.runner.bench.min_effect if deps.runner is not None else 0.02),
        "halted": deps.runner.halted if deps.runner is not None else None,
        # what the rest of the run can still try (the planner bundles what does not fit)
        "trials_left": deps.runner.trials_left() if deps.runner is not None else None,
    }


def judged_ratios(comparison: dict[str, Any] | None) -> dict[str, float | None]:
    """The estimates the rule decided on: each level's ratio under the Pareto rule (keys are the
    levels as text), the objective's (`"all"`) otherwise; {} without a comparison."""
    if not comparison:
        return {}
    if comparison.get("rule") == "pareto":
        return {str(i["concurrency"]): i.get("ratio") for i in comparison.get("per_level") or []}
    return {"all": (comparison.get("overall") or {}).get("ratio")}


def won_at(record: TrialRecord, min_effect: float) -> list[int]:
    """The levels at which a kept trial established its gain (interval above 1, estimate at least
    the minimum effect); [] for any other."""
    if record.decision != "kept" or record.kind == "leave_out":
        return []
    return [
        i["concurrency"]
        for i in (record.comparison or {}).get("per_level") or []
        if (i.get("ci_low") or 0) > 1 and (i.get("ratio") or 0) >= 1 + min_effect
    ]


def refusal(deps: TrialDeps, changes: list[TrialChange], override: str | None) -> tuple[str, str] | None:
    """Why a proposed trial is refused before any restart, and by which check (None: it may run).

    The checks of `optagent deploy --set` (catalog name, type, choices, value, unit file), research
    first, the resolved value, a rejected flag only with `override`. Normalizes the flag names."""
    for ch in changes:
        ch.flag = flag_name(ch.flag)
    base = deps.runner.deployed_text if deps.runner is not None else None
    problems = check_changes(deps.ctx, changes, base_text=base)
    if problems:
        return "; ".join(problems), "catalog"
    for ch in changes:
        v = deps.verdicts.get(ch.flag)
        if v is None:
            return f"research {ch.flag} with research_flag before trialling it", "research"
        if ch.action == "set" and (same := same_as_running(ch.flag, ch.value, deps.resolved)):
            return f"{same}: trialling {ch.describe()} would restart for nothing", "resolved"
        if v.rejected and not override:
            why = (
                f"research called {ch.flag} {v.verdict} ({v.decided_by}): {v.summary} "
                "Pass override_reason to deploy it anyway (recorded)."
            )
            return why, "verdict"
    return None


async def trial(
    deps: TrialDeps, changes: list[TrialChange], reason: str, override: str | None, *, kind: str = ""
) -> dict[str, Any]:
    """Gatekeeping before the trial runner: the checks of `optagent deploy --set` (catalog name,
    type, choices, value, unit file), research first, the resolved value, rejected flags only with
    a reason. A refusal costs no restart and goes back to the model as the tool's result."""
    why = refusal(deps, changes, override)
    if why is not None:
        return refuse(deps, changes, why[0], check=why[1])
    from tools.deploy.deployment import DeployError

    if deps.runner is None:
        what = ", ".join(c.describe() for c in changes)
        deps.ui.note(f"dry run: would trial {what}")
        return {"dry_run": True, "would_trial": what, "note": "nothing deployed"}
    kind = kind or ("combined" if len(changes) > 1 else "single")
    if kind == "bundle":
        deps.ui.record(
            "bundle", {"changes": [c.describe() for c in changes], "why": reason}, msg=deps.current_msg
        )
    async with deps.trial_lock:
        try:
            record = await deps.runner.run(changes, reason=reason, kind=kind, override=override)
        except BudgetExhausted as e:
            deps.ui.note(f"budget: {e}")
            return {"error": f"budget exhausted: {e}", "budget_exhausted": True}
        except DeployError as e:  # restart storm guard, drift: no more trials in this session
            deps.ui.note(f"[red]deployment stopped trials:[/] {e}")
            return {"error": f"deployment refused: {e}", "budget_exhausted": True}
    style = "green" if record.decision == "kept" else "yellow"
    deps.ui.console.print(f"[{style}]{escape(record.headline())}[/]", highlight=False)
    return trial_result(deps, record)
