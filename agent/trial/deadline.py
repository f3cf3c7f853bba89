"""The run's wall-time budget as one deadline every phase reads.

`optagent run --max-minutes M` promises a run that ends within M minutes of the command's start.
One `Deadline`, made once when the session is prepared (`agent.prepare.prepare_session`), keeps
that promise for every phase: a first build of the code index or of the start-up check's venv
starts only if its estimate fits (`agent.context`), the baseline only if its estimate fits, and it
stops between repetitions when the rest no longer does (`agent.prepare`), research starts a flag
only while one more research fits (`agent.policy.planner.research`), and trials end by the same instant through
the runner's `deadline` (`agent.trial.budget.TrialBudget.ends_at`). Each keeps `closing` seconds
for the end (health check, report). No phase keeps a clock of its own: the report's "X min
budget, Y min used" counts from the same start, so what it says is what every phase was held to.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CLOSING_SECONDS = 20.0
"""What a run spends after its last trial besides a final benchmark: the health check, the report and
its plots (5-10 s measured on two cores); every phase ends this much before the wall-time budget does."""


@dataclass(frozen=True)
class Deadline:
    """When the run's wall-time budget ends, and what the end keeps for itself."""

    minutes: float | None = None
    """The budget (--max-minutes); None: no wall-time budget (a chat ends when the user says so)."""
    started: float = field(default_factory=time.monotonic)
    """`time.monotonic()` when the budget's clock started: the command's start."""
    closing: float = CLOSING_SECONDS
    """Seconds kept for the end (`CLOSING_SECONDS`; none without a budget)."""

    @property
    def at(self) -> float:
        """`time.monotonic()` at which the budget ends (infinite without one)."""
        return math.inf if self.minutes is None else self.started + self.minutes * 60

    @property
    def closing_seconds(self) -> float:
        """The seconds kept for the end, 0 without a budget (nothing to keep them from)."""
        return 0.0 if self.minutes is None else self.closing

    def elapsed(self) -> float:
        """Seconds since the budget's clock started."""
        return time.monotonic() - self.started

    def left(self) -> float:
        """Seconds left for work before the end's share (negative once past it; infinite without a budget)."""
        return self.at - self.closing_seconds - time.monotonic()

    def fits(self, seconds: float) -> bool:
        """Whether `seconds` more of work still leave the end its share."""
        return seconds <= self.left()

    def minutes_for(self, seconds: float) -> int:
        """The whole --max-minutes that would hold what ran so far, `seconds` more and the end."""
        return max(1, math.ceil((self.elapsed() + seconds + self.closing) / 60))

    def budget(self) -> str:
        """The budget in the words of the option: `the 0.5 min budget (--max-minutes)`."""
        return f"the {self.minutes:g} min budget (--max-minutes)" if self.minutes is not None else "no budget"


class BudgetTooSmall(Exception):
    """The wall-time budget cannot hold the baseline and the end after it: the run stops before a
    repetition it has no time for, with nothing changed; the message says what would be enough."""


BATCH_SLOWER = 2.5
"""How many times `sweep_seconds` (one request's pace) a baseline may take, for the --max-minutes a
refused one suggests: a sweep of levels 1, 8, 64 took 2.2 times it on the simulated seed (14 s for
6.7 s, two busy cores); a GPU's batches cost less (a decode step at c=64 ~1.5x one alone)."""


def repetitions_within(
    deadline: Deadline, bench: Any, pace: float | None, *, record: Callable[[str, Any], None]
) -> Callable[[list[Any]], None]:
    """The baseline's `before_rep` (`tools.bench.loadgen.run_repeated`): raise `BudgetTooSmall` before
    a repetition when those left do not fit `deadline`. Before the first they are estimated from the
    probe's `pace` (seconds a token, one request alone: `sweep_seconds`, a lower bound, so a baseline
    that could fit is never refused; the --max-minutes suggested allows `BATCH_SLOWER` times it);
    after one, from the time those done took. Each check is `record`ed (a `budget` event)."""
    from tools.bench.workload import sweep_seconds

    first = sweep_seconds(bench, pace) if pace is not None else 0.0
    began: list[float] = []

    def check(done: list[Any]) -> None:
        began.append(time.monotonic())
        each = (began[-1] - began[0]) / len(done) if done else first
        need = (bench.reps - len(done)) * each
        record("budget", {"phase": "baseline", "repetitions_done": len(done), "need_s": round(need, 1),
                          "left_s": round(deadline.left(), 1)})  # fmt: skip
        if deadline.fits(need):
            return
        if done:
            what = (f"the baseline stopped after {len(done)} of {bench.reps} repetitions: each took "
                    f"{each:.0f} s, the {bench.reps - len(done)} left need ~{need:.0f} s")  # fmt: skip
            enough = deadline.minutes_for(need)
        else:
            levels = ", ".join(map(str, bench.concurrency))
            paced = (
                f"the probe's one request alone took {pace * 1000:.1f} ms a token"
                if pace
                else "no pace measured"
            )
            what = (f"the baseline was not started: its {bench.reps} repetitions of concurrency {levels} "
                    f"need at least ~{need:.0f} s ({paced}; a batch is slower)")  # fmt: skip
            enough = deadline.minutes_for(BATCH_SLOWER * need)
        left = max(0.0, deadline.left() + deadline.closing)
        raise BudgetTooSmall(
            f"{what}, and the end ~{deadline.closing:.0f} s; {left:.0f} s are left of {deadline.budget()}. "
            f"--max-minutes {enough} would hold them (trials need more); nothing was changed: the "
            "known-good configuration serves as before"
        )

    return check
