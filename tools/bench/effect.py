"""What a trial's decision measured, in one form every output shows (report, review, HTML, plot,
terminal, `--json`): per level the known-good and candidate numbers of the paired blocks the rule
judged, and the decision's ratio with its 95% interval.

Read from a trial record as saved (`agent.trial.record.TrialRecord` dumped to JSON): its
`comparison` (a `tools.bench.paired.PairedComparison` dump) holds the intervals; its `samples`
hold each repetition of each block. The absolute numbers are the geometric means the interval
compares (the mean over launches of each block's mean log), so `candidate / known_good` is the
decision's ratio exactly.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

KNOWN_GOOD_BLOCKS = ("before", "after", "after_second")
"""Known-good blocks, one per launch, in the order `paired_compare` takes them."""
CANDIDATE_BLOCKS = ("candidate", "confirm", "third")
"""Candidate blocks, one per launch."""


def pct(ratio: float | None, low: float | None = None, high: float | None = None) -> str:
    """`+4.0% [+1.2..+6.9]` (the interval only when known), `n/a` without a ratio."""
    if ratio is None:
        return "n/a"

    def p(r: float) -> str:
        return f"{(r - 1) * 100 + 0.0:+.1f}".replace("-0.0", "+0.0")

    text = p(ratio) + "%"
    if low is not None and high is not None:
        text += f" [{p(low)}..{p(high)}]"
    return text


@dataclass
class LevelEffect:
    """One concurrency level as the decision judged it."""

    concurrency: int
    ratio: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    known_good: float | None = None
    """Geometric mean of the metric over the known-good blocks the decision used (None: not a
    single recorded metric, or not recorded)."""
    candidate: float | None = None

    def pct(self) -> str:
        """`+4.0% [+1.2..+6.9]`."""
        return pct(self.ratio, self.ci_low, self.ci_high)

    def label(self) -> str:
        """`c=64 +4.0% [+1.2..+6.9]`."""
        return f"c={self.concurrency} {self.pct()}"


@dataclass
class Effect:
    """A trial's decision in numbers: every level it judged, and the one that decided."""

    metric: str
    rule: str
    verdict: str
    levels: list[LevelEffect] = field(default_factory=list)
    deciding: LevelEffect | None = None
    tolerance: float | None = None
    """The worst a level may do for a keep (0.03: no level worse than 3%), from the decision."""
    launches: int = 1

    @property
    def lower_is_better(self) -> bool:
        """A latency decision: its ratios are gains (known-good / candidate: + is a lower latency)."""
        return "throughput" not in self.metric and self.metric != "goodput"

    def change(self, lv: LevelEffect) -> str:
        """`lv`'s change in words: `+4.0% [+1.2..+6.9]`, for a latency `gain +4.0% [...]`."""
        return ("gain " if self.lower_is_better else "") + lv.pct()

    def level(self, concurrency: int) -> LevelEffect | None:
        """The level `concurrency`, if judged."""
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe."""
        return asdict(self)


def _geo(samples: dict[str, Any], blocks: tuple[str, ...], level: int, metric: str) -> float | None:
    means = []
    for name in blocks:
        vals = []
        for rep in samples.get(name) or []:
            cell = rep.get(str(level), rep.get(level)) if isinstance(rep, dict) else None
            v = cell.get(metric) if isinstance(cell, dict) else None
            if isinstance(v, int | float) and v > 0:
                vals.append(math.log(v))
        if vals:
            means.append(sum(vals) / len(vals))
    return math.exp(sum(means) / len(means)) if means else None


def _metric(samples: dict[str, Any]) -> str | None:
    """The one metric the blocks recorded (None when several: a latency goal mixes TTFT and TPOT)."""
    names = {m for block in samples.values() for rep in block or [] for cell in rep.values()
             if isinstance(cell, dict) for m in cell}  # fmt: skip
    return names.pop() if len(names) == 1 else None


def effect_of(trial: dict[str, Any]) -> Effect | None:
    """The decision of one saved trial (a `TrialRecord` dump), None when it measured nothing."""
    cmp = trial.get("comparison") if isinstance(trial.get("comparison"), dict) else None
    if not cmp or not isinstance(cmp.get("per_level"), list):
        return None
    samples = trial.get("samples") if isinstance(trial.get("samples"), dict) else {}
    metric = _metric(samples) or "output_throughput"
    single = _metric(samples) is not None
    higher = "throughput" in metric
    levels = []
    for i in cmp["per_level"]:
        if not isinstance(i, dict) or i.get("concurrency") is None:
            continue
        c = int(i["concurrency"])
        kg = _geo(samples, KNOWN_GOOD_BLOCKS, c, metric) if single else None
        cand = _geo(samples, CANDIDATE_BLOCKS, c, metric) if single else None
        levels.append(LevelEffect(c, i.get("ratio"), i.get("ci_low"), i.get("ci_high"), kg, cand))
    overall = cmp.get("overall") if isinstance(cmp.get("overall"), dict) else {}
    tol = re.search(r"(?:worse than -?|beyond the )(\d+(?:\.\d+)?)%", str(cmp.get("summary") or ""))
    effect = Effect(
        metric=metric if higher or single else "objective",
        rule=str(cmp.get("rule") or "?"),
        verdict=str(cmp.get("verdict") or "?"),
        levels=levels,
        tolerance=float(tol.group(1)) / 100 if tol else None,
        launches=int(overall.get("launches_candidate") or 1),
    )
    effect.deciding = _deciding(effect, overall, trial.get("decision") == "kept")
    return effect


def _deciding(effect: Effect, overall: dict[str, Any], kept: bool) -> LevelEffect | None:
    """The level the rule decided on: under the objective rule the level the objective is (or the
    objective itself); under the Pareto rule the best established gain for a keep, else the worst
    level (regressed) or the best one (no gain established)."""
    judged = [lv for lv in effect.levels if lv.ratio is not None]
    if effect.verdict == "regressed" and not kept and judged:
        return min(judged, key=lambda lv: lv.ratio)
    if effect.rule != "pareto" and overall.get("ratio") is not None:
        same = [lv for lv in judged if abs(lv.ratio - overall["ratio"]) < 1e-9]
        if same:
            return same[0]
        return LevelEffect(-1, overall.get("ratio"), overall.get("ci_low"), overall.get("ci_high"))
    if not judged:
        return None
    return max(judged, key=lambda lv: lv.ci_low if lv.ci_low is not None else lv.ratio)


def where(lv: LevelEffect) -> str:
    """`c=64`, or `objective` for an objective over several levels."""
    return "objective" if lv.concurrency < 0 else f"c={lv.concurrency}"


def headline(trial: dict[str, Any]) -> str:
    """`kept: c=64 +4.0% [+1.2..+6.9], no level worse than 3%` — the decision and the level that
    decided it; for a trial that measured nothing, the decision and why."""
    decision = str(trial.get("decision") or "?").replace("_", " ")
    effect = effect_of(trial)
    why = str(trial.get("why") or "")
    if effect is None or effect.deciding is None:
        if not why:
            return decision
        first, _, rest = why.partition(";")
        if "the server said: " in rest:  # a failed start: SGLang's own reason, not the health check's
            said = rest.split("the server said: ", 1)[1].split(";")[0].strip()
            return f"{decision}: {first.split(':')[0]}: {said}"
        return f"{decision}: {first}"
    text = f"{decision}: {where(effect.deciding)} {effect.change(effect.deciding)}"
    if decision == "kept" and effect.tolerance is not None:
        return text + f", no level worse than {effect.tolerance:.0%}"
    return text + f" ({effect.verdict.replace('_', ' ')})"


def decided_levels(trial: dict[str, Any]) -> dict[int, str]:
    """Per level, the decision's numbers in words: `2,316 -> 2,470 tok/s, +6.7% [+4.8..+8.6]`
    (the known-good and candidate blocks it compared; only the change when no single metric)."""
    effect = effect_of(trial)
    out: dict[int, str] = {}
    for lv in effect.levels if effect else []:
        if lv.ratio is None:
            continue
        numbers = ""
        if lv.known_good and lv.candidate and effect.metric == "output_throughput":
            numbers = f"{lv.known_good:,.0f} -> {lv.candidate:,.0f} tok/s, "
        out[lv.concurrency] = numbers + effect.change(lv)
    return out
