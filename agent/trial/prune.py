"""A member of a kept bundle left out: does the bundle need it?

Small levers that the restart spread cannot establish one by one are tried together
(`agent.policy.trialqueue.plan_bundle`); a bundle kept is established as a whole, not member by member.
A member research is unsure of (low certainty, or no mechanism at the level that won) may be a
no-op riding on the others' gain. The rule that keeps a change asks the change to prove itself, so
here the member must: the bundle without it is deployed (A = the bundle, running; B = without the
member), and the member stays only if leaving it out costs at least the minimum effect at some
level, significantly. Otherwise the configuration without it becomes known-good.

Order of work: A block, deploy B, probe, B block. When B costs nothing that looks like the minimum
effect (A/B estimate above 1 - min_effect/2 at every level) B is committed at once (one restart).
Otherwise the rollback (which keeping the member needs anyway) relaunches the bundle, it is
measured again, and A/B/A decides: the member stays, or B is deployed again and committed.
"""

from __future__ import annotations

from typing import Any

from agent.trial.record import comparison_dict, mean_throughput
from agent.trial.steps import Trial


def member_pays(cmp: Any, min_effect: float) -> bool:
    """Leaving the member out costs at least `min_effect` at some level (estimate at or below
    1/(1+min_effect)), significantly (the interval's upper end below 1)."""
    return any(
        i.ratio is not None and i.ratio <= 1 / (1 + min_effect) and (i.ci_high or 1) < 1
        for i in cmp.per_level
    )


def _may_pay(cmp: Any, min_effect: float) -> bool:
    """The A/B look leaves it open: some level's estimate is at or below 1 - min_effect/2."""
    return any(i.ratio is not None and i.ratio <= 1 - min_effect / 2 for i in cmp.per_level)


class LeaveOutTrial(Trial):
    """A kept bundle's member left out: the bundle without it deployed, kept only if the member
    does not pay (see above)."""

    async def run(self, new_text: str) -> None:
        """The leave-out trial of `record` (its changes are the member; `new_text` the bundle without it)."""
        r, record = self.runner, self.record
        member = ", ".join(c.describe() for c in record.changes)
        before = await self.known_good_block()
        if not await self.deploy(new_text, "without a bundle member"):
            return
        record.deployed = True
        await r.deployment.keepalive()
        if why := await self.probe_ok():
            return await self.reject(f"without {member}: {why}")
        await r.deployment.keepalive()
        cand = await self.block("candidate", max_reps=r.max_reps)
        self.record_blocks(before=before, candidate=cand)
        record.levels = mean_throughput(cand)
        if any(s.partial for s in cand):
            return await self.reject(f"without {member}: errors under load; the member stays")
        r.note_launch(new_text, cand)
        first = self.judge.compare(before, cand, None)
        min_effect = r.bench.min_effect
        if not _may_pay(first, min_effect):
            record.comparison = comparison_dict(first)
            return await self._drop([cand], f"{member} left out: without it {_levels(first)} (A/B)")
        record.decision = "rolled_back"
        after = await self.known_good_again(lambda reps: self.judge.compare(before, cand, reps))
        if after is None:
            return
        self.record_blocks(after=after)
        cmp = self.judge.compare(before, cand, after)
        record.comparison = {
            **comparison_dict(cmp),
            "ab_only": {"verdict": first.verdict, "ratio": first.ratio},
        }
        if member_pays(cmp, min_effect):
            record.why = f"{member} stays in the bundle: without it {_levels(cmp)}"
            return
        if not await self.deploy(new_text, "without a bundle member, again"):
            record.why = f"{member} stays: the configuration without it did not start again ({record.why})"
            return
        await r.deployment.keepalive()
        if why := await self.probe_ok():
            return await self.reject(f"without {member}, again: {why}")
        again = await self.block("confirm", max_reps=r.bench.reps)
        self.record_blocks(confirm=again)
        r.note_launch(new_text, again)
        await self._drop([cand, again], f"{member} left out: without it {_levels(cmp)} (A/B/A)")

    async def _drop(self, launches: list[list[Any]], why: str) -> None:
        """The configuration without the member, deployed now, becomes known-good."""
        r, record = self.runner, self.record
        await r.deployment.commit()
        record.decision, record.why = "kept", why + "; costs less than the minimum effect at every level"
        record.improved = False
        r.adopt(record, launches[-1])


def _levels(cmp: Any) -> str:
    return ", ".join(f"c={i.concurrency} {i.pct()}" for i in cmp.per_level)
