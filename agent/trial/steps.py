"""The steps every kind of trial is made of: measure a block (announced, recorded), measure
known-good in its running launch or after a rollback, deploy a candidate and check its probe, launch it
again, reject or commit. `paired.py` (the A/B/A trial), `prune.py` (leave one member out) and
`spread.py` (the launch spread) build on them. Moved from `paired.py`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from agent.trial.judge import worth_more
from agent.trial.measure import environment_failure, measure
from agent.trial.record import BudgetExhausted, TrialRecord, block_samples, mean_throughput

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


async def _block(r: Any, record: TrialRecord | None, name: str, **kw: Any) -> list[Any]:
    """`measure` one block, announced to the screen by name before and with its size after (the
    runner's `on_event("block", ...)`; `RunUI` shows it, the transcript keeps the block's numbers)."""
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
        r.rep_seconds_seen = seconds / len(reps)
    r.on_event("block", {**info, "state": "done", "reps": len(reps), "seconds": seconds})
    return reps


@contextlib.asynccontextmanager
async def _kept_alive(deployment: Any, *, on: bool) -> AsyncIterator[None]:
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


def _record_blocks(r: Any, record: TrialRecord, **blocks: list[Any]) -> None:
    """How many repetitions each block took, and their numbers (a reviewer can recompute)."""
    metrics = getattr(r.objective, "metrics", ["output_throughput"])
    for name, reps in blocks.items():
        record.blocks[name] = len(reps)
        record.samples[name] = block_samples(reps, metrics)
        record.seeds[name] = [s.seed for s in reps]


async def known_good_block(r: Any, record: TrialRecord | None = None, name: str = "before") -> list[Any]:
    """Known-good measured now in its current launch (no restart). When that launch was measured
    before (the block after the last trial, the baseline), the two blocks settle into one
    (`tools.bench.launches.settle`): a load during either cannot pass a candidate's ordinary speed
    for a gain. The block of a candidate that just won is not settled with but replaced: it was
    kept because it measured high, and would win every disagreement. The result is the reference
    and this launch's entry in the known-good history."""
    from tools.bench.launches import settle

    earlier = r.reference
    if earlier is None:
        await _warm(r)
    reps = await _block(r, record, name, max_reps=r.bench.reps)
    if not reps or any(s.partial for s in reps):
        r.halted = f"the known-good configuration failed its benchmark ({await _failed_block(r, reps)})"
        raise BudgetExhausted(r.halted)
    if earlier is not None and earlier is not r.best_reps:
        reps, aside, why = settle(earlier, reps, r.objective)
        if aside is not None and record is not None:
            record.notes.append(f"known-good ({name}): {why}")
            _record_blocks(r, record, **{f"{name}_set_aside": aside})
    history = [reps if b is earlier else b for b in r.known_good_blocks]  # this launch's entry
    r.known_good_blocks = history if any(b is reps for b in history) else [*history, reps]
    r.reference = reps
    r.note_launch(r.deployed_text, reps)
    return reps


async def _warm(r: Any) -> None:
    """The probe's requests, as every candidate gets before its block: each block of a fresh
    launch is measured after the same warm-up, whichever side it is on."""
    from tools.bench.probe import run_probe

    await run_probe(r.endpoint)


async def down_reason(deployment: Any) -> str | None:
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


async def _failed_block(r: Any, reps: list[Any]) -> str:
    """What a failed block says: its repetitions' errors, and the log's line when the server went down."""
    errors = "; ".join(e for s in reps for e in s.errors) or "no result"
    return errors + went_down(await down_reason(r.deployment))


async def _reject(r: Any, record: TrialRecord, why: str) -> None:
    record.decision, record.why = "rolled_back", why
    await r.rollback(record)


async def _probe_ok(r: Any, record: TrialRecord) -> str | None:
    """None when the outputs may be kept, else why not."""
    from tools.bench.probe import compare_probe, run_probe

    probe = await run_probe(r.endpoint)
    pv = compare_probe(r.baseline.probe, probe)
    record.probe, record.probe_detail = pv.status, str(getattr(pv, "first_diff", "") or "")
    if pv.status == "broken":
        return "outputs are broken"
    if pv.status == "drifting" and not r.allow_lossy:
        return "outputs drift from the baseline (lossy); --allow-lossy not given"
    if refusal := r._lossy_refusal(record.changes):  # marked lossy while this trial ran
        return f"probe {pv.status}, but {refusal}"
    return None


async def _deploy(r: Any, record: TrialRecord, text: str, label: str) -> bool:
    """Deploy `text`; on failure record why (environment or flag) and stop trials if the machine
    itself is the problem or the rollback failed. True when the candidate runs healthy."""
    what = ", ".join(c.describe() for c in record.changes)
    outcome = await r.deployment.deploy(text, reason=f"trial {record.number} ({label}): {what}")
    r.note_restart(outcome)
    record.restarts += 1
    r.restarts += 1
    r.reference = None
    if outcome.ok:
        return True
    record.decision = "rolled_back"
    record.deploy_error, record.log_tail = outcome.error, outcome.log_tail
    if outcome.rolled_back:  # deploy() restored the known-good configuration, one more restart
        record.restarts += 1
        r.restarts += 1
    env = environment_failure(outcome.error, outcome.log_tail)
    if env:
        record.environment = env
        record.why = f"environment failure, not the flag: {env} ({outcome.error.splitlines()[0]})"
        r.halted = f"environment failure: {env}; fix the host, then run again"
    else:
        record.why = f"failed to start: {outcome.error}"
    if "ROLLBACK FAILED" in (outcome.error or ""):
        await r.restore_after_failed_rollback(record, outcome.error)
    return False


async def _known_good_again(r: Any, record: TrialRecord, judge: Any, name: str = "after") -> list[Any] | None:
    """Roll back (a new known-good launch), warm it and measure a block (more repetitions while
    `judge(reps)` says they are worth it); it becomes the reference and joins the known-good history.
    None when the rollback or that block failed (trials stop on a failed block)."""
    if not await r.rollback(record):
        return None
    await _warm(r)
    more = lambda reps: worth_more(judge(reps), r.bench)  # noqa: E731
    good = await _block(r, record, name, more=more, max_reps=r.max_reps)
    if not good or any(s.partial for s in good):
        why = await _failed_block(r, good)
        record.why = f"the known-good configuration failed its benchmark after the rollback ({why})"
        r.halted = record.why
        return None
    r.reference = good
    r.known_good_blocks.append(good)
    r.note_launch(r.deployed_text, good)
    return good


async def _launch_again(
    r: Any, record: TrialRecord, new_text: str, label: str, judge: Any
) -> list[Any] | None:
    """Deploy the candidate once more, check its probe, measure a block (more repetitions while
    `judge(reps)` says they are worth it); None when it did not start or its outputs fail (the
    record says why and the candidate is rolled back)."""
    if not await _deploy(r, record, new_text, label):
        record.why = f"the {label} did not start: {record.why}"
        return None
    await r.deployment.keepalive()
    if why := await _probe_ok(r, record):
        await _reject(r, record, f"{label}: {why}")
        return None
    await r.deployment.keepalive()
    more = lambda reps: worth_more(judge(reps), r.bench)  # noqa: E731
    name = "confirm" if label == "second launch" else "third"
    block = await _block(r, record, name, more=more, max_reps=r.max_reps)
    r.note_launch(new_text, block)
    return block


async def _commit(r: Any, record: TrialRecord, final: Any, launches: list[list[Any]], note: str = "") -> None:
    """The candidate, deployed now, becomes known-good."""
    await r.deployment.commit()
    record.levels = mean_throughput([s for block in launches for s in block])
    record.improved = True
    record.decision, record.why = "kept", final.summary + (f" ({note})" if note else "")
    r.best, r.best_reps, r.reference = record, launches[-1], launches[-1]
    r.known_good_blocks = [launches[-1]]  # a new known-good configuration: its own history starts here
