"""The trial runner: one candidate change, deployed, checked, measured, then kept or rolled back.

Plain code, no LLM: the planner chooses *what* to try; this module decides *how*, and no caller can
skip the correctness probe, the measurement or the rollback. The known-good configuration on the
host is always the best one measured so far, so a run that stops anywhere leaves the best deployed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from agent.trial.paired import PairedTrial
from agent.trial.prune import LeaveOutTrial
from agent.trial.record import BudgetExhausted, TrialChange, TrialRecord, apply_changes
from agent.trial.speculation import judged
from agent.trial.state import RunnerState


class TrialRunner(RunnerState):
    """Runs trials against one `Deployment` within a budget; keeps the best configuration deployed.

    Each candidate goes on top of the best configuration so far (so the kept changes are always
    measured together) and is judged A/B/A: the known-good block measured just before it, the
    candidate, and the known-good block measured after the rollback (see `tools.bench.paired`).
    A likely winner is deployed again and judged on both of its launches before it is kept. Its
    fields, and the methods that change them, are `RunnerState`'s.
    """

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
        refusal = self.lossy_refusal(changes) or too_slow
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
            record.notes += judged(record.speculation)[0]  # the accept lengths, what they made of it
            self.on_event("trial", record.model_dump(mode="json"))
        return record

    async def _deploy_and_measure(self, record: TrialRecord, new_text: str) -> None:
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
            kind = LeaveOutTrial if record.kind == "leave_out" else PairedTrial
            await kind(self, record).run(new_text)
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
