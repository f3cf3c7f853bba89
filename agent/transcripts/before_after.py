"""Before and after on the user's own workload: the baseline measured at the start of the run
against the configuration left deployed, measured on the same workload (the configuration's
`bench`, not a trial's shared-prefix mix) with the same seeds' prompts.

A trial judged on another workload (a scheduling flag on shared prefixes, `tools.bench.workload`)
says nothing directly about the user's own traffic; the run then ends with a final check, a block of
the final configuration on the baseline's workload. Where the kept trial ran on the user's workload,
its last candidate block is that measurement. Either way the interval is computed as a trial's is
(`tools.bench.paired.interval`: each seed's prompts' own speed taken out, the restart spread counted
for each side's launch) but it is not paired: the two blocks are minutes or hours apart and nothing
measured known-good after the change, so drift between them is not in the interval. One repetition
a side gives no interval, and none is shown.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from tools.bench.effect import pct

FINAL_CHECK = "the final check: the final configuration measured on it at the end of the run"
NOT_PAIRED = (
    "not paired: measured at the start and at the end of the run; the interval counts the "
    "repetitions and the restart spread, not drift between the two"
)


@dataclass
class LevelChange:
    """One concurrency level, before and after."""

    concurrency: int
    before: float | None
    """Mean output tok/s of the baseline's repetitions."""
    after: float | None
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n_before: int = 0
    n_after: int = 0

    def change(self) -> str:
        """`+11.4% [+8.0..+15.0]`, the interval only when the repetitions give one, `missing` without
        both sides."""
        return pct(self.ratio, self.ci_low, self.ci_high) if self.ratio is not None else "missing"

    def line(self) -> str:
        """`c=64 1,164 -> 1,297 tok/s, +11.4% [+8.0..+15.0]`."""
        if self.before is None or self.after is None:
            return f"c={self.concurrency} missing"
        return f"c={self.concurrency} {self.before:,.0f} -> {self.after:,.0f} tok/s, {self.change()}"


@dataclass
class BeforeAfter:
    """The user's workload before (the baseline) and after (the configuration left deployed)."""

    workload: str
    """The user's workload in words (`random prompts (1024 tokens in), 128 out`)."""
    source: str = ""
    """Where the after figures come from: FINAL_CHECK, or the kept trial's last candidate block;
    empty when nothing measured the final configuration (nothing kept, or the final check failed)."""
    kept: bool = False
    """Something was kept (False: the baseline stays deployed and there is no after)."""
    levels: list[LevelChange] = field(default_factory=list)
    note: str = ""
    """How far the interval goes (NOT_PAIRED), or why there is none."""

    def level_at(self, concurrency: int) -> LevelChange | None:
        """The level `concurrency`, if measured on either side."""
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    @property
    def measured(self) -> bool:
        """Both sides were measured at some level."""
        return any(lv.ratio is not None for lv in self.levels)

    def summary(self) -> str:
        """One sentence: `on your workload (...): c=1 125 -> 126 tok/s, +0.5% [...]; c=64 ...`."""
        head = f"on your workload ({self.workload})"
        if not self.kept:
            return f"{head}: nothing kept, the baseline stays deployed"
        if not self.measured:
            return f"{head}: the final configuration was not measured ({self.note or 'missing'})"
        return f"{head}: " + "; ".join(lv.line() for lv in self.levels)

    def markdown(self) -> list[str]:
        """A section body: what was compared, a table per level, and how far its intervals go."""
        if not self.kept:
            return [f"Your workload ({self.workload}): nothing kept, the baseline stays deployed."]
        if not self.measured:
            return [f"Your workload ({self.workload}): the final configuration was not measured "
                    f"({self.note or 'missing'})."]  # fmt: skip
        rows = [
            f"| {lv.concurrency} | {_num(lv.before)} | {_num(lv.after)} | {lv.change()} | "
            f"{lv.n_before} / {lv.n_after} |"
            for lv in self.levels
        ]
        return [
            f"Your workload ({self.workload}): the baseline measured at the start of the run vs "
            f"the configuration left deployed, from {self.source}.",
            "",
            "| concurrency | before tok/s | after tok/s | change [95% CI] | repetitions before / after |",
            "|---:|---:|---:|---:|---:|",
            *rows,
            "",
            f"({self.note})",
        ]

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe, rounded (`--json` outputs): per level the means, the change in percent and its
        interval (None where the repetitions give none)."""

        def p(r: float | None) -> float | None:
            return None if r is None else round((r - 1) * 100, 2)

        def r1(v: float | None) -> float | None:
            return None if v is None else round(v, 1)

        out = {k: v for k, v in asdict(self).items() if k != "levels"}
        out["levels"] = {
            str(lv.concurrency): {
                "before_tok_s": r1(lv.before),
                "after_tok_s": r1(lv.after),
                "change_pct": p(lv.ratio),
                "ci_low_pct": p(lv.ci_low),
                "ci_high_pct": p(lv.ci_high),
                "repetitions_before": lv.n_before,
                "repetitions_after": lv.n_after,
            }  # fmt: skip
            for lv in self.levels
        }
        return out


def _num(v: float | None) -> str:
    return "missing" if v is None else f"{v:,.1f}"


def describe_bench(bench: dict[str, Any] | None) -> str:
    """The workload of a recorded `BenchConfig` dump in words (`random prompts (1024 tokens in), 128
    out`); `the run's benchmark` when it was not recorded."""
    if not isinstance(bench, dict) or not bench.get("workload"):
        return "the run's benchmark"
    from types import SimpleNamespace

    from tools.bench.workload import describe_workload

    try:
        words = describe_workload(SimpleNamespace(**bench))  # type: ignore[arg-type]
    except (AttributeError, TypeError, ValueError):  # a config this version cannot read: its name
        return str(bench["workload"])
    return f"{words}, {bench['output_len']} tokens out" if bench.get("output_len") else words


def compare(
    before: list[dict[str, Any]],
    after: list[dict[str, Any]] | None,
    *,
    workload: str,
    source: str,
    kept: bool,
    spread: dict[str, Any] | None = None,
    alpha: float = 0.05,
) -> BeforeAfter:
    """Before and after per level from recorded sweeps (`SweepResult` dumps, each with its seed),
    with the run's launch spread (`launch_spread` event: `value`, `df`; none: the declared 1%)."""
    from tools.bench.paired import interval

    out = BeforeAfter(workload=workload, source=source if after else "", kept=kept)
    if not kept:
        return out
    if not after:
        out.note = "the final check measured nothing" if source == FINAL_CHECK else "not recorded"
        return out
    spread = spread or {}
    noise = float(spread.get("value") or 0.01)
    df = spread.get("df") if isinstance(spread.get("df"), int | float) else None
    levels = sorted({c for s in before + after for c in _values(s)})
    for c in levels:
        kg, cand = _block(before, c), _block(after, c)
        i = interval([kg], [cand], launch_noise=noise, alpha=alpha, prior_df=df, concurrency=c)
        out.levels.append(
            LevelChange(
                concurrency=c,
                before=_mean(kg),
                after=_mean(cand),
                ratio=i.ratio,
                ci_low=i.ci_low,
                ci_high=i.ci_high,
                n_before=len(kg),
                n_after=len(cand),
            )  # fmt: skip
        )
    single = [lv for lv in out.levels if lv.ratio is not None and lv.ci_low is None]
    out.note = NOT_PAIRED
    if single:
        out.note = (
            f"{min(lv.n_before for lv in single)} repetition(s) before and {min(lv.n_after for lv in single)} "
            "after: too few for an interval, none shown; " + NOT_PAIRED
        )
    return out


def _values(sweep: dict[str, Any]) -> dict[int, float]:
    """Output tok/s per level of one recorded sweep, where every request of the level completed."""
    out = {}
    for lv in sweep.get("levels") or []:
        v = lv.get("output_throughput") if isinstance(lv, dict) else None
        if isinstance(v, int | float) and v > 0 and not lv.get("failed") and lv.get("completed", 1):
            out[int(lv["max_concurrency"])] = float(v)
    return out


def _block(sweeps: list[dict[str, Any]], c: int) -> list[tuple[int, float]]:
    """(seed, log tok/s) of each repetition at level `c`: a block as `tools.bench.paired.interval`
    takes it (repetition r of every block sends seed r's prompts)."""
    return [(int(s.get("seed") or 0), math.log(v[c])) for s in sweeps if c in (v := _values(s))]


def _mean(block: list[tuple[int, float]]) -> float | None:
    return sum(math.exp(v) for _, v in block) / len(block) if block else None
