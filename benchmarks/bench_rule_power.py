"""How often does the keep rule keep a change of a given true size? A Monte Carlo of one level of
the two-launch A/B/A(/B) trial, through the agent's own interval (`tools.bench.paired.interval`).

Each simulated trial: a run's earlier known-good launches (their spread is what the interval pools
with the declared restart spread), the known-good block before the candidate, the candidate's
launch, the known-good launch after the rollback, the candidate's second launch. Every launch has
a log-normal performance factor (the restart spread), every repetition its own noise. A change is
kept when the estimate is at least the minimum effect and the 95% interval is above 1 (the win side
of the Pareto rule at one level). A true gain of 0 gives the false-keep rate of a no-op; a true
restart spread above the declared one shows what a wrong `bench.launch_noise` costs. The second
table adds what the agent does for a near miss (an estimate within a quarter of the minimum effect
after two launches): a third launch of each side, judged on all three.

    python benchmarks/bench_rule_power.py [--trials 4000] [--reps 3] [--history 4]
"""

from __future__ import annotations

import argparse
import math
import random

from tools.bench.paired import interval

DECLARED = 0.01
MIN_EFFECT = 0.02


def _spread(blocks: list[list[float]]) -> tuple[float, int]:
    """(spread of the block means beyond their repetitions, df), as `tools.bench.paired` takes it."""
    means = [sum(b) / len(b) for b in blocks]
    within = [
        sum((x - m) ** 2 for x in b) / (len(b) - 1) / len(b) for b, m in zip(blocks, means, strict=True)
    ]
    if len(means) < 3:
        return 0.0, 0
    mean = sum(means) / len(means)
    var = sum((m - mean) ** 2 for m in means) / (len(means) - 1) - sum(within) / len(within)
    return math.sqrt(max(0.0, var)), len(means) - 1


def kept(
    rng: random.Random, gain: float, launch_sd: float, rep_sd: float, reps: int, history: int, third: bool
) -> tuple[bool, bool]:
    """(kept, a third launch was spent) for one trial of a change of true log effect `gain`."""

    def launch(effect: float) -> list[float]:
        factor = effect + rng.gauss(0, launch_sd)
        return [factor + rng.gauss(0, rep_sd) for _ in range(reps)]

    def judge(good: list[list[float]], cand: list[list[float]]) -> tuple[bool, float]:
        i = interval(good, cand, launch_noise=DECLARED, alpha=0.05, spread=_spread(earlier + good[1:]))
        return i.ratio >= 1 + MIN_EFFECT and i.ci_low > 1, i.ratio

    earlier = [launch(0.0) for _ in range(history)]
    good, cand = [earlier[-1], launch(0.0)], [launch(gain), launch(gain)]
    win, ratio = judge(good, cand)
    # agent/paired_trial.py `_near_miss`: within a quarter of the minimum effect
    if win or not third or ratio < 1 + 0.75 * MIN_EFFECT:
        return win, False
    return judge(good + [launch(0.0)], cand + [launch(gain)])[0], True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=4000)
    ap.add_argument("--reps", type=int, default=3, help="repetitions a block")
    ap.add_argument("--rep-noise", type=float, default=0.006, help="relative sd of one repetition")
    ap.add_argument("--history", type=int, default=4, help="known-good launches earlier in the run")
    args = ap.parse_args()
    gains = (0.0, 0.02, 0.025, 0.03, 0.04, 0.05)
    print(
        f"declared restart spread {DECLARED:.1%}, minimum effect {MIN_EFFECT:.0%}, {args.trials} trials a cell"
    )
    for third in (False, True):
        print(
            "\ntwo launches a side"
            + (", a third for a near miss (keep rate / third launches)" if third else "")
        )
        print("| true restart spread | " + " | ".join(f"keep at {g:+.1%}" for g in gains) + " |")
        print("|---:|" + "---:|" * len(gains))
        for launch_sd in (0.005, 0.01, 0.015, 0.02):
            cells = []
            for g in gains:
                rng = random.Random(1)
                runs = [
                    kept(rng, math.log1p(g), launch_sd, args.rep_noise, args.reps, args.history, third)
                    for _ in range(args.trials)
                ]
                rate = sum(k for k, _ in runs) / args.trials
                extra = sum(t for _, t in runs) / args.trials
                cells.append(f"{rate:.1%}" + (f" / {extra:.0%}" if third else ""))
            print(f"| {launch_sd:.1%} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
