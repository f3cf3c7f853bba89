"""What the trial runner holds, and the only code that changes it: the deployment and the goal,
known-good (the best configuration so far) with every block measured of it, the restarts spent and
the launch spread assumed. `TrialRunner` (`runner.py`) runs trials on it; a trial's steps
(`steps.py`), the spread phase (`spread.py`) and the judge read it, and change it only through the
methods here."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.trial.budget import TrialBudget
from agent.trial.record import Baseline, TrialChange, TrialRecord, apply_changes
from tools.config import BenchConfig

EventFn = Callable[[str, dict[str, Any]], None]


class TrialDeployment(Protocol):
    """What trials need of the target (`tools.deploy.deployment.Deployment`, or a stand-in in tests
    and benchmarks): every change of the server goes through it."""

    async def deploy(self, new_text: str, *, reason: str = "") -> Any: ...

    async def rollback(self) -> Any: ...

    async def commit(self) -> Any: ...

    async def keepalive(self) -> Any: ...

    async def recover(self) -> Any: ...

    async def log_tail(self) -> str: ...


@dataclass
class RunnerState(TrialBudget):
    """The trial runner's fields (`TrialRunner` inherits them), and the methods that change them as
    trials deploy, measure, roll back and keep."""

    deployment: TrialDeployment
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
    waiting_value: float = 0.0
    """What the best candidate still untried is worth per ordinary trial (certainty x plausible
    gain / restart cost, the planner's `expected_value`), as the planner saw it before this trial;
    0: none waits. A near miss's third launch that would take its restarts must be worth more."""
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
    `bench.launch_noise`; `agent.trial.spread.measure_spread` sets the deployment's own through `assume_spread`)."""
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

    def lossy_refusal(self, changes: list[TrialChange]) -> str | None:
        """Why `changes` may not be deployed nor kept (known lossy, and `allow_lossy` not given), or None."""
        why = None if self.allow_lossy else self.lossy_reason(changes)
        return f"{why}; --allow-lossy not given" if why else None

    def count_restarts(self, n: int = 1) -> None:
        """`n` restarts of the server: the running launch of known-good (if any) is not measured yet."""
        self.restarts += n
        self.reference = None

    def halt(self, why: str) -> None:
        """No further trial: `why` (a failed rollback, an environment failure, unsteady launches)."""
        self.halted = why

    def measured_known_good(self, block: list[Any], *, replacing: list[Any] | None) -> None:
        """`block` measured known-good's running launch (settled with `replacing`, that launch's
        earlier block, when there was one): it is the reference and this launch's entry in the
        known-good history."""
        history = [block if b is replacing else b for b in self.known_good_blocks]  # this launch's entry
        self.known_good_blocks = history if any(b is block for b in history) else [*history, block]
        self.reference = block
        self.note_launch(self.deployed_text, block)

    def relaunched_known_good(self, block: list[Any]) -> None:
        """`block` measured known-good on a new launch (after a rollback): the reference, one more
        entry of its history."""
        self.reference = block
        self.known_good_blocks.append(block)
        self.note_launch(self.deployed_text, block)

    def measured_launch(self, block: list[Any]) -> None:
        """`block` measured a relaunch of known-good in the spread phase: the reference (it joins
        the history with `history_from_reference`)."""
        self.reference = block

    def history_from_reference(self) -> None:
        """Known-good's history starts again at the running launch's block, when it was measured."""
        if self.reference is not None:
            self.known_good_blocks = [self.reference]

    def adopt(self, record: TrialRecord, block: list[Any]) -> None:
        """`record`'s configuration, committed, is known-good now; `block` measured its running launch."""
        self.best, self.best_reps, self.reference = record, block, block
        self.known_good_blocks = [block]  # a new known-good configuration: its own history starts here

    def assume_spread(
        self,
        prior: tuple[float, float | None],
        *,
        block_reps: int | None = None,
        launches: list[list[Any]] | None = None,
    ) -> None:
        """The restart spread every interval assumes from now (value, degrees of freedom); when it was
        measured on `launches` of known-good (one block each), the repetitions a block starts with,
        and those launches as known-good's history (their spread is in `prior`: not pooled again)."""
        self.launch_prior = prior
        if launches is None:
            return
        if block_reps is not None:
            self.block_reps = block_reps
        # the running launch, when measured, is the last
        self.prior_blocks = [b for b in launches if b is not self.reference]
        self.known_good_blocks = list(launches)

    def expect_gain(self, largest: float | None) -> None:
        """The largest gain a candidate may bring here, known once the baseline's load is read."""
        self.largest_gain = largest

    def waiting(self, value: float) -> None:
        """The best untried candidate's value per ordinary trial, before the next trial starts."""
        self.waiting_value = max(0.0, value)

    def rebaselined(self, baseline: Baseline) -> None:
        """`baseline` measured known-good's running launch just now (a chat's first trial): the
        reference, one more entry of known-good's history."""
        self.baseline = baseline
        self.reference = list(baseline.reps)
        self.known_good_blocks.append(self.reference)

    def undone(self, previous: TrialRecord | None) -> None:
        """The last kept trial was rolled back and committed (chat's undo): `previous` (None: the
        baseline) is known-good again, its new launch not measured yet, its history starting anew."""
        self.best, self.best_reps, self.reference = previous, None, None
        self.known_good_blocks = []

    def resumed(self, trials: list[TrialRecord], restarts: int) -> None:
        """A resumed session's earlier `trials` and `restarts` count against this one's budget."""
        self.trials, self.restarts = trials, restarts

    def note_rep_seconds(self, seconds: float) -> None:
        """One repetition of the latest block took `seconds` (`rep_estimate`)."""
        self.rep_seconds_seen = seconds

    async def rollback(self, record: TrialRecord) -> bool:
        """Back to known-good; on failure stop all trials and restore known-good before anything else."""
        outcome = await self.deployment.rollback()
        self.note_restart(outcome)
        if outcome.changed:
            record.restarts += 1
            self.count_restarts()  # known-good runs in a new launch: measure it again
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
