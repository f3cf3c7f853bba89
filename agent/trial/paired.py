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
and all three launches of each are judged; so does a small improvement the same at every level
(`launch_like`: the restart spread moves every level alike). The A block after a trial is the next
trial's A block before. A clear win at the A/B look (its interval's low end at twice the minimum
effect, known-good measuring as it did before) is kept at once: one restart instead of three.
The steps it is made of (a block, a deploy and its probe, a rollback, a commit) are in
`agent.trial.steps` (`Trial`, which this one extends).
"""

from __future__ import annotations

import time
from typing import Any

from agent.trial.budget import TRIAL_RESTARTS
from agent.trial.firstlook import log_estimate, look_value, short_first_look, with_first_look
from agent.trial.judge import best_judged, launch_like, looks_like_a_winner, near_miss, worth_more
from agent.trial.measure import environment_failure
from agent.trial.record import comparison_dict, mean_throughput
from agent.trial.state import RunnerState
from agent.trial.steps import Trial, down_reason, went_down

THIRD_RESTARTS = 3
"""A near miss's third launch: a rollback to known-good, the candidate once more, and its end."""


def crowds_out(r: RunnerState, miss: dict[str, Any], seconds: float) -> str | None:
    """Why a near miss's third launch gives way to the candidate waiting (None: it goes ahead). Only
    when the budget cannot fit both the third launch and one more trial: then the third launch is
    valued as a look at what it measured (`look_value`: the chance the gain is real times the gain,
    for its restarts against a trial's) and the waiting candidate as the planner values it."""
    if r.waiting_value <= 0:
        return None
    both = r.restarts_left(THIRD_RESTARTS + TRIAL_RESTARTS) and r.fits(seconds + r.trial_estimate())
    if both:
        return None
    worth = look_value([log_estimate(miss)], THIRD_RESTARTS / TRIAL_RESTARTS)
    if worth >= r.waiting_value:
        return None
    return (
        f"a third launch, worth {worth:.2%} a trial here, would take the restarts of the candidate "
        f"waiting, worth {r.waiting_value:.2%}"
    )


class PairedTrial(Trial):
    """One trial, A/B/A(/B(/A/B)), of `record`'s changes on top of known-good (see above)."""

    async def run(self, new_text: str) -> None:
        """The whole A/B/A trial of `record` (deployed as `new_text`). One piece because it is the
        protocol in the order it runs: each measurement, then the decision it allows (reject, keep on
        a clear win, roll back), every early return one of them; the second launch is its own method."""
        r, record = self.runner, self.record
        on_winner = r.reference is not None and r.reference is r.best_reps
        before = await self.known_good_block()
        if not await self.deploy(new_text, "candidate"):
            return
        record.deployed = True
        await r.deployment.keepalive()  # the dead-man's switch must not fire mid-measurement
        if why := await self.probe_ok():
            return await self.reject(why)
        await r.deployment.keepalive()
        cand = await self.block(
            "candidate", more=lambda reps: worth_more(self.judge.compare(before, reps, None), r.bench),
            max_reps=r.max_reps,
        )  # fmt: skip
        record.levels = mean_throughput(cand)
        self.record_blocks(before=before, candidate=cand)
        if any(s.partial for s in cand):
            errors = "; ".join(e for s in cand for e in s.errors) or "failed requests"
            env = environment_failure(errors)
            if env:
                record.environment = env
                r.halt(f"environment failure: {env}")
            down = went_down(await down_reason(r.deployment))  # read before the rollback restarts it
            return await self.reject(f"errors under load: {errors}{down}")
        r.note_launch(new_text, cand)
        first = self.judge.compare(before, cand, None)
        # A block from the launch that just won a trial is biased upward (it was kept because it measured
        # high): an A/B look against it must not stop a candidate early; the after block (a fresh
        # known-good launch, which the rollback costs anyway) decides. Nor may a known-good block that
        # moved far from known-good's latest block before it (a machine load that came or went).
        if first.clear_no and not on_winner and not self.judge.moved(before):
            record.comparison = comparison_dict(first)
            record.first_look = short_first_look(first, r.bench)
            return await self.reject(f"stopped after {len(cand)} repetitions: {first.summary}")
        clear = self.judge.clear_win(first, before, on_winner) and not r.lossy_refusal(record.changes)
        if clear and not with_first_look(r, record, first):
            record.comparison = {
                **comparison_dict(first),
                "ab_only": {"verdict": first.verdict, "ratio": first.ratio},
            }
            return await self.commit(first, [cand], note="kept on one launch: a clear win")
        # A/B/A: the rollback restarts known-good; measure it again next to the candidate
        record.decision = "rolled_back"
        after = await self.known_good_again(lambda reps: self.judge.compare(before, cand, reps))
        if after is None:
            return
        cmp = self.judge.compare(before, cand, after)
        # the A/B look before the second known-good block, kept to show what pairing changed
        record.comparison = {
            **comparison_dict(cmp),
            "ab_only": {"verdict": first.verdict, "ratio": first.ratio},
        }
        self.record_blocks(after=after)
        record.improved = False  # until a second launch agrees
        record.why = cmp.summary
        if cmp.verdict != "improved" and (moved := self.judge.drifted(cmp)):
            record.disturbed = moved
            record.why += (
                f"; known-good moved {moved['drift'] - 1:+.1%} at c={moved['concurrency']} between its blocks "
                f"(beyond {moved['bound']:.1%}): the machine, not the flag, decided this one"
            )
        if cmp.verdict != "improved" and not looks_like_a_winner(cmp, r.bench):
            record.first_look = None if record.disturbed else short_first_look(cmp, r.bench)
            return
        if refusal := r.lossy_refusal(record.changes):
            record.why = refusal
            return
        if not r.fits(2 * r.restart_estimate() + r.block_reps * r.rep_estimate()):
            record.near_miss = best_judged(cmp) if near_miss(cmp, r.bench) else None
            record.why = (
                f"{cmp.verdict} on its first launch ({cmp.summary}); no time left for the second launch"
            )
            return
        await self._second_launch(new_text, (before, cand, after), cmp)

    async def _second_launch(self, new_text: str, blocks: tuple, cmp: Any) -> None:
        """Deploy the candidate again and judge both of its launches against both known-good ones; a
        near miss gets a third launch of each side. Commit it only if that says improved, else roll back."""
        r, record = self.runner, self.record
        first = f"{cmp.verdict} on its first launch ({cmp.summary})"
        before, cand, after = blocks
        started = time.monotonic()
        # a load then would pass for the candidate's gain: measure it again
        if self.judge.came_out_slower(after, cmp):
            after = await self.known_good_block("after")
        self.record_blocks(after=after)
        confirm = await self.launch_again(
            new_text, "second launch", lambda reps: self.judge.compare(before, cand, after, reps)
        )
        if confirm is None:
            record.why = f"{first}; {record.why}"
            return
        self.record_blocks(confirm=confirm)
        final = (
            self.judge.compare(before, cand, after, confirm) if not any(s.partial for s in confirm) else None
        )
        launches = [cand, confirm]
        # a third launch: a rollback and two known-good blocks, a launch and a block, as this one took
        pair = 2 * (time.monotonic() - started)
        undecided = final is not None and (
            (final.verdict != "improved" and near_miss(final, r.bench)) or launch_like(final, r.bench)
        )
        if undecided:
            crowded = crowds_out(r, best_judged(final), pair)
            if not r.fits(pair) or not r.restarts_left(THIRD_RESTARTS) or crowded:
                record.comparison = {**record.comparison, **comparison_dict(final)}
                left = "no time" if r.restarts_left(THIRD_RESTARTS) else "no restarts"
                record.near_miss = best_judged(final)
                what = (
                    "the same gain at every level, as a faster launch shows"
                    if launch_like(final, r.bench)
                    else ""
                )
                return await self.reject(
                    f"not established over two launches{f' ({what})' if what else ''}: {final.summary}; "
                    + (crowded or f"{left} left for a third")
                )
            third_started = time.monotonic()
            third = await self._third_launch(new_text, (before, cand, after, confirm), final)
            record.third_seconds = time.monotonic() - third_started
            if third is None:
                return
            final, block = third
            launches.append(block)
        short = (
            with_first_look(r, record, final) if final is not None and final.verdict == "improved" else None
        )
        if final is None or final.verdict != "improved" or short:
            record.comparison = {**record.comparison, **(comparison_dict(final) if final else {})}
            if final is not None and near_miss(final, r.bench):
                record.near_miss = best_judged(final)
            why = (
                f"not established over {len(launches)} launches: {short or final.summary}"
                if final
                else "errors on a relaunch"
            )
            return await self.reject(why)
        record.comparison = {**record.comparison, **comparison_dict(final)}
        await self.commit(final, launches)

    async def _third_launch(self, new_text: str, blocks: tuple, cmp: Any) -> tuple[Any, list] | None:
        """A near miss: roll back and measure known-good on a third launch, then the candidate on its
        third; (the comparison of three launches a side, the candidate's block) or None when either
        side failed (the record says why; known-good is deployed). `cmp`: the two launches' comparison."""
        before, cand, after, confirm = blocks
        good = await self.known_good_again(
            lambda reps: self.judge.compare(before, cand, after, confirm, (reps, [])), "after_second"
        )
        if good is None:
            return None
        if self.judge.came_out_slower(good, cmp):
            good = await self.known_good_block("after_second")
        judge = lambda reps: self.judge.compare(before, cand, after, confirm, (good, reps))  # noqa: E731
        block = await self.launch_again(new_text, "third launch", judge)
        if block is None:
            return None
        self.record_blocks(after_second=good, third=block)
        return (judge(block) if not any(s.partial for s in block) else None), block
