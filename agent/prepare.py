"""What a run and a chat do before planning: the target's preflight, the baseline (reference outputs
and repeated sweeps of the running configuration), and the trial runner with its restart budget."""

from __future__ import annotations

import time
from typing import Any

from agent.policy.order import slow_start_flags
from agent.trial.budget import TRIAL_RESTARTS
from agent.trial.record import Baseline, lossy_flags, mean_throughput, mechanism_flags
from agent.trial.runner import TrialRunner
from agent.ui import RunUI


class SessionError(Exception):
    """The run cannot proceed (unreachable host, drift, unhealthy server); the message says why."""


async def measure_baseline(
    ui: RunUI, endpoint: str, bench: Any, text: str, deployment: Any = None
) -> tuple[Baseline, float]:
    """Probe reference outputs and repeated sweeps of the running configuration. When the sweeps
    fail and `deployment` is given, a server the load took down is brought back (`_bring_back`)."""
    from tools.bench.loadgen import run_repeated
    from tools.bench.probe import run_probe

    started = time.monotonic()
    probe = await run_probe(endpoint)
    with ui.progress("baseline benchmark") as progress:
        reps = await run_repeated(endpoint, bench, on_progress=progress)
    if not reps or any(s.partial for s in reps):
        errors = "; ".join(e for s in reps for e in s.errors) or "no result"
        after = await _bring_back(ui, deployment) if deployment is not None else ""
        raise SessionError(f"the baseline benchmark failed: {errors}{after}")
    levels = mean_throughput(reps)
    ui.note("baseline: " + ", ".join(f"c={c}: {v:,.1f} tok/s" for c, v in levels.items()), record=False)
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


CLOSING_SECONDS = 20.0
"""What a run spends after its last trial besides a final benchmark: the health check, the report and
its plots (5-10 s measured on two cores); trials end this much before the wall-time budget does."""


def make_runner(
    deployment: Any,
    config: Any,
    objective: Any,
    baseline: Baseline,
    candidates: list[Any],
    ui: Any,
    *,
    allow_lossy: bool,
    max_trials: int,
    deadline: float = float("inf"),
    max_restarts: int | None = None,
) -> TrialRunner:
    """The trial runner of a run or a chat: the playbook's lossy levers marked, every trial recorded,
    `max_restarts` restarts to spend (see `restart_budget`)."""
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
        deadline=deadline,
        closing_seconds=CLOSING_SECONDS if deadline != float("inf") else 0.0,
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
