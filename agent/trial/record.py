"""What a trial is about and what it leaves behind: the change, the record, the baseline, and the
block helpers both the runner and the paired launches use (the lower module of `agent.trial`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field


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
    kind: Literal["single", "combined", "bundle", "leave_out"] = "single"
    """single: one flag; combined: flags kept alone, tried together; bundle: small levers tried as
    one change (`agent.policy.trialqueue.plan_bundle`); leave_out: one member of a kept bundle left out
    (`agent.trial.prune`)."""
    changes: list[TrialChange]
    on_top_of: list[TrialChange] = Field(default_factory=list)
    """The kept changes this trial was deployed on top of (empty: on the baseline)."""
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
    planned_seconds: float = 0.0
    """What the budget expected the trial to take when it started (`trial_estimate`; 0: not timed)."""
    third_seconds: float = 0.0
    """Of `seconds`, the third launch's (taken only when the deadline left room for it)."""
    environment: str | None = None
    """Set when the failure was the environment's (port in use, out of disk, host unreachable)."""
    near_miss: dict[str, Any] | None = None
    """Rejected as not established although it still looked like a winner: its judged interval with
    the highest estimate (concurrency, ratio, ci_low, ci_high, launches_candidate). A second look
    at it, on top of the known-good configuration of that moment, may be worth its restarts
    (`agent.policy.trialqueue.next_trials`)."""
    first_look: dict[str, Any] | None = None
    """Rejected on its first launch without the numbers ruling it out (an estimate above no change
    whose interval still reaches the minimum effect): that judged interval (concurrency, ratio,
    ci_low, ci_high, launches_candidate). One more look at the same change, when the run has restarts
    left, is judged together with this launch (`agent.trial.firstlook`)."""
    disturbed: dict[str, Any] | None = None
    """Not decided on its merits: known-good moved far beyond its launch spread between the blocks
    the candidate was judged against (concurrency, drift as a ratio, bound): the machine, not the
    flag. Worth one retry (`agent.policy.trialqueue.next_trials`)."""
    workload: str | None = None
    """The workload both sides were measured on, when not the run's own (a caching, scheduling or
    memory flag on shared prefixes, `tools.bench.workload.workload_for`): its numbers are not
    comparable with the baseline's."""
    notes: list[str] = Field(default_factory=list)
    """What the trial noticed on the way (a known-good block set aside as measured under load)."""
    blocks: dict[str, int] = Field(default_factory=dict)
    """Repetitions measured: known-good before, candidate, known-good after, confirm (the second
    launch), and for a near miss after_second (known-good again) and third (the third launch);
    `<block>_set_aside`: a known-good block of the same launch set aside as measured under load."""
    samples: dict[str, list[dict[int, dict[str, float | None]]]] = Field(default_factory=dict)
    """Per block (as in `blocks`): each repetition's value of the goal's metrics per level, so a
    reviewer can recompute the interval from the transcript (`samples_as_sweeps`)."""
    speculation: dict[str, dict[int, dict[str, float | None]]] = Field(default_factory=dict)
    """Per block, on a speculative server: per level the steps it ran with, its mean accept length
    and TPOT (`agent.trial.speculation`, which judges a change on them)."""
    seeds: dict[str, list[int]] = Field(default_factory=dict)
    """Per block: the seed of each repetition's prompts (repetition r of every block sends seed r's:
    the comparison takes each seed's own speed out, `tools.bench.blockfit`)."""

    def full_changes(self) -> list[TrialChange]:
        """The whole configuration of this trial, relative to the baseline (a leave-out trial: what
        it was on top of, without its changes)."""
        if self.kind == "leave_out":
            out = {c.flag for c in self.changes}
            return [c for c in self.on_top_of if c.flag not in out]
        return [*self.on_top_of, *self.changes]

    def headline(self) -> str:
        """One line for the terminal: the decision and the level that decided it, with its interval
        (`trial 3 [--x 64]: kept: c=64 +4.0% [+1.2..+6.9], no level worse than 3%`; several flags
        as one change: `trial 1 [together: --a + --b]: ...`)."""
        from tools.bench.effect import headline

        what = ", ".join(c.describe() for c in self.changes)
        if self.kind == "leave_out":
            what = f"leave out {what}"
        elif len(self.changes) > 1:  # one effect for all of them: no member's own
            what = "together: " + " + ".join(c.describe() for c in self.changes)
        return f"trial {self.number} [{what}]: {headline(self.model_dump(mode='json'))}"


@dataclass
class Baseline:
    """The reference every trial is compared with: repeated sweeps and probe outputs."""

    reps: list[Any]
    probe: Any
    text: str
    """The unit file text the baseline ran with."""


def block_samples(reps: list[Any], metrics: list[str]) -> list[dict[int, dict[str, float | None]]]:
    """Each repetition of a block: level -> the metrics' values (None where a level failed)."""
    return [
        {lv.max_concurrency: {m: getattr(lv, m) if lv.ok else None for m in metrics} for lv in sweep.levels}
        for sweep in reps
    ]


def samples_as_sweeps(
    block: list[dict[Any, dict[str, float | None]]], seeds: list[int] | None = None
) -> list[Any]:
    """A recorded block back as sweep results (for `tools.bench.paired.paired_compare`), with the
    seeds of its repetitions' prompts (`TrialRecord.seeds`)."""
    from tools.bench.results import LevelResult, SweepResult

    def level(c: Any, values: dict[str, float | None]) -> LevelResult:
        ok = all(v is not None for v in values.values())
        return LevelResult(
            max_concurrency=int(c), num_prompts=1, completed=int(ok), failed=int(not ok), **values
        )

    return [
        SweepResult(
            endpoint="recorded", api="completions", levels=[level(c, v) for c, v in rep.items()], seed=seed
        )
        for rep, seed in zip(block, seeds or [0] * len(block), strict=True)
    ]


def mean_throughput(reps: list[Any]) -> dict[int, float]:
    """Mean output tok/s per concurrency level over repeated sweeps (missing levels left out)."""
    sums: dict[int, list[float]] = {}
    for sweep in reps:
        for lv in sweep.levels:
            if lv.output_throughput is not None:
                sums.setdefault(lv.max_concurrency, []).append(lv.output_throughput)
    return {c: sum(v) / len(v) for c, v in sorted(sums.items())}


def lossy_flags(candidates: list[Any]) -> dict[str, str]:
    """Flag → why, for the playbook candidates (`agent.policy.playbook.Candidate`) whose lever is lossy."""
    return {c.flag: f"playbook: {c.lever.risk or 'changes the outputs'}" for c in candidates if c.lever.lossy}


def mechanism_flags(candidates: list[Any]) -> dict[str, list[str]]:
    """Flag → what it acts on, for the playbook candidates whose lever says (`Lever.mechanism`)."""
    return {c.flag: list(c.lever.mechanism) for c in candidates if getattr(c.lever, "mechanism", None)}


def apply_changes(text: str, changes: list[TrialChange]) -> str:
    """The unit file text with every change applied (validated and quoted by `tools.deploy.units.file`)."""
    from tools.deploy.units.file import UnitFile

    unit = UnitFile.parse(text)
    for ch in changes:
        unit = unit.unset_flag(ch.flag) if ch.action == "unset" else unit.set_flag(ch.flag, ch.value)
    return unit.render()


def comparison_dict(cmp: Any) -> dict[str, Any]:
    """A comparison as JSON-safe data for the trial record."""
    if hasattr(cmp, "model_dump"):
        return cmp.model_dump(mode="json")
    return {k: getattr(cmp, k, None) for k in ("verdict", "ratio", "per_level", "method", "summary")}
