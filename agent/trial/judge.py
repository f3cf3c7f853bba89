"""How a trial judges what it measured: the paired comparison with this run's launch spread, and
the questions the trial's steps ask of it (more repetitions? a likely winner? a clear win? did
known-good itself move too far to trust the comparison?).

The questions of a comparison alone are functions (`judged`, `best_judged`, `worth_more`,
`looks_like_a_winner`, `near_miss`); the ones that also need the run's launches so far are the
methods of a `Judge` over the runner's `LaunchHistory`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from tools.config import BenchConfig


class LaunchHistory(Protocol):
    """What judging reads of the trial runner: the benchmark, the goal and the launches so far."""

    bench: BenchConfig
    objective: Any
    launch_prior: tuple[float, float | None] | None
    prior_blocks: list[Any]
    known_good_blocks: list[Any]

    @property
    def launch_groups(self) -> list[list[Any]]: ...


def judged(cmp: Any) -> list[Any]:
    """The intervals the rule decides on: each level (Pareto), else the goal's objective."""
    return cmp.per_level if cmp.rule == "pareto" else [cmp.overall]


def best_judged(cmp: Any) -> dict[str, Any]:
    """The judged interval with the highest estimate (what a near miss may be worth)."""
    best = max((i for i in judged(cmp) if i.ratio is not None), key=lambda i: i.ratio)
    return best.model_dump(include={"concurrency", "ratio", "ci_low", "ci_high", "launches_candidate"})


def _open_levels(cmp: Any, bench: Any) -> tuple[list[Any], list[Any]]:
    """(levels that could still win, levels whose estimate is below the tolerance without being
    significantly worse: they block a win until sharper numbers say otherwise)."""
    intervals = judged(cmp)
    could_win = [i for i in intervals if i.ratio is not None and i.ratio >= 1 + bench.min_effect / 2]
    blocking = [
        i
        for i in cmp.per_level
        if i.ratio is not None and i.ratio < 1 - bench.regress_tolerance and (i.ci_high or 0) >= 1
    ]
    return could_win, blocking


def worth_more(cmp: Any, bench: Any) -> bool:
    """One more repetition in this launch pays off while a gain is possible but unproven, and only
    where repetition noise is still a real part of the interval at a level that decides (one that
    could win, or one that blocks the win): the launch-to-launch spread does not shrink with
    repetitions of the same launch."""
    could_win, blocking = _open_levels(cmp, bench)
    deciding = could_win + blocking or [cmp.overall]
    return bool(cmp.promising) and max(i.within_share for i in deciding) >= 0.25


def looks_like_a_winner(cmp: Any, bench: Any) -> bool:
    """Inconclusive, but some judged estimate is within a quarter of the minimum effect (or beyond)
    and no level is significantly worse (over the family of levels): another launch of the
    candidate (and its repetitions) can decide. A level below the tolerance that is not
    significantly worse is noise until more numbers say otherwise. Asking the full minimum effect
    of one launch lost a true +3% change at this gate one time in five (bench_rule_power.py)."""
    intervals = judged(cmp)
    near = any(i.ratio is not None and i.ratio >= 1 + 0.75 * bench.min_effect for i in intervals)
    return bool(cmp.promising) and near and not cmp.significantly_worse


def near_miss(cmp: Any, bench: Any) -> bool:
    """Not established over two launches but still looks like a winner: a third launch of each side
    decides (`python benchmarks/bench_rule_power.py [--no-third]` shows what it buys)."""
    return looks_like_a_winner(cmp, bench)


LAUNCH_LIKE_P = 0.01
"""How rarely the restart spread alone must show a gain the same at every level before two launches
settle it (two-sided p of the overall comparison)."""


def launch_like(cmp: Any, bench: Any) -> bool:
    """An improvement two launches cannot tell from the restart spread: every measured level faster by
    about the same (within half the minimum effect of one another), as a faster launch of the same
    server moves them all, and the overall comparison not beyond what that spread shows one time in
    a hundred (`LAUNCH_LIKE_P`). On the simulated H100 Llama-8B the no-ops a run kept were kept so
    (`--cuda-graph-max-bs-decode 64`: c=1 / c=8 / c=64 +2.8 / +3.1 / +3.0% over two launches). A
    third launch of each side decides it, as it does a near miss."""
    ratios = [i.ratio for i in cmp.per_level if i.ratio is not None]
    p = cmp.overall.p_value
    return (
        cmp.verdict == "improved"
        and len(ratios) > 1
        and min(ratios) > 1
        and max(ratios) < min(ratios) * (1 + bench.min_effect / 2)
        and p is not None
        and p > LAUNCH_LIKE_P
    )


def _moved_as_one(cmp: Any, bench: Any) -> bool:
    """Every measured level faster by at least the minimum effect, all within the minimum effect of
    one another: what a faster launch or a machine that just got quieter looks like (on the
    simulated H100 Llama-8B, torch.compile's one launch measured +6.5% at c=1, 8 and 64, where its
    kernels act only up to batch 32 and add 2.8% at best). One launch cannot tell that from a lever."""
    ratios = [i.ratio for i in cmp.per_level if i.ratio is not None]
    return (
        len(ratios) > 1
        and min(ratios) >= 1 + bench.min_effect
        and max(ratios) < min(ratios) * (1 + bench.min_effect)
    )


@dataclass
class Judge:
    """Judges a trial's blocks against the run's launches so far (the runner's `LaunchHistory`):
    the comparison itself, and whether known-good moved too far between its blocks to trust it."""

    history: LaunchHistory

    def compare(
        self,
        before: list[Any],
        cand: list[Any],
        after: list[Any] | None,
        confirm: Any = None,
        third: Any = None,
    ) -> Any:
        """The comparison of a candidate's blocks with known-good's around them (the trial's own
        launches of known-good: earlier ones count in the restart spread, not in known-good's level,
        see `tools.bench.paired.interval`)."""
        from tools.bench.paired import paired_compare

        r = self.history
        b = r.bench
        noise, prior_df = r.launch_prior or (b.launch_noise, None)
        # The launches of every configuration so far tell the restart spread, but not the candidate's
        # own: its second launch is asked for because the first measured high, so a second that agrees
        # would make its spread small exactly when its mean is high (a no-op was kept 5.7% of the time
        # instead of 3.8%, `benchmarks/bench_rule_power.py --earlier 3`). Known-good blocks the trials
        # did not measure (the baseline's, the last relaunch of the spread phase) count beside them.
        groups = [g for g in r.launch_groups if not any(block is cand for block in g)]
        held = {id(block) for group in groups for block in group}
        counted = held | {id(block) for block in r.prior_blocks}  # the measured spread holds these
        return paired_compare(
            before, cand, after, r.objective, min_effect=b.min_effect, regress_tolerance=b.regress_tolerance,
            launch_noise=noise, prior_df=prior_df, confirm=confirm, third=third, groups=groups,
            history=[block for block in r.known_good_blocks if id(block) not in counted],
        )  # fmt: skip

    def _disturbance_bound(self) -> float:
        """How far known-good may move between two of its blocks before the comparison says more about
        the machine than about the candidate: twice the minimum effect plus three launch spreads."""
        r = self.history
        spread = (r.launch_prior or (r.bench.launch_noise, None))[0]
        return 2 * r.bench.min_effect + 3 * spread

    def drifted(self, cmp: Any) -> dict[str, Any] | None:
        """The level where known-good's before and after blocks disagree beyond `_disturbance_bound`."""
        bound = self._disturbance_bound()
        for i in cmp.per_level:
            if i.n_after and abs(math.expm1(i.drift)) > bound:
                return {"concurrency": i.concurrency, "drift": math.exp(i.drift), "bound": bound}
        return None

    def came_out_slower(self, block: list[Any], cmp: Any = None) -> bool:
        """Known-good's newest launch, measured in `block`, came out slower than its launch before it
        where the candidate is being judged to win: at a level of `cmp` (the candidate's comparison so
        far) that could still win, else on the goal's objective. A load during that block would pass for
        a candidate's gain there, so the launch is measured once more before it is left and the two
        blocks settle (`known_good_block`). Faster, a load could only hide a gain: the block stands, and
        the trial saves that block's repetitions (a no-op kept 1.9% of the time with every such launch
        measured twice, 1.7% this way, 2.9% never, with a 4% load on a fifth of the blocks;
        `benchmarks/bench_rule_power.py --transient 0.2`). A load on one level's part of a block moves
        the objective a third as much: judged at the levels that could win, a 4% load at c=64 on a fifth
        of the blocks kept a no-op 2.5% of the time instead of 3.1% (4,000 trials; a true +2.5% and +3%
        at c=64: 38% and 51% instead of 42% and 51%, 1,000 trials, the loads sinking candidate blocks
        too); without loads 2.6% instead of 2.9%, +2.5% 60% (59%), +3% 75% (75%), 0.1 fewer restarts
        (`bench_rule_power.py --measured --history 3 --earlier 2 --where c64 --transient 0.2 --step 0.04
        --load-at 64`)."""
        r = self.history
        earlier = [b for b in r.known_good_blocks if b is not block]
        if not earlier:
            return True
        now = self.compare(earlier[-1], block, None)
        levels = {i.concurrency for i in _open_levels(cmp, r.bench)[0]} if cmp is not None else set()
        judged_now = [i for i in now.per_level if i.concurrency in levels] or [now.overall]
        return any(i.ratio is None or i.ratio < 1 for i in judged_now)

    def moved(self, before: list[Any]) -> bool:
        """Known-good's block now is beyond `_disturbance_bound` from its latest earlier block at some
        level (nothing to compare with: False)."""
        earlier = [block for block in self.history.known_good_blocks if block is not before]
        if not earlier:
            return False
        bound = self._disturbance_bound()
        aa = self.compare(earlier[-1], before, None)
        return any(i.ratio is not None and abs(i.ratio - 1) > bound for i in aa.per_level)

    def clear_win(self, first: Any, before: list[Any], on_winner: bool) -> bool:
        """An A/B win no drift or launch can explain: improved with the interval's low end at least
        twice the minimum effect at a judged level, and known-good measured as it measured before (the
        launch that just won, or a block within the minimum effect of the latest earlier block of
        known-good and not significantly apart from it; a run that relaunched nothing before its first
        trial has nothing to agree with), and not the same gain at every level (`_moved_as_one`).
        Keeping it at once saves the rollback and the second launch (two restarts); anything less clear
        goes through A/B/A, whose known-good block after the candidate shows a launch or a machine that
        moved."""
        b = self.history.bench
        clear = any(i.ci_low is not None and i.ci_low >= 1 + 2 * b.min_effect for i in judged(first))
        if first.verdict != "improved" or not clear or first.significantly_worse or _moved_as_one(first, b):
            return False
        if on_winner:
            return True
        earlier = [block for block in self.history.known_good_blocks if block is not before]
        if not earlier:
            return False
        aa = self.compare(earlier[-1], before, None)  # known-good now against its latest block before
        return all(
            abs(i.ratio - 1) < b.min_effect and (i.ci_low or 0) <= 1 <= (i.ci_high or 0)
            for i in [*aa.per_level, aa.overall]
            if i.ratio is not None
        )
