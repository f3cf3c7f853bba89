"""The steps every kind of trial is made of: measure a block (announced, recorded), measure
known-good in its running launch or after a rollback, deploy a candidate and check its probe, launch it
again, reject or commit. A `Trial` is one trial under way, and these are its methods; `PairedTrial`
(`paired.py`, the A/B/A trial) and `LeaveOutTrial` (`prune.py`, one member left out) are the kinds.
Measuring a block and known-good's running launch are functions of the runner too: the spread phase
(`spread.py`) measures them outside any trial."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from agent.trial.judge import Judge, worth_more
from agent.trial.measure import environment_failure, measure
from agent.trial.record import BudgetExhausted, TrialRecord, block_samples, mean_throughput
from agent.trial.speculation import block_acceptance, judged
from agent.trial.state import RunnerState, TrialDeployment

BLOCK_LABELS = {
    "before": "known-good before",
    "candidate": "candidate",
    "after": "known-good after",
    "confirm": "candidate, second launch",
    "after_second": "known-good after the second launch",
    "third": "candidate, third launch",
}
"""How each block of a trial is named on the screen (the keys are `TrialRecord.blocks`)."""
CANDIDATE_BLOCKS = ("candidate", "confirm", "third")
"""The blocks measured on a candidate's launch: a rollback follows each."""

Judgement = Callable[[list[Any]], Any]
"""A block's repetitions so far -> the comparison they would make (`Judge.compare`)."""


async def measure_block(r: RunnerState, record: TrialRecord | None, name: str, **kw: Any) -> list[Any]:
    """`measure` one block, announced to the screen by name before and with its size after (the
    runner's `on_event("block", ...)`; `RunUI` shows it, the transcript keeps the block's numbers).
    A trial's block (`record` given) is measured only while it, and the rollback a candidate needs
    after it, fit the budget."""
    info = {"trial": record.number if record is not None else None, "block": name,
            "label": BLOCK_LABELS.get(name, name)}  # fmt: skip
    kw.setdefault("start", r.block_reps)
    if record is not None:  # a trial's block: it and the rollback a candidate needs after it must fit
        rollback = r.restart_estimate() if name in CANDIDATE_BLOCKS else 0.0
        r.need_time(kw["start"] * r.rep_estimate() + rollback, f"the {info['label']} block")
        if (more := kw.get("more")) is not None:  # another repetition only while it fits too
            kw["more"] = lambda reps: r.fits(r.rep_estimate() + rollback) and more(reps)
    r.on_event("block", {**info, "state": "start"})
    started = time.monotonic()
    async with _kept_alive(r.deployment, on=name in CANDIDATE_BLOCKS):
        reps = await measure(r.endpoint, r.bench, on_progress=r.on_progress, **kw)
    seconds = time.monotonic() - started
    if reps:
        r.note_rep_seconds(seconds / len(reps))
    r.on_event("block", {**info, "state": "done", "reps": len(reps), "seconds": seconds})
    return reps


@contextlib.asynccontextmanager
async def _kept_alive(deployment: TrialDeployment, *, on: bool) -> AsyncIterator[None]:
    """While a candidate's block runs, push the host's dead-man switch on every third of its delay:
    a block longer than the switch would otherwise have the host restore known-good mid-measurement,
    behind the runner's back. A candidate that stops answering is caught by the benchmark's own
    bounds (`BenchConfig.stall_timeout_s`), not kept alive for ever: the block ends on its first stall."""
    delay = getattr(deployment, "deadman_seconds", None)
    if not on or not isinstance(delay, int | float) or delay <= 0:
        yield
        return

    async def push() -> None:
        while True:
            await asyncio.sleep(delay / 3)
            with contextlib.suppress(Exception):  # a missed push: the next one, or the switch, acts
                await deployment.keepalive()

    task = asyncio.create_task(push())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _record_blocks(r: RunnerState, record: TrialRecord, **blocks: list[Any]) -> None:
    """How many repetitions each block took, and their numbers (a reviewer can recompute)."""
    metrics = getattr(r.objective, "metrics", ["output_throughput"])
    for name, reps in blocks.items():
        record.blocks[name] = len(reps)
        record.samples[name] = block_samples(reps, metrics)
        record.seeds[name] = [s.seed for s in reps]
        if accepted := block_acceptance(reps):
            record.speculation[name] = accepted


async def known_good_block(
    r: RunnerState, record: TrialRecord | None = None, name: str = "before"
) -> list[Any]:
    """Known-good measured now in its current launch (no restart). When that launch was measured
    before (the block after the last trial, the baseline), the two blocks settle into one
    (`tools.bench.launches.settle`): a load during either cannot pass a candidate's ordinary speed
    for a gain. The block of a candidate that just won is not settled with but replaced: it was
    kept because it measured high, and would win every disagreement. The result is the reference
    and this launch's entry in the known-good history."""
    from tools.bench.launches import settle

    earlier = r.reference
    if earlier is None:
        await warm(r)
    reps = await measure_block(r, record, name, max_reps=r.bench.reps)
    if not reps or any(s.partial for s in reps):
        r.halt(f"the known-good configuration failed its benchmark ({await _failed_block(r, reps)})")
        raise BudgetExhausted(r.halted)
    if earlier is not None and earlier is not r.best_reps:
        reps, aside, why = settle(earlier, reps, r.objective)
        if aside is not None and record is not None:
            record.notes.append(f"known-good ({name}): {why}")
            _record_blocks(r, record, **{f"{name}_set_aside": aside})
    r.measured_known_good(reps, replacing=earlier)
    return reps


async def warm(r: RunnerState) -> None:
    """The probe's requests, as every candidate gets before its block: each block of a fresh
    launch is measured after the same warm-up, whichever side it is on."""
    from tools.bench.probe import run_probe

    await run_probe(r.endpoint)


async def down_reason(deployment: TrialDeployment) -> str | None:
    """None while the server passes a short health check; else what its log said last ("" when
    nothing readable): a load that took the server down, told apart from requests that failed. Read
    before any restart, which would push the reason out of the log's end."""
    from tools.deploy.health import wait_healthy
    from tools.deploy.serverlog import error_line

    target = getattr(deployment, "target", None)
    if target is None:  # a stand-in deployment (tests, benchmarks) has no server of its own
        return None
    health = await wait_healthy(target.endpoint, timeout=3.0, request_timeout=3.0, api_key=target.api_key)
    return None if health.ok else error_line(await deployment.log_tail()) or ""


def went_down(said: str | None) -> str:
    """The words a failed benchmark's message ends with when the server went down (`down_reason`)."""
    if said is None:
        return ""
    return f"; the server went down under the load{f' (its log: {said})' if said else ''}"


async def _failed_block(r: RunnerState, reps: list[Any]) -> str:
    """What a failed block says: its repetitions' errors, and the log's line when the server went down."""
    errors = "; ".join(e for s in reps for e in s.errors) or "no result"
    return errors + went_down(await down_reason(r.deployment))


class Trial:
    """One trial under way on `runner`, recorded in `record`: the steps every kind is made of. A
    kind (`PairedTrial`, `LeaveOutTrial`) is a subclass whose `run` orders them."""

    def __init__(self, runner: RunnerState, record: TrialRecord) -> None:
        self.runner, self.record = runner, record
        self.judge = Judge(runner)

    async def run(self, new_text: str) -> None:
        """The whole trial of `record`, its candidate deployed as `new_text`."""
        raise NotImplementedError

    async def block(self, name: str, **kw: Any) -> list[Any]:
        """A block of this trial (`measure_block`)."""
        return await measure_block(self.runner, self.record, name, **kw)

    def record_blocks(self, **blocks: list[Any]) -> None:
        """How many repetitions each block took, and their numbers (a reviewer can recompute)."""
        _record_blocks(self.runner, self.record, **blocks)

    async def known_good_block(self, name: str = "before") -> list[Any]:
        """Known-good measured in its running launch, for this trial (`known_good_block`)."""
        return await known_good_block(self.runner, self.record, name)

    async def reject(self, why: str) -> None:
        """Rolled back, for `why`."""
        self.record.decision, self.record.why = "rolled_back", why
        await self.runner.rollback(self.record)

    async def probe_ok(self) -> str | None:
        """None when the outputs may be kept, else why not."""
        from tools.bench.probe import compare_probe, run_probe

        r, record = self.runner, self.record
        probe = await run_probe(r.endpoint)
        pv = compare_probe(r.baseline.probe, probe)
        record.probe, record.probe_detail = pv.status, str(getattr(pv, "first_diff", "") or "")
        if pv.status == "broken":
            return "outputs are broken"
        if pv.status == "drifting" and not r.allow_lossy:
            return "outputs drift from the baseline (lossy); --allow-lossy not given"
        if refusal := r.lossy_refusal(record.changes):  # marked lossy while this trial ran
            return f"probe {pv.status}, but {refusal}"
        return None

    async def deploy(self, text: str, label: str) -> bool:
        """Deploy `text`; on failure record why (environment or flag) and stop trials if the machine
        itself is the problem or the rollback failed. True when the candidate runs healthy."""
        r, record = self.runner, self.record
        what = ", ".join(c.describe() for c in record.changes)
        outcome = await r.deployment.deploy(text, reason=f"trial {record.number} ({label}): {what}")
        r.note_restart(outcome)
        record.restarts += 1
        r.count_restarts()
        if outcome.ok:
            return True
        record.decision = "rolled_back"
        record.deploy_error, record.log_tail = outcome.error, outcome.log_tail
        if outcome.rolled_back:  # deploy() restored the known-good configuration, one more restart
            record.restarts += 1
            r.count_restarts()
        env = environment_failure(outcome.error, outcome.log_tail)
        if env:
            record.environment = env
            record.why = f"environment failure, not the flag: {env} ({outcome.error.splitlines()[0]})"
            r.halt(f"environment failure: {env}; fix the host, then run again")
        else:
            record.why = f"failed to start: {outcome.error}"
        if "ROLLBACK FAILED" in (outcome.error or ""):
            await r.restore_after_failed_rollback(record, outcome.error)
        return False

    async def known_good_again(self, judge: Judgement, name: str = "after") -> list[Any] | None:
        """Roll back (a new known-good launch), warm it and measure a block (more repetitions while
        `judge(reps)` says they are worth it); it becomes the reference and joins the known-good history.
        None when the rollback or that block failed (trials stop on a failed block)."""
        r, record = self.runner, self.record
        if not await r.rollback(record):
            return None
        await warm(r)
        more = lambda reps: worth_more(judge(reps), r.bench)  # noqa: E731
        good = await self.block(name, more=more, max_reps=r.max_reps)
        if not good or any(s.partial for s in good):
            why = await _failed_block(r, good)
            record.why = f"the known-good configuration failed its benchmark after the rollback ({why})"
            r.halt(record.why)
            return None
        r.relaunched_known_good(good)
        return good

    async def launch_again(self, new_text: str, label: str, judge: Judgement) -> list[Any] | None:
        """Deploy the candidate once more, check its probe, measure a block (more repetitions while
        `judge(reps)` says they are worth it); None when it did not start or its outputs fail (the
        record says why and the candidate is rolled back)."""
        r, record = self.runner, self.record
        if not await self.deploy(new_text, label):
            record.why = f"the {label} did not start: {record.why}"
            return None
        await r.deployment.keepalive()
        if why := await self.probe_ok():
            await self.reject(f"{label}: {why}")
            return None
        await r.deployment.keepalive()
        more = lambda reps: worth_more(judge(reps), r.bench)  # noqa: E731
        name = "confirm" if label == "second launch" else "third"
        block = await self.block(name, more=more, max_reps=r.max_reps)
        r.note_launch(new_text, block)
        return block

    async def commit(self, final: Any, launches: list[list[Any]], note: str = "") -> None:
        """The candidate, deployed now, becomes known-good, unless speculation stopped paying with
        it (`agent.trial.speculation`): then it is rolled back."""
        record = self.record
        if why := judged(record.speculation)[1]:
            return await self.reject(f"{final.summary}; but {why}")
        await self.runner.deployment.commit()
        record.levels = mean_throughput([s for block in launches for s in block])
        record.improved = True
        record.decision, record.why = "kept", final.summary + (f" ({note})" if note else "")
        self.runner.adopt(record, launches[-1])
