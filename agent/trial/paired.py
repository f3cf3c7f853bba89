"""One trial, A/B/A(/B(/A/B)): known-good block, candidate block, rollback, known-good block, for a
likely winner a second candidate launch judged together with the first, and for a near miss after
two launches a third launch of each side.

A = the deployed best configuration, B = the candidate on top of it. A is measured right before B
(it is running: no restart; the block it had from the last trial settles with this one, see
`known_good_block`); B is measured and abandoned early when no gain of the minimum effect
is possible (not against a launch that just won: it measured high by selection); otherwise the
rollback (which a rejection needs anyway) restarts A and A is measured again, so B sits between two
A blocks and drift cancels. A candidate that wins, or that looks like a winner (an estimate within
a quarter of the minimum effect) but is not established, is deployed again: its probe must pass and
both of its launches against both A launches must show the gain; only then is it committed (this
relaunch is the restart a keep costs anyway, and it halves the launch-to-launch noise that
repetitions inside one launch cannot reduce). One that still looks like a winner after two
launches costs two more restarts: known-good and the candidate are launched and measured once more
and all three launches of each are judged. The A block after a trial is the next trial's A block
before. A clear win at the A/B look (its interval's low end at twice the minimum effect, known-good
measuring as it did before) is kept at once: one restart instead of three.
"""

from __future__ import annotations

import time
from typing import Any

from agent.trial.firstlook import short_first_look, with_first_look
from agent.trial.judge import (
    _best_judged,
    _came_out_slower,
    _clear_win,
    _cmp,
    _drifted,
    _looks_like_a_winner,
    _moved,
    _near_miss,
    _worth_more,
)
from agent.trial.measure import environment_failure, measure
from agent.trial.record import BudgetExhausted, TrialRecord, block_samples, comparison_dict, mean_throughput

BLOCK_LABELS = {
    "before": "known-good before",
    "candidate": "candidate",
    "after": "known-good after",
    "confirm": "candidate, second launch",
    "after_second": "known-good after the second launch",
    "third": "candidate, third launch",
}
"""How each block of a trial is named on the screen (the keys are `TrialRecord.blocks`)."""


async def _block(r: Any, record: TrialRecord | None, name: str, **kw: Any) -> list[Any]:
    """`measure` one block, announced to the screen by name before and with its size after (the
    runner's `on_event("block", ...)`; `RunUI` shows it, the transcript keeps the block's numbers)."""
    info = {"trial": record.number if record is not None else None, "block": name,
            "label": BLOCK_LABELS.get(name, name)}  # fmt: skip
    r.on_event("block", {**info, "state": "start"})
    started = time.monotonic()
    kw.setdefault("start", r.block_reps)
    reps = await measure(r.endpoint, r.bench, on_progress=r.on_progress, **kw)
    r.on_event("block", {**info, "state": "done", "reps": len(reps), "seconds": time.monotonic() - started})
    return reps


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
        errors = "; ".join(e for s in reps for e in s.errors) or "no result"
        r.halted = f"the known-good configuration failed its benchmark ({errors})"
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


async def run_paired(r: Any, record: TrialRecord, new_text: str) -> None:
    """The whole A/B/A trial of `record` (deployed as `new_text`) on runner `r`."""
    on_winner = r.reference is not None and r.reference is r.best_reps
    before = await known_good_block(r, record)
    if not await _deploy(r, record, new_text, "candidate"):
        return
    record.deployed = True
    await r.deployment.keepalive()  # the dead-man's switch must not fire mid-measurement
    if why := await _probe_ok(r, record):
        return await _reject(r, record, why)
    await r.deployment.keepalive()
    cand = await _block(
        r, record, "candidate", more=lambda reps: _worth_more(_cmp(r, before, reps, None), r.bench),
        max_reps=r.max_reps,
    )  # fmt: skip
    record.levels = mean_throughput(cand)
    _record_blocks(r, record, before=before, candidate=cand)
    if any(s.partial for s in cand):
        errors = "; ".join(e for s in cand for e in s.errors) or "failed requests"
        env = environment_failure(errors)
        if env:
            record.environment = env
            r.halted = f"environment failure: {env}"
        return await _reject(r, record, f"errors under load: {errors}")
    r.note_launch(new_text, cand)
    first = _cmp(r, before, cand, None)
    # A block from the launch that just won a trial is biased upward (it was kept because it measured
    # high): an A/B look against it must not stop a candidate early; the after block (a fresh
    # known-good launch, which the rollback costs anyway) decides. Nor may a known-good block that
    # moved far from known-good's latest block before it (a machine load that came or went).
    if first.clear_no and not on_winner and not _moved(r, before):
        record.comparison = comparison_dict(first)
        record.first_look = short_first_look(first, r.bench)
        return await _reject(r, record, f"stopped after {len(cand)} repetitions: {first.summary}")
    clear = _clear_win(r, first, before, on_winner) and not r._lossy_refusal(record.changes)
    if clear and not with_first_look(r, record, first):
        record.comparison = {
            **comparison_dict(first),
            "ab_only": {"verdict": first.verdict, "ratio": first.ratio},
        }
        return await _commit(r, record, first, [cand], note="kept on one launch: a clear win")
    # A/B/A: the rollback restarts known-good; measure it again next to the candidate
    record.decision = "rolled_back"
    after = await _known_good_again(r, record, lambda reps: _cmp(r, before, cand, reps))
    if after is None:
        return
    cmp = _cmp(r, before, cand, after)
    # the A/B look before the second known-good block, kept to show what pairing changed
    record.comparison = {**comparison_dict(cmp), "ab_only": {"verdict": first.verdict, "ratio": first.ratio}}
    _record_blocks(r, record, after=after)
    record.improved = False  # until a second launch agrees
    record.why = cmp.summary
    if cmp.verdict != "improved" and (moved := _drifted(r, cmp)):
        record.disturbed = moved
        record.why += (
            f"; known-good moved {moved['drift'] - 1:+.1%} at c={moved['concurrency']} between its blocks "
            f"(beyond {moved['bound']:.1%}): the machine, not the flag, decided this one"
        )
    if cmp.verdict != "improved" and not _looks_like_a_winner(cmp, r.bench):
        record.first_look = None if record.disturbed else short_first_look(cmp, r.bench)
        return
    if refusal := r._lossy_refusal(record.changes):
        record.why = refusal
        return
    await _second_launch(r, record, new_text, (before, cand, after), cmp)


async def _known_good_again(r: Any, record: TrialRecord, judge: Any, name: str = "after") -> list[Any] | None:
    """Roll back (a new known-good launch), warm it and measure a block (more repetitions while
    `judge(reps)` says they are worth it); it becomes the reference and joins the known-good history.
    None when the rollback or that block failed (trials stop on a failed block)."""
    if not await r.rollback(record):
        return None
    await _warm(r)
    more = lambda reps: _worth_more(judge(reps), r.bench)  # noqa: E731
    good = await _block(r, record, name, more=more, max_reps=r.max_reps)
    if not good or any(s.partial for s in good):
        record.why = "the known-good configuration failed its benchmark after the rollback"
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
    more = lambda reps: _worth_more(judge(reps), r.bench)  # noqa: E731
    name = "confirm" if label == "second launch" else "third"
    block = await _block(r, record, name, more=more, max_reps=r.max_reps)
    r.note_launch(new_text, block)
    return block


async def _second_launch(r: Any, record: TrialRecord, new_text: str, blocks: tuple, cmp: Any) -> None:
    """Deploy the candidate again and judge both of its launches against both known-good ones; a
    near miss gets a third launch of each side. Commit it only if that says improved, else roll back."""
    first = f"{cmp.verdict} on its first launch ({cmp.summary})"
    before, cand, after = blocks
    started = time.monotonic()
    if _came_out_slower(r, after):  # a load then would pass for the candidate's gain: measure it again
        after = await known_good_block(r, record, "after")
    _record_blocks(r, record, after=after)
    confirm = await _launch_again(
        r, record, new_text, "second launch", lambda reps: _cmp(r, before, cand, after, reps)
    )
    if confirm is None:
        record.why = f"{first}; {record.why}"
        return
    _record_blocks(r, record, confirm=confirm)
    final = _cmp(r, before, cand, after, confirm) if not any(s.partial for s in confirm) else None
    launches = [cand, confirm]
    # a third launch: a rollback and two known-good blocks, a launch and a block, as this one took
    pair = 2 * (time.monotonic() - started)
    if final is not None and final.verdict != "improved" and _near_miss(final, r.bench):
        if time.monotonic() + pair > r.deadline or not r.restarts_left(3):
            record.comparison = {**record.comparison, **comparison_dict(final)}
            left = "no time" if r.restarts_left(3) else "no restarts"
            record.near_miss = _best_judged(final)
            return await _reject(
                r, record, f"not established over two launches: {final.summary}; {left} left for a third"
            )
        third_started = time.monotonic()
        third = await _third_launch(r, record, new_text, (before, cand, after, confirm))
        record.third_seconds = time.monotonic() - third_started
        if third is None:
            return
        final, block = third
        launches.append(block)
    short = with_first_look(r, record, final) if final is not None and final.verdict == "improved" else None
    if final is None or final.verdict != "improved" or short:
        record.comparison = {**record.comparison, **(comparison_dict(final) if final else {})}
        if final is not None and _near_miss(final, r.bench):
            record.near_miss = _best_judged(final)
        why = (
            f"not established over {len(launches)} launches: {short or final.summary}"
            if final
            else "errors on a relaunch"
        )
        return await _reject(r, record, why)
    record.comparison = {**record.comparison, **comparison_dict(final)}
    await _commit(r, record, final, launches)


async def _commit(r: Any, record: TrialRecord, final: Any, launches: list[list[Any]], note: str = "") -> None:
    """The candidate, deployed now, becomes known-good."""
    await r.deployment.commit()
    record.levels = mean_throughput([s for block in launches for s in block])
    record.improved = True
    record.decision, record.why = "kept", final.summary + (f" ({note})" if note else "")
    r.best, r.best_reps, r.reference = record, launches[-1], launches[-1]
    r.known_good_blocks = [launches[-1]]  # a new known-good configuration: its own history starts here


async def _third_launch(r: Any, record: TrialRecord, new_text: str, blocks: tuple) -> tuple[Any, list] | None:
    """A near miss: roll back and measure known-good on a third launch, then the candidate on its
    third; (the comparison of three launches a side, the candidate's block) or None when either
    side failed (the record says why; known-good is deployed)."""
    before, cand, after, confirm = blocks
    good = await _known_good_again(
        r, record, lambda reps: _cmp(r, before, cand, after, confirm, (reps, [])), "after_second"
    )
    if good is None:
        return None
    if _came_out_slower(r, good):
        good = await known_good_block(r, record, "after_second")
    judge = lambda reps: _cmp(r, before, cand, after, confirm, (good, reps))  # noqa: E731
    block = await _launch_again(r, record, new_text, "third launch", judge)
    if block is None:
        return None
    _record_blocks(r, record, after_second=good, third=block)
    return (judge(block) if not any(s.partial for s in block) else None), block
