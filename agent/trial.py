"""The trial runner: one candidate change, deployed, checked, measured, then kept or rolled back.

Plain code, no LLM: the planner chooses *what* to try; this module decides *how*, and no caller can
skip the correctness probe, the measurement or the rollback. The known-good configuration on the
host is always the best one measured so far, so a run that stops anywhere leaves the best deployed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from tools.config import BenchConfig

EventFn = Callable[[str, dict[str, Any]], None]


class BudgetExhausted(Exception):
    """No trial budget (count or wall time) is left; carries the reason into the transcript."""


class TrialChange(BaseModel):
    """One flag change: set (with a value, or boolean) or unset."""

    flag: str = Field(description="server flag with leading dashes, e.g. --cuda-graph-max-bs")
    value: str | None = Field(None, description="value; omit for a boolean flag")
    action: Literal["set", "unset"] = "set"

    def describe(self) -> str:
        """`--flag value`, `--flag` or `unset --flag`."""
        if self.action == "unset":
            return f"unset {self.flag}"
        return self.flag if self.value is None else f"{self.flag} {self.value}"


class TrialRecord(BaseModel):
    """Everything one trial did and measured; saved in the transcript and the report."""

    number: int
    kind: Literal["single", "combined"] = "single"
    changes: list[TrialChange]
    reason: str = ""
    override: str | None = None
    """Why a flag research rejected was deployed anyway (the planner's words)."""
    deployed: bool = False
    deploy_error: str | None = None
    log_tail: str | None = None
    probe: str | None = None
    probe_detail: str | None = None
    comparison: dict[str, Any] | None = None
    levels: dict[int, float] = Field(default_factory=dict)
    """Mean output tok/s per concurrency level over the repetitions."""
    decision: Literal["kept", "rolled_back", "skipped"] = "skipped"
    improved: bool = False
    """Improved on the baseline (eligible for the combined trial) even if a better one is deployed."""
    why: str = ""
    restarts: int = 0
    seconds: float = 0.0

    def headline(self) -> str:
        """One line for the terminal and the report."""
        what = ", ".join(c.describe() for c in self.changes)
        ratio = (self.comparison or {}).get("ratio")
        gain = f" ({(ratio - 1) * 100:+.1f}%)" if isinstance(ratio, float) else ""
        return f"trial {self.number} [{what}]: {self.decision.replace('_', ' ')}{gain}: {self.why}"


@dataclass
class Baseline:
    """The reference every trial is compared with: repeated sweeps and probe outputs."""

    reps: list[Any]
    probe: Any
    text: str
    """The unit file text the baseline ran with."""


def mean_throughput(reps: list[Any]) -> dict[int, float]:
    """Mean output tok/s per concurrency level over repeated sweeps (missing levels left out)."""
    sums: dict[int, list[float]] = {}
    for sweep in reps:
        for lv in sweep.levels:
            if lv.output_throughput is not None:
                sums.setdefault(lv.max_concurrency, []).append(lv.output_throughput)
    return {c: sum(v) / len(v) for c, v in sorted(sums.items())}


def lossy_flags(candidates: list[Any]) -> dict[str, str]:
    """Flag → why, for the playbook candidates (`agent.playbook.Candidate`) whose lever is lossy."""
    return {c.flag: f"playbook: {c.lever.risk or 'changes the outputs'}" for c in candidates if c.lever.lossy}


def apply_changes(text: str, changes: list[TrialChange]) -> str:
    """The unit file text with every change applied (validated and quoted by `tools.unitfile`)."""
    from tools.unitfile import UnitFile

    unit = UnitFile.parse(text)
    for ch in changes:
        unit = unit.unset_flag(ch.flag) if ch.action == "unset" else unit.set_flag(ch.flag, ch.value)
    return unit.render()


@dataclass
class TrialRunner:
    """Runs trials against one `Deployment` within a budget; keeps the best configuration deployed."""

    deployment: Any
    endpoint: str
    bench: BenchConfig
    objective: Any
    baseline: Baseline
    allow_lossy: bool = False
    lossy: dict[str, str] = field(default_factory=dict)
    """Flags known to change outputs (playbook lever or research verdict) → why; without
    `allow_lossy` a change of one is never deployed nor kept, whatever the probe says."""
    max_trials: int = 12
    deadline: float = float("inf")
    """`time.monotonic()` after which no new trial starts."""
    on_event: EventFn = lambda kind, data: None
    on_progress: Callable[[Any], None] | None = None
    trials: list[TrialRecord] = field(default_factory=list)
    best: TrialRecord | None = None
    best_reps: list[Any] | None = None
    restarts: int = 0

    @property
    def deployed_text(self) -> str:
        """The unit file text of the best configuration (the baseline when nothing was kept)."""
        if self.best is None:
            return self.baseline.text
        return apply_changes(self.baseline.text, self.best.changes)

    def budget_left(self) -> str | None:
        """None when another trial may start, else why not."""
        if len(self.trials) >= self.max_trials:
            return f"trial budget spent ({self.max_trials} trials)"
        done = [t.seconds for t in self.trials if t.deployed]
        estimate = max(done) if done else 0.0
        if time.monotonic() + estimate > self.deadline:
            return "wall-time budget spent"
        return None

    def lossy_reason(self, changes: list[TrialChange]) -> str | None:
        """Why `changes` are known to be lossy (None when none is), from `lossy`."""
        found = [f"{c.flag} ({self.lossy[c.flag]})" for c in changes if c.flag in self.lossy]
        return "known lossy: " + "; ".join(found) if found else None

    def _lossy_refusal(self, changes: list[TrialChange]) -> str | None:
        why = None if self.allow_lossy else self.lossy_reason(changes)
        return f"{why}; --allow-lossy not given" if why else None

    def eligible(self) -> list[TrialRecord]:
        """Single trials that improved on the baseline, best first."""
        singles = [t for t in self.trials if t.kind == "single" and t.improved]
        return sorted(singles, key=lambda t: -(t.comparison or {}).get("ratio", 1.0))

    async def run(
        self,
        changes: list[TrialChange],
        *,
        reason: str,
        kind: Literal["single", "combined"] = "single",
        override: str | None = None,
    ) -> TrialRecord:
        """Deploy `changes` on top of the baseline, probe, measure, then keep or roll back.

        Raises `BudgetExhausted` before touching the target when no budget is left. Whatever
        happens inside (including cancellation), the target ends on the best known configuration.
        """
        why_not = self.budget_left()
        if why_not:
            raise BudgetExhausted(why_not)
        record = TrialRecord(
            number=len(self.trials) + 1, kind=kind, changes=changes, reason=reason, override=override
        )
        self.trials.append(record)
        started = time.monotonic()
        refusal = self._lossy_refusal(changes)
        if refusal:
            record.why = f"refused before deploying: {refusal}"
            self.on_event("trial", record.model_dump(mode="json"))
            return record
        try:
            new_text = apply_changes(self.baseline.text, changes)
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
        try:
            await self._trial(record, new_text)
        except BaseException as e:
            # Whatever broke (a bug, a lost connection, cancellation), the candidate must not stay.
            record.decision, record.why = "rolled_back", f"trial aborted: {type(e).__name__}: {e}"
            await self._rollback(record)
            raise

    async def _rollback(self, record: TrialRecord) -> None:
        outcome = await self.deployment.rollback()
        if outcome.changed:
            record.restarts += 1
            self.restarts += 1

    async def _trial(self, record: TrialRecord, new_text: str) -> None:
        from tools.bench.loadgen import run_repeated
        from tools.bench.probe import compare_probe, run_probe
        from tools.bench.stats import compare

        what = ", ".join(c.describe() for c in record.changes)
        outcome = await self.deployment.deploy(new_text, reason=f"trial {record.number}: {what}")
        record.restarts += 1
        self.restarts += 1
        if not outcome.ok:
            record.decision = "rolled_back"
            record.deploy_error, record.log_tail = outcome.error, outcome.log_tail
            record.why = f"failed to start: {outcome.error}"
            # deploy() restored the known-good configuration itself, with one more restart.
            if outcome.rolled_back:
                record.restarts += 1
                self.restarts += 1
            return
        record.deployed = True
        await self.deployment.keepalive()  # the dead-man's switch must not fire mid-measurement
        probe = await run_probe(self.endpoint)
        pv = compare_probe(self.baseline.probe, probe)
        record.probe, record.probe_detail = pv.status, str(getattr(pv, "first_diff", "") or "")
        if pv.status == "broken":
            return await self._reject(record, "outputs are broken")
        if pv.status == "drifting" and not self.allow_lossy:
            return await self._reject(
                record, "outputs drift from the baseline (lossy); --allow-lossy not given"
            )
        if refusal := self._lossy_refusal(record.changes):  # marked lossy while this trial ran
            return await self._reject(record, f"probe {pv.status}, but {refusal}")
        await self.deployment.keepalive()
        reps = await run_repeated(self.endpoint, self.bench, on_progress=self.on_progress)
        record.levels = mean_throughput(reps)
        if any(s.partial for s in reps):
            errors = "; ".join(e for s in reps for e in s.errors) or "failed requests"
            return await self._reject(record, f"errors under load: {errors}")
        cmp = compare(
            self.baseline.reps,
            reps,
            self.objective,
            min_effect=self.bench.min_effect,
            regress_tolerance=self.bench.regress_tolerance,
            launch_noise=self.bench.launch_noise,
        )
        record.comparison = _comparison_dict(cmp)
        record.improved = cmp.verdict == "improved"
        if not record.improved:
            return await self._reject(record, cmp.summary)
        if self.best is not None and self.best_reps is not None:
            # Against the best so far directly, not through the older baseline: drift cancels out.
            vs_best = compare(
                self.best_reps,
                reps,
                self.objective,
                min_effect=self.bench.min_effect,
                regress_tolerance=self.bench.regress_tolerance,
                launch_noise=self.bench.launch_noise,
            )
            record.comparison["vs_best"] = {"trial": self.best.number, **_comparison_dict(vs_best)}
            if vs_best.verdict != "improved":
                return await self._reject(
                    record,
                    f"improved on the baseline ({cmp.summary}) but not on trial {self.best.number}, "
                    f"which stays deployed ({vs_best.summary})",
                )
        if refusal := self._lossy_refusal(record.changes):
            return await self._reject(record, refusal)
        await self.deployment.commit()
        record.decision, record.why = "kept", cmp.summary
        self.best, self.best_reps = record, reps

    async def _reject(self, record: TrialRecord, why: str) -> None:
        record.decision, record.why = "rolled_back", why
        await self._rollback(record)

    async def combine(self) -> TrialRecord | None:
        """One trial of every flag kept individually, together; None when fewer than two were kept."""
        kept = self.eligible()
        if len(kept) < 2:
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


def _comparison_dict(cmp: Any) -> dict[str, Any]:
    if hasattr(cmp, "model_dump"):
        return cmp.model_dump(mode="json")
    return {k: getattr(cmp, k, None) for k in ("verdict", "ratio", "per_level", "method", "summary")}
