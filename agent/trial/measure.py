"""How a trial measures: adaptive repetitions, A/B/A pairing, and failures that are not the flag's.

Adaptive repetitions: a configuration is measured a block's repetitions (`bench.reps`, or fewer where
the restart spread dominates: `agent.trial.spread.block_reps`), then compared with the
known-good block measured next to it. The measurement stops as soon as the answer is clear (no
interval reaches the minimum effect, a significant regression, or a clear improvement) and adds one
repetition at a time, up to `max_reps`, while a gain is still possible but not established. The
interval actually reached is what the record and the report show.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

ENV_PATTERNS: dict[str, str] = {
    r"address already in use|errno 98|eaddrinuse": "the server's port is already in use",
    r"no space left on device|errno 28|disk quota exceeded": "the host is out of disk space",
    r"no route to host|network is unreachable|name or service not known|host is down|"
    r"could not resolve|connection reset by peer|broken pipe|ssh.*(timed out|refused)|"
    r"host unreachable|transporterror": "the host is unreachable",
}
"""Failures of the machine, not of the flag: recognised in the error or the server's log."""


def environment_failure(*texts: str | None) -> str | None:
    """Why the failure is the environment's (port in use, out of disk, host unreachable), or None."""
    blob = "\n".join(t for t in texts if t).lower()
    for pattern, why in ENV_PATTERNS.items():
        if re.search(pattern, blob):
            return why
    return None


# Every block sends the same prompts: repetition r uses seed r, as the baseline's sweeps do (common
# random numbers), and a repetition beyond `bench.reps` one of those seeds again (r mod reps), so
# that the other blocks have measured its prompts too. A prompt has a speed of its own (with
# speculative decoding, how many draft tokens its greedy output accepts: on the simulated seed a c=1
# repetition moves 2.5% between seeds, 0.2% on the same seed), which the comparison takes out
# (`tools.bench.blockfit`); a seed no other block measured would tell it nothing. The prefix cache
# is flushed before each level, so a block does not find earlier prompts of its launch cached.


def rep_seed(rep: int, bench: Any) -> int:
    """The seed of repetition `rep` of any block (see above)."""
    return rep % bench.reps


async def measure(
    endpoint: str,
    bench: Any,
    *,
    more: Callable[[list[Any]], bool] | None = None,
    max_reps: int,
    start: int | None = None,
    on_progress: Any = None,
) -> list[Any]:
    """`start` sweeps (None: `bench.reps`), then one more at a time (up to `max_reps`) while
    `more(reps)` says the comparison is worth sharpening. Stops at a partial sweep (its numbers are
    not trusted)."""
    from tools.bench.loadgen import goodput_hint, run_sweep

    target = start or bench.reps
    reps: list[Any] = []
    while len(reps) < target:
        sweep = await run_sweep(
            endpoint,
            bench,
            on_progress=on_progress,
            seed=rep_seed(len(reps), bench),
            rep=len(reps),
            reps=target,
            start_rate=goodput_hint(reps),
        )
        reps.append(sweep)
        if sweep.partial:
            break
        if len(reps) == target and more is not None and target < max_reps and more(reps):
            target += 1
    return reps


def reps_note(cmp: Any, max_reps: int) -> str:
    """`stopped early` / `extended to N` / `at the cap`: how the sequential test ended."""
    n = cmp.overall.n_candidate
    if cmp.promising and n >= max_reps:
        return f"still inconclusive at the {max_reps}-repetition cap"
    return f"{n} candidate repetitions"
