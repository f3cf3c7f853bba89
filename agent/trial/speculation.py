"""Speculative decoding judged on its acceptance, not only on throughput.

A speculative step drafts `steps` tokens per request and verifies them in one forward; the request
gains its accept length L (the tokens of the step that stand, the bonus token included: SGLang's
`avg_spec_accept_length`, read after every level as `bench_serving` does). Speculation pays where a
step's time T(steps) is less than L plain decode steps. Plain decoding is not measured, but a trial
that moves `--speculative-num-steps` measures two step times: per level T = TPOT x L on each side
(the time per output token times the tokens per step). A step is a verify forward and one draft
forward per step, T(k) = T_verify + k x T_draft, so the two sides give both parts. The verify
forward of k + 1 tokens per request costs at least a plain decode step of one token, so a level's
payoff, L x T_verify / T(k), bounds from above how many times faster than plain decoding
speculation runs there (on the simulated seed it reads 2.1x where plain decoding measured 1.5x).

A candidate whose payoff, that upper bound, falls below 1 at a level where known-good's was at
least 1 has surely made speculation cost there: it is not kept, whatever the throughput at other
levels (plain decoding would beat it where it lost). A trial that moved the accept length (or the
steps) has both sides' accept lengths in its notes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tools.bench.effect import CANDIDATE_BLOCKS, KNOWN_GOOD_BLOCKS

MOVED = 0.02
"""An accept length that moved less than this between the sides, with the same steps, goes unsaid."""


@dataclass(frozen=True)
class Acceptance:
    """One block side at one level: the speculative steps it ran with, its mean accept length and
    mean TPOT (ms) over the repetitions that reported them."""

    steps: int | None
    accept_length: float
    tpot_ms: float | None


def block_acceptance(reps: list[Any]) -> dict[int, dict[str, float | None]]:
    """Level -> {steps, accept_length, tpot_ms} of one block (means over its repetitions), for the
    levels whose repetitions reported an accept length; {} on a server without speculation."""
    cells: dict[int, list[dict[str, Any]]] = {}
    for sweep in reps:
        steps = (getattr(sweep, "server_info", None) or {}).get("speculative_num_steps")
        for lv in sweep.levels:
            if lv.ok and lv.accept_length is not None:
                cell = {"steps": steps, "accept_length": lv.accept_length, "tpot_ms": lv.mean_tpot_ms}
                cells.setdefault(lv.max_concurrency, []).append(cell)
    return {level: _mean(rows) for level, rows in cells.items()}


def side(speculation: dict[str, dict[Any, dict[str, Any]]], blocks: tuple[str, ...]) -> dict[int, Acceptance]:
    """The blocks of one side (known-good or candidate) pooled per level: the mean of their means."""
    pooled: dict[int, list[dict[str, Any]]] = {}
    for name in blocks:
        for level, cell in (speculation.get(name) or {}).items():
            pooled.setdefault(int(level), []).append(cell)
    return {level: Acceptance(**_mean(cells)) for level, cells in pooled.items()}  # type: ignore[arg-type]


def _mean(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """{steps, accept_length, tpot_ms} of several: the last steps, the mean accept length, the mean
    of the TPOTs known (None: none)."""
    tpots = [c["tpot_ms"] for c in cells if c.get("tpot_ms")]
    return {
        "steps": cells[-1].get("steps"),
        "accept_length": sum(c["accept_length"] for c in cells) / len(cells),
        "tpot_ms": sum(tpots) / len(tpots) if tpots else None,
    }


def payoffs(before: dict[int, Acceptance], after: dict[int, Acceptance]) -> dict[int, tuple[float, float]]:
    """Level -> (known-good's payoff, the candidate's): at most how many times faster than plain
    decoding each side's speculation ran there, from the two step times (`T = TPOT x L`) of sides that ran
    different step counts. Levels where the step times do not fit a verify forward plus one draft
    forward per step (a draft that costs nothing, a verify that costs less) are left out."""
    out = {}
    for level, a in before.items():
        b = after.get(level)
        if (
            b is None
            or a.steps is None
            or b.steps is None
            or a.steps == b.steps
            or not (a.tpot_ms and b.tpot_ms)
        ):
            continue
        t_a, t_b = a.tpot_ms * a.accept_length, b.tpot_ms * b.accept_length
        draft = (t_b - t_a) / (b.steps - a.steps)
        verify = t_a - a.steps * draft
        if draft <= 0 or verify <= 0:
            continue
        out[level] = (a.accept_length * verify / t_a, b.accept_length * verify / t_b)
    return out


def judged(speculation: dict[str, dict[Any, dict[str, Any]]]) -> tuple[list[str], str | None]:
    """(notes, why the candidate may not be kept, or None) of a trial's recorded acceptance."""
    before, after = side(speculation, KNOWN_GOOD_BLOCKS), side(speculation, CANDIDATE_BLOCKS)
    if not before and not after:
        return [], None
    levels = sorted(set(before) | set(after))

    def length(s: dict[int, Acceptance], c: int) -> str:
        return f"{s[c].accept_length:.2f}" if c in s else "n/a"

    pays = payoffs(before, after)
    moved = [
        c
        for c in levels
        if c in before and c in after and abs(after[c].accept_length / before[c].accept_length - 1) > MOVED
    ]
    if not pays and not moved and set(before) == set(after):
        return [], None  # speculation as it was: nothing to say
    notes = ["accept length " + ", ".join(f"c={c} {length(before, c)} -> {length(after, c)}" for c in levels)]
    if pays:
        notes.append(
            "speculation's speed-up over plain decoding, at most (from both sides' step times) "
            + ", ".join(f"c={c} {p:.2f}x -> {q:.2f}x" for c, (p, q) in sorted(pays.items()))
        )
    lost = [c for c, (p, q) in sorted(pays.items()) if q < 1 <= p]
    if not lost:
        return notes, None
    where = ", ".join(f"c={c} (accept length {after[c].accept_length:.2f})" for c in lost)
    return notes, f"speculation stops paying at {where}: plain decoding would be faster there"
