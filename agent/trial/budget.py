"""The trial runner's budget: what a trial costs in wall time and restarts, how many more fit, and
whether the next may start. Moved from `runner.py`; `TrialRunner` inherits these methods (they read
its baseline, trials, launch times, deadline and restart counts)."""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from agent.trial.record import BudgetExhausted, TrialChange

TRIAL_RESTARTS = 4
"""Restarts one trial may need without a third launch: A/B/A (deploy, rollback), a second launch
and the rollback after it."""


class TrialBudget:
    """`TrialRunner`'s budget methods (see the runner for the attributes they read)."""

    def trial_estimate(self, changes: list[TrialChange] | None = None) -> float:
        """Seconds the next trial (of `changes`, when known) may take if it wins on its second
        launch: a winner's blocks (known-good, candidate, known-good, confirm) at the time one baseline
        repetition took in this run, and its three restarts (deploy, rollback, the second launch) at
        `restart_estimate`; or the longest trial measured without its third launch when one took
        longer; plus, for a flag that starts slowly (`slow_starts`), what its two launches take beyond
        an ordinary restart. (Counted with two
        restarts a repetition long, the first trial on the simulated 4 x H100 Llama-70B was planned at
        164 s and took 239-274 s; now 241 s.) A third launch is not budgeted here: it starts only if
        the deadline leaves room for it (`PairedTrial._second_launch`).
        Trials on the workload this one runs on set the figure (a trial on the shared-prefix mix
        took 346 s where one on random prompts took 243 s, and the longer one left torch.compile
        untried with 5.5 of 18 minutes left); until one has, every trial does."""
        restart = self.restart_estimate()
        shape = 4 * self.block_reps * rep_seconds(self.baseline.reps) + 3 * restart
        done = [t for t in self.trials if t.deployed]
        here = self._workload(changes or [])
        same = [t for t in done if self._workload(t.changes) == here]
        longest = max([shape] + [t.seconds - t.third_seconds for t in same or done])
        cost = max([self.slow_starts.get(c.flag, 1.0) for c in changes or []] + [1.0])
        return longest + 2 * (cost - 1) * restart

    def _workload(self, changes: list[TrialChange]) -> Any:
        """The workload a trial of `changes` is measured on (`tools.bench.workload.workload_for`)."""
        from tools.bench.workload import workload_for

        return workload_for([c.flag for c in changes], self.bench, mechanisms=self.mechanisms).workload

    def trial_cost(self, flag: str) -> float:
        """How many ordinary trials' time a trial of `flag` takes (`trial_estimate` of it over that of
        any trial): 1, more for a flag that starts slowly, as much more as its two longer launches
        add to a trial here (little where the benchmark blocks dominate a trial, much where start-up does)."""
        slow = self.slow_starts.get(flag, 1.0)
        ordinary = self.trial_estimate()
        if slow == 1.0 or ordinary <= 0 or not self.launch_seconds:  # untimed: the playbook's figure
            return slow
        return self.trial_estimate([TrialChange(flag=flag)]) / ordinary

    def ends_at(self) -> float:
        """`time.monotonic()` by which trials must be over: the run's deadline less what it does
        after them (`closing_seconds`: health, report), and less a block on the user's workload
        when the kept change was judged on another (the final check before and after)."""
        final = self.bench.reps * self.rep_estimate() if self.best is not None and self.best.workload else 0.0
        return self.deadline - self.closing_seconds - final

    def rep_estimate(self) -> float:
        """Seconds one repetition (a sweep) takes: the latest block's, else the baseline's."""
        return self.rep_seconds_seen or rep_seconds(self.baseline.reps)

    def restart_estimate(self) -> float:
        """Seconds a restart takes until healthy: the median one so far, else a repetition's."""
        return statistics.median(self.launch_seconds) if self.launch_seconds else self.rep_estimate()

    def fits(self, seconds: float) -> bool:
        """Whether `seconds` more still end before `ends_at`."""
        return time.monotonic() + seconds <= self.ends_at()

    def need_time(self, seconds: float, what: str) -> None:
        """Raise `BudgetExhausted` (trials stop; the trial under way rolls back) when `seconds` more
        for `what` do not fit: a trial that runs over its estimate stops at this safe point rather
        than overrunning the budget it was started in."""
        if not self.fits(seconds):
            left = max(0.0, self.ends_at() - time.monotonic())
            self.exhausted = (
                f"wall-time budget: {what} needs ~{seconds:.0f} s and {left:.0f} s are left before the "
                "final check; stopped at a safe point"
            )
            raise BudgetExhausted(self.exhausted)

    def note_restart(self, outcome: Any) -> None:
        """Count a deploy's or rollback's time (when it restarted something)."""
        if getattr(outcome, "changed", True) and getattr(outcome, "seconds", 0) > 0:
            self.launch_seconds.append(outcome.seconds)

    def trials_left(self) -> float:
        """About how many more ordinary trials' time the budget fits (to a tenth): the wall time left
        over what a trial took in this run on average (`trial_estimate` before any), the restarts
        left over a trial's average (two before any: deploy and rollback), and the trial count left;
        at least one while `budget_left` lets another start, none when it does not. The planner
        counts a slow start's trial against it at its `trial_cost` (`agent.policy.trialqueue.fit_budget`)."""
        if self.budget_left() is not None:
            return 0.0
        done = [t for t in self.trials if t.deployed]
        seconds = sum(t.seconds for t in done) / len(done) if done else self.trial_estimate()
        restarts = sum(t.restarts for t in done) / len(done) if done else 2.0
        fits = [float(self.max_trials - len(self.trials))]
        if self.deadline != float("inf"):
            fits.append((self.ends_at() - time.monotonic()) / max(seconds, 1e-9))
        if self.max_restarts is not None:
            fits.append((self.max_restarts - self.restarts) / max(restarts, 1.0))
        return max(1.0, math.floor(min(fits) * 10) / 10)

    def budget_left(self, *, reserve: float = 0.0, changes: list[TrialChange] | None = None) -> str | None:
        """None when another trial (of `changes`, when known) may start, leaving `reserve`
        seconds, else why not."""
        if self.halted:
            return f"trials stopped: {self.halted}"
        if len(self.trials) >= self.max_trials:
            return f"trial budget spent ({self.max_trials} trials)"
        if not self.restarts_left(TRIAL_RESTARTS):
            return f"restart budget spent ({self.restarts} of {self.max_restarts}; a trial may need {TRIAL_RESTARTS})"
        if not self.fits(self.trial_estimate(changes) + reserve):
            slow = [c.flag for c in changes or [] if c.flag in self.slow_starts]
            return "wall-time budget spent" + (
                f" (a start with {', '.join(slow)} takes longer)" if slow else ""
            )
        return None

    def restarts_left(self, n: int) -> bool:
        """Whether `n` more restarts fit the restart budget."""
        return self.max_restarts is None or self.restarts + n <= self.max_restarts


def rep_seconds(reps: list[Any]) -> float:
    """Mean wall seconds of one repetition (a sweep) of `reps`, from their start and end times (0
    when they carry none)."""
    from datetime import datetime

    spans = []
    for sweep in reps:
        try:
            start, end = datetime.fromisoformat(sweep.started_at), datetime.fromisoformat(sweep.finished_at)
        except (AttributeError, TypeError, ValueError):
            continue
        spans.append(max(0.0, (end - start).total_seconds()))
    return sum(spans) / len(spans) if spans else 0.0
