"""The trial runner: one candidate change, deployed, checked, measured, then kept or rolled back.

Plain code, no LLM: the planner chooses *what* to try; this module decides *how*, and no caller can
skip the correctness probe, the measurement or the rollback. The known-good configuration on the
host is always the best one measured so far, so a run that stops anywhere leaves the best deployed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from agent.trial.budget import TrialBudget
from agent.trial.paired import run_paired
from agent.trial.record import Baseline, BudgetExhausted, TrialChange, TrialRecord, apply_changes
from tools.config import BenchConfig

EventFn = Callable[[str, dict[str, Any]], None]


@dataclass
class TrialRunner(TrialBudget):
    """Runs trials against one `Deployment` within a budget; keeps the best configuration deployed.

    Each candidate goes on top of the best configuration so far (so the kept changes are always
    measured together) and is judged A/B/A: the known-good block measured just before it, the
    candidate, and the known-good block measured after the rollback (see `tools.bench.paired`).
    A likely winner is deployed again and judged on both of its launches before it is kept.
    """

    deployment: Any
    endpoint: str
    bench: BenchConfig
    objective: Any
    baseline: Baseline
    allow_lossy: bool = False
    lossy: dict[str, str] = field(default_factory=dict)
    """Flags known to change outputs (playbook lever or research verdict) → why; without
    `allow_lossy` a change of one is never deployed nor kept, whatever the probe says."""
    mechanisms: dict[str, list[str]] = field(default_factory=dict)
    """Flag → what it acts on (the playbook's lever, else research's readers of the flag): a flag on
    cache, scheduling or memory is measured on shared prefixes too (`tools.bench.workload`)."""
    slow_starts: dict[str, float] = field(default_factory=dict)
    """Flag → restarts' worth (above 1) of one start of a server with it (the playbook's
    `restart_cost`; torch.compile's is 2): a trial of it is budgeted with its longer launches."""
    launch_seconds: list[float] = field(default_factory=list)
    """Wall seconds of every restart so far (deploy or rollback until healthy)."""
    largest_gain: float | None = None
    """The largest gain a candidate may bring here (the planner's `plausible_gain`): on a deployment
    whose launches are unsteady, trials go on only for a gain that can be established against them."""
    max_trials: int = 12
    max_restarts: int | None = None
    """Restarts trials may spend in all (None: no limit). A trial starts only if its A/B/A, a
    second launch and the rollback after it fit (four); a third launch needs three more."""
    deadline: float = float("inf")
    """`time.monotonic()` at which the run's wall-time budget ends (trials end before it: `ends_at`)."""
    closing_seconds: float = 0.0
    """Seconds the run spends after its trials (health check, report): not for trials."""
    rep_seconds_seen: float = 0.0
    """Seconds one repetition of the latest block took (0: none yet; `rep_estimate`)."""
    max_reps: int = 0
    """Cap of the adaptive repetitions per block (0: twice `bench.reps`)."""
    block_reps: int = 0
    """Repetitions a trial's block starts with (0 given: `bench.reps`; `agent.trial.spread.measure_spread`
    sets fewer where the restart spread dominates)."""
    on_event: EventFn = lambda kind, data: None
    on_progress: Callable[[Any], None] | None = None
    trials: list[TrialRecord] = field(default_factory=list)
    best: TrialRecord | None = None
    best_reps: list[Any] | None = None
    restarts: int = 0
    reference: list[Any] | None = None
    """The latest block of the known-good configuration, measured in its current launch (None when
    it was restarted since: the next trial measures it first)."""
    known_good_blocks: list[Any] = field(default_factory=list)
    """Every block of the current known-good configuration measured in this run (their spread is
    the launch-to-launch noise actually seen)."""
    prior_blocks: list[Any] = field(default_factory=list)
    """Blocks of `known_good_blocks` whose spread `launch_prior` already holds (the spread phase's
    launches before the running one): known-good launches, but not pooled into the spread again."""
    launch_prior: tuple[float, float | None] | None = None
    """The restart spread every interval assumes, with its degrees of freedom (None: the declared
    `bench.launch_noise`; `agent.trial.spread.measure_spread` sets the deployment's own)."""
    launch_blocks: dict[int, tuple[str, list[Any]]] = field(default_factory=dict)
    """One block per launch measured by the trials (keyed by the restart count it ran at, so a
    later block of the same launch replaces an earlier one), with the configuration it ran: the
    restart spread every interval assumes is pooled over every configuration launched more than
    once (`launch_groups`), not only the current known-good one."""
    exhausted: str | None = None
    """Why a trial was refused for lack of budget (None while budget was left)."""
    halted: str | None = None
    """Why trials stopped for good (a failed rollback, an environment failure)."""

    def __post_init__(self) -> None:
        if self.reference is None and self.baseline.reps:
            self.reference = list(self.baseline.reps)
            self.known_good_blocks.append(self.reference)
        self.max_reps = self.max_reps or 2 * self.bench.reps
        self.block_reps = self.block_reps or self.bench.reps

    @property
    def kept_changes(self) -> list[TrialChange]:
        """Every change of the deployed best configuration, relative to the baseline."""
        return list(self.best.full_changes()) if self.best else []

    @property
    def deployed_text(self) -> str:
        """The unit file text of the best configuration (the baseline when nothing was kept)."""
        return apply_changes(self.baseline.text, self.kept_changes)

    def note_launch(self, config: str, block: list[Any]) -> None:
        """`block` is the one to count for the running launch of `config` (known-good's unit text,
        or a trial's candidate), on the workload measured now; an empty or partial block is not."""
        if block and not any(s.partial for s in block):
            self.launch_blocks[self.restarts] = (f"{config}\n{self.bench.workload!r}", block)

    @property
    def launch_groups(self) -> list[list[Any]]:
        """The blocks of `launch_blocks`, one group per configuration (and workload)."""
        groups: dict[str, list[Any]] = {}
        for config, block in self.launch_blocks.values():
            groups.setdefault(config, []).append(block)
        return list(groups.values())

    def lossy_reason(self, changes: list[TrialChange]) -> str | None:
        """Why `changes` are known to be lossy (None when none is), from `lossy`."""
        found = [f"{c.flag} ({self.lossy[c.flag]})" for c in changes if c.flag in self.lossy]
        return "known lossy: " + "; ".join(found) if found else None

    def _lossy_refusal(self, changes: list[TrialChange]) -> str | None:
        why = None if self.allow_lossy else self.lossy_reason(changes)
        return f"{why}; --allow-lossy not given" if why else None

    def eligible(self) -> list[TrialRecord]:
        """Single trials that improved on their reference but are not part of the deployed best
        (worth one combined trial), best first."""
        deployed = {c.flag for c in self.kept_changes}
        singles = [
            t
            for t in self.trials
            if t.kind == "single" and t.improved and not {c.flag for c in t.changes} <= deployed
        ]
        return sorted(singles, key=lambda t: -((t.comparison or {}).get("ratio") or 1.0))

    async def run(
        self,
        changes: list[TrialChange],
        *,
        reason: str,
        kind: Literal["single", "combined", "bundle", "leave_out"] = "single",
        override: str | None = None,
    ) -> TrialRecord:
        """Deploy `changes` on top of the best configuration, probe, measure A/B/A, keep or roll back
        (`kind="leave_out"`: the best configuration without `changes`, see `agent.trial.prune`).

        Raises `BudgetExhausted` before touching the target when no budget is left; a change whose
        slow start alone does not fit the time left is skipped (the next candidate may fit). Whatever
        happens inside (including cancellation), the target ends on the best known configuration.
        """
        why_not = self.budget_left()
        if why_not:
            self.exhausted = why_not
            raise BudgetExhausted(why_not)
        too_slow = self.budget_left(changes=changes)
        base = [c for c in self.kept_changes if c.flag not in {ch.flag for ch in changes}]
        if kind == "leave_out":  # the kept configuration without `changes`: they must be in it
            missing = {ch.flag for ch in changes} - {c.flag for c in self.kept_changes}
            if missing:
                raise ValueError(f"cannot leave out {', '.join(sorted(missing))}: not deployed")
            base = self.kept_changes
        record = TrialRecord(
            number=len(self.trials) + 1, kind=kind, changes=changes, on_top_of=base, reason=reason,
            override=override,
        )  # fmt: skip
        self.trials.append(record)
        record.planned_seconds = self.trial_estimate(changes)
        started = time.monotonic()
        refusal = self._lossy_refusal(changes) or too_slow
        if refusal:
            record.why = f"refused before deploying: {refusal}"
            self.on_event("trial", record.model_dump(mode="json"))
            return record
        try:
            new_text = apply_changes(self.baseline.text, record.full_changes())
        except ValueError as e:  # UnitFileError: a value that cannot go into the unit file
            record.why = f"rejected before deploying: {e}"
            self.on_event("trial", record.model_dump(mode="json"))
            return record
        if new_text == self.deployed_text:
            record.why = "the configuration is already deployed; nothing to restart"
            self.on_event("trial", record.model_dump(mode="json"))
            return record
        try:
            await _finish_before_cancelling(self._deploy_and_measure(record, new_text))
        finally:
            record.seconds = time.monotonic() - started
            self.on_event("trial", record.model_dump(mode="json"))
        return record

    async def _deploy_and_measure(self, record: TrialRecord, new_text: str) -> None:
        from agent.trial.prune import run_leave_out
        from tools.bench.workload import describe_workload, workload_for

        # A caching, scheduling or memory flag is measured on a workload that can show its cost;
        # blocks measured on another workload serve neither as its reference nor as launch history.
        bench = self.bench
        self.bench = workload_for([c.flag for c in record.changes], bench, mechanisms=self.mechanisms)
        own = self.bench is not bench
        if own:
            history, self.known_good_blocks, self.reference = self.known_good_blocks, [], None
            record.workload = describe_workload(self.bench)
        try:
            await (run_leave_out if record.kind == "leave_out" else run_paired)(self, record, new_text)
        except BaseException as e:
            # Whatever broke (a bug, a lost connection, cancellation), the candidate must not stay.
            if record.decision != "kept":
                why = (
                    f"stopped: {e}"
                    if isinstance(e, BudgetExhausted)
                    else f"trial aborted: {type(e).__name__}: {e}"
                )
                record.decision, record.why = "rolled_back", why
            await self.rollback(record)
            raise
        finally:
            if own:
                self.bench, self.reference = bench, None
                self.known_good_blocks = [] if record.decision == "kept" else history

    async def rollback(self, record: TrialRecord) -> bool:
        """Back to known-good; on failure stop all trials and restore known-good before anything else."""
        outcome = await self.deployment.rollback()
        self.note_restart(outcome)
        if outcome.changed:
            record.restarts += 1
            self.restarts += 1
            self.reference = None  # known-good runs in a new launch: measure it again
        if not outcome.ok:
            await self.restore_after_failed_rollback(record, outcome.error)
        return outcome.ok

    async def restore_after_failed_rollback(self, record: TrialRecord, error: str) -> None:
        """A rollback failed: no further trial; try once more to bring known-good back, healthy."""
        from tools.deploy.health import wait_healthy

        self.halted = f"rollback failed ({error}); known-good restored first, no further trials"
        record.why += f"; ROLLBACK FAILED: {error}"
        with contextlib.suppress(Exception):
            await self.deployment.recover()
        again = await self.deployment.rollback()
        health = await wait_healthy(self.endpoint, timeout=120.0)
        if not (again.ok and health.ok):
            self.halted = f"rollback failed ({error}) and the known-good restore did not come back healthy"
        self.reference = None

    async def combine(self) -> TrialRecord | None:
        """One trial of the changes that improved alone but are not deployed, on top of the best."""
        kept = self.eligible()
        if not kept:
            return None
        merged: dict[str, TrialChange] = {}
        for t in kept:
            for ch in t.changes:
                merged[ch.flag] = ch
        names = ", ".join(merged)
        return await self.run(
            list(merged.values()), reason=f"check that the gains of {names} add up", kind="combined"
        )


async def _finish_before_cancelling(coro: Any) -> None:
    """Run `coro` in its own task; if the caller is cancelled (Ctrl-C), cancel that task too and
    wait until it has finished (its handler rolls the candidate back) before re-raising.

    A bare `asyncio.shield` would let the caller's `Deployment` close (lock released, connection
    gone) while the trial carried on deploying in the background.
    """
    task = asyncio.ensure_future(coro)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        task.cancel()
        while not task.done():
            try:
                await asyncio.wait({task})
            except asyncio.CancelledError:
                continue  # a second interrupt: the rollback still has to finish first
        if not task.cancelled():
            task.exception()  # retrieved: the cancellation below is what the caller sees
        raise
