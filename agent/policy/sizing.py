"""Sized levers: the value of a numeric lever searched, not guessed.

A lever with a size (`sizes` in the playbook: max running requests, CUDA-graph batch, chunked
prefill, memory fraction, speculative steps...) starts at the playbook's value, filled from this
deployment's facts. Its `Ladder` is the values worth trying around it: steps of the playbook's kind
(`x2`: each twice the last; `+0.02`: that far apart) between a low and a high bound read from the
facts (no running-request cap above the highest concurrency the traffic offers, say).

After each trial of a value, `next_size` asks what the trials of this lever so far allow the next
value to gain. It assumes what a sized lever's curve is in practice: concave along the ladder (a
step gains less than the step before it, a step past the peak loses). Then every measured pair of
neighbouring values bounds the curve beyond them: the line through them. A value outside the tried
ones can gain at most that line's rise over the best value; one between two tried values at most
the lower of the two lines from either side. The value with the highest bound is tried next, a
trial like any other under the same paired statistics (against the value deployed by then); the
search stops when no value's bound beats the best by the goal's minimum effect, which is the
restarts a one-value-at-a-time grid would spend for nothing.

Gains are taken per judged level (each level under the Pareto rule, the objective otherwise): a
value is worth a trial when it could beat the best by the minimum at one of them.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel

MAX_SIDE = 4
"""Ladder values on each side of the playbook's value (a bound of the search, not of the curve)."""


class Sizes(BaseModel):
    """How a sized lever's value is searched: the ladder's step and bounds (a literal or a
    `{fact}`: `{bench.max_concurrency}`)."""

    step: str
    """`x2`: each value twice the one before (sizes); `+0.02`: that far apart (fractions)."""
    low: str
    high: str


class Ladder(BaseModel):
    """The values the search may try, ascending, with the deployment's own value (None: not known)."""

    step: str
    values: list[float]
    current: float | None
    integer: bool

    def show(self, value: float) -> str:
        """The value as a flag value: `64`, `0.88`."""
        return str(int(round(value))) if self.integer else f"{value:g}"

    def position(self, value: float) -> float:
        """Where a value lies along the ladder: log2 for `x` steps, steps for `+` ones."""
        if self.step.startswith("x"):
            return math.log(value) / math.log(float(self.step[1:]))
        return value / float(self.step[1:])

    def between(self, a: float, b: float) -> float | None:
        """A value between two others, halfway (None: none in between)."""
        mid = (a + b) / 2  # a round number, even on an `x` ladder (48 between 32 and 64)
        mid = float(round(mid)) if self.integer else round(mid, 4)
        return mid if min(a, b) < mid < max(a, b) else None


def ladder(sizes: Sizes, first: str | None, current: Any, fill: Any) -> Ladder | None:
    """The ladder around the playbook's value `first`; `fill` turns a `{fact}` template into its
    value (a missing fact raises KeyError). None when the value or a bound is not a number."""
    try:
        anchor, low, high = float(first or ""), float(fill(sizes.low)), float(fill(sizes.high))
        step = float(sizes.step[1:])
    except (KeyError, ValueError):
        return None
    grow = sizes.step.startswith("x")
    if step <= (1 if grow else 0) or not low <= anchor <= high:
        return None
    integer = anchor.is_integer() and (grow or step.is_integer())
    values = [anchor]
    for sign in (1, -1):
        v = anchor
        for _ in range(MAX_SIDE):
            v = (v * step if sign > 0 else v / step) if grow else v + sign * step
            v = float(round(v)) if integer else round(v, 4)
            if not low <= v <= high or v in values:
                break
            values.append(v)
    try:
        now = float(current) if current is not None and not isinstance(current, bool) else None
    except (TypeError, ValueError):
        now = None
    return Ladder(step=sizes.step, values=sorted(values), current=now, integer=integer)


def curve(ladder: Ladder, trials: list[dict[str, Any]]) -> dict[str, dict[float, float]]:
    """Per judged level (`"all"`: the goal's objective), value -> log gain over the deployment's
    own value, from the trials of this lever alone (in order; each measured against the value
    deployed then: a kept one moves it). Trials that said nothing about the value (a disturbed
    one, a failed start, a bundle) are left out."""
    out: dict[str, dict[float, float]] = {}
    if ladder.current is None:
        return out
    deployed: dict[str, float] = {}
    at = ladder.current
    for t in trials:
        value, ratios = t.get("size"), t.get("judged_ratios") or {}
        if value is None or t.get("disturbed") or t.get("failed_start") or t.get("kind") != "single":
            continue
        for level, ratio in ratios.items():
            if ratio is None or ratio <= 0:
                continue
            out.setdefault(level, {ladder.current: 0.0})[float(value)] = deployed.get(level, 0.0) + math.log(
                ratio
            )
        if t.get("decision") == "kept":
            at = float(value)
            deployed = {lv: pts[at] for lv, pts in out.items() if at in pts}
    return out


def bound(points: dict[float, float], x: float, ladder: Ladder) -> float | None:
    """The most a concave curve through `points` (value -> log gain) can be at `x`: the lines
    through neighbouring points on either side extended to it (the lower of the two between
    points). None when nothing bounds it (fewer than two points on the side it lies)."""
    xs = sorted(points)
    pos = ladder.position

    def line(a: float, b: float) -> float:
        slope = (points[b] - points[a]) / (pos(b) - pos(a))
        return points[b] + slope * (pos(x) - pos(b))

    left = [v for v in xs if v < x]
    right = [v for v in xs if v > x]
    lines = []
    if len(left) >= 2:
        lines.append(line(left[-2], left[-1]))
    if len(right) >= 2:
        lines.append(line(right[1], right[0]))
    return min(lines) if lines else None


def next_size(
    ladder: Ladder, trials: list[dict[str, Any]], min_effect: float, tolerance: float = 0.03
) -> tuple[float, float, str] | None:
    """(value, the most it may gain over the best value measured, why) of the value to try next, of
    those that could beat that by `min_effect` at a judged level and whose bound loses no more than
    `tolerance` against the value deployed at any (the rule would roll it back): first
    bracket (outside the values tried, the nearest step: the bound grows with distance only because
    the line does), then refine (between values tried, the highest bound). None when no value
    could; none at or beyond a value that failed to start."""
    measured = curve(ladder, trials)
    if not measured:
        return None
    deployed = deployed_size(ladder, trials)
    tried = {float(t["size"]) for t in trials if t.get("size") is not None}
    failed = [float(t["size"]) for t in trials if t.get("failed_start") and t.get("size") is not None]
    options = set(ladder.values) | {
        m
        for pts in measured.values()
        for a, b in zip(sorted(pts), sorted(pts)[1:], strict=False)
        if (m := ladder.between(a, b)) is not None
    }
    picks: list[tuple[bool, float, float, float, str]] = []  # (refine, steps out, -gain, value, why)
    known = tried | ({ladder.current} if ladder.current is not None else set())
    for x in sorted(options - known):
        if any(_beyond(x, f, ladder.current) for f in failed):
            continue
        rooms = [
            (level, most - pts[deployed], most - max(pts.values()))
            for level, pts in measured.items()
            if deployed in pts and (most := bound(pts, x, ladder)) is not None
        ]
        if not rooms or min(dep for _, dep, _ in rooms) < math.log(1 - tolerance):
            continue  # sure to regress beyond the tolerance somewhere, against what is deployed
        level, _, best = max(rooms, key=lambda r: r[2])
        if best < math.log1p(min_effect):
            continue  # nowhere could it beat the best value measured by the minimum effect
        gain = math.expm1(best)
        at = "" if level == "all" else f" at c={level}"
        top = max(measured[level], key=lambda v: measured[level][v])
        why = (
            f"sized search: the values tried so far leave {ladder.show(x)} room for up to "
            f"{gain:+.1%}{at} over the best ({ladder.show(top)})"
        )
        pts = measured[level]
        inside = min(pts) < x < max(pts)
        step = 0.0 if inside else abs(ladder.position(x) - ladder.position(deployed))
        picks.append((inside, step, -gain, x, why))
    if not picks:
        return None
    *_, gain, x, why = min(picks)
    return x, -gain, why


def deployed_size(ladder: Ladder, trials: list[dict[str, Any]]) -> float:
    """The lever's value deployed now: the last one kept, else the deployment's own."""
    kept = [float(t["size"]) for t in trials if t.get("decision") == "kept" and t.get("size") is not None]
    return kept[-1] if kept else ladder.current  # type: ignore[return-value]


def _beyond(x: float, failed: float, current: float | None) -> bool:
    """`x` is as far as a value that failed to start, or farther, on its side of the current one."""
    if current is None:
        return x == failed
    return (failed > current and x >= failed) or (failed < current and x <= failed)
