"""What chat does besides the planner's tools: show the todo list and status, benchmark now, and
undo the last kept change (through the same `Deployment` gate as every trial)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.policy.planner import PlannerDeps
    from agent.trial.record import TrialRecord
    from agent.trial.runner import TrialRunner


def held_at_start(runner: TrialRunner) -> list[TrialRecord]:
    """The kept trials of an earlier session (`--resume`) whose changes the configuration at start
    holds: after a run kept a flag, that configuration is not the baseline."""
    from tools.deploy.units.file import UnitFile

    flags = UnitFile.parse(runner.baseline.text).command.flags
    return [t for t in runner.trials if t.decision == "kept" and _deployed(t, flags)]


def previous_best(runner: TrialRunner) -> TrialRecord | None:
    """The kept trial of this chat before the deployed best (None: the configuration at start). A
    kept trial of an earlier session is part of that configuration, not a step back: going back to
    it deployed the start again and said "deployed now: trial N"."""
    held = {t.number for t in held_at_start(runner)}
    kept = [
        t
        for t in runner.trials
        if t.decision == "kept" and runner.best and t.number < runner.best.number and t.number not in held
    ]
    return kept[-1] if kept else None


def start_config(runner: TrialRunner) -> str:
    """`the configuration at start`, naming the kept trials of an earlier session it holds."""
    earlier = held_at_start(runner)
    holds = f", which holds the kept {'; '.join(t.headline() for t in earlier)}" if earlier else ""
    return "the configuration at start" + holds


def todo_text(todo: Any) -> str:
    """The todo list as plain lines (`[x] content (priority)`)."""
    marks = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]", "cancelled": "[-]"}
    lines = [f"{marks.get(i.status, '[ ]')} {i.content} ({i.priority})" for i in todo.items]
    return "\n".join(lines) or "(the todo list is empty)"


def _record(deps: PlannerDeps, kind: str, data: dict[str, Any]) -> None:
    ui = getattr(deps, "ui", None)
    if ui is not None:
        ui.record(kind, data, msg=getattr(deps, "current_msg", None))


async def status_lines(deps: PlannerDeps) -> list[str]:
    """Deployed flags, health, trials so far and the last measured numbers."""
    from agent.chat.policy import describe_levels

    runner = deps.runner
    if runner is None:
        return ["dry run: nothing is deployed by this session", f"verdicts: {len(deps.verdicts)}"]
    from agent.chat.deployed import deployed_lines, deployed_now

    state = await deployed_now(deps)  # the host's unit file, as `optagent status` reads it
    flags = state["flags"]
    lines = ["deployed flags: " + " ".join(f"{k} {v}" if v is not None else k for k, v in flags.items())]
    try:
        import httpx

        async with httpx.AsyncClient(timeout=5.0) as client:
            r = await client.get(f"{runner.endpoint}/health")
        lines.append(f"health: {'ok' if r.status_code == 200 else f'HTTP {r.status_code}'}")
    except Exception as e:
        lines.append(f"health: unreachable ({type(e).__name__})")
    best = runner.best
    lines.append(f"deployed: {best.headline() if best else start_config(runner)}")
    lines += deployed_lines(state)[1:]  # what changed since the chat and the session before it started
    of = "" if runner.max_restarts is None else f" of {runner.max_restarts}"
    lines.append(
        f"trials: {len(runner.trials)}, restarts: {runner.restarts}{of}, budget: {runner.budget_left() or 'available'}"
    )
    last = getattr(deps, "last_benchmark", None) or (best.levels if best else deps.baseline_levels)
    lines.append(
        f"last benchmark: {describe_levels(last)}" if last else
        "last benchmark: none yet (the baseline is measured before the first trial; /bench measures now)"
    )  # fmt: skip
    return lines


def _deployed(trial: TrialRecord, flags: dict[str, str | None]) -> bool:
    """Whether every change of `trial` is in the deployed `flags` (an earlier session's kept trial)."""
    for c in trial.changes:
        if c.action == "unset" and c.flag in flags:
            return False
        if c.action == "set" and (c.flag not in flags or flags[c.flag] != c.value):
            return False
    return True


async def bench_now(deps: PlannerDeps) -> str:
    """Benchmark the deployed configuration (repeated sweep) and record the numbers."""
    from agent.chat.policy import describe_levels
    from agent.trial.record import mean_throughput
    from tools.bench.loadgen import run_repeated

    runner = deps.runner
    if runner is None:
        return "dry run: nothing to measure beyond the baseline"
    with deps.ui.progress("benchmark") as progress:
        reps = await run_repeated(runner.endpoint, runner.bench, on_progress=progress)
    levels = mean_throughput(reps)
    deps.last_benchmark = levels
    _record(deps, "note", {"benchmark": levels, "partial": any(s.partial for s in reps)})
    return f"benchmark of the deployed configuration: {describe_levels(levels)}"


async def undo_last_kept(deps: PlannerDeps) -> str:
    """Deploy the configuration before the last kept change and make it the known-good one."""
    from agent.trial.record import apply_changes

    runner = deps.runner
    if runner is None:
        return "dry run: nothing was deployed"
    if runner.best is None:
        return f"nothing kept in this chat to undo; deployed: {start_config(runner)}"
    undone, prev = runner.best, previous_best(runner)
    text = runner.baseline.text if prev is None else apply_changes(runner.baseline.text, prev.full_changes())
    what = ", ".join(c.describe() for c in undone.changes)
    outcome = await runner.deployment.deploy(text, reason=f"chat: roll back trial {undone.number} ({what})")
    runner.count_restarts()  # the known-good block must be measured again on this launch
    data = {"action": "undo", "trial": undone.number, "changes": what, "ok": outcome.ok, "diff": outcome.diff}
    if not outcome.ok:
        data["error"] = outcome.error
        _record(deps, "deploy", data)
        return f"could not roll back trial {undone.number}: {outcome.error}; trial {undone.number} stays deployed"
    await runner.deployment.commit()
    runner.undone(prev)  # a new known-good configuration: its own history starts here
    # what the review reads as deployed: the start holds an earlier session's kept trial, if any
    now_kept = prev or next(reversed(held_at_start(runner)), None)
    data["now"] = "baseline" if now_kept is None else f"trial {now_kept.number}"
    _record(deps, "deploy", data)
    now = start_config(runner) if prev is None else data["now"]
    return f"rolled back trial {undone.number} ({what}); deployed now: {now}"


def change_in_words(runner: TrialRunner | None, tool: str, args: dict[str, Any]) -> str:
    """The approval question's subject: `trial: set --cuda-graph-max-bs 128 (on top of ...)`."""
    if tool == "undo_last_kept":
        best = getattr(runner, "best", None)
        what = ", ".join(c.describe() for c in best.changes) if best is not None else "nothing"
        return f"undo the last kept change ({what}), back to the configuration before it"
    changes = []
    for c in args.get("changes", []):
        flag, value = c.get("flag", "?"), c.get("value")
        if c.get("action") == "unset":
            changes.append(f"remove {flag}")
        else:
            changes.append(f"set {flag}" + (f" to {value}" if value is not None else " (switch on)"))
    kept = [c.describe() for c in runner.kept_changes] if runner is not None else []
    on_top = f", on top of the kept {', '.join(kept)}" if kept else ""
    return f"trial: {'; '.join(changes) or 'no change'}{on_top} (restart, benchmark, keep only if better)"
