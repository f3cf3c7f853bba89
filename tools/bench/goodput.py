"""Goodput under an SLO: the highest Poisson request rate at which every limit still holds.

DistServe's goodput is the request rate a server sustains while meeting its latency limits. Here a
rate "holds" when, over one run of requests arriving as a Poisson process at that rate (SGLang
`bench_serving --request-rate`), every request completed, completions kept pace with arrivals
(`kept_up`: a short run above capacity ends before its queue breaks a limit) and every limit's
statistic (p99 TTFT, p99 TPOT, ...) stays at or under its bound. The search:

1. a closed-loop run (every request of a run at once) gives the scale: the first rate tried is
   half of its request throughput;
2. doubling from a rate that holds (halving from one that does not) brackets the edge (steps of
   1.25 from a goodput found before on the same server: the repetitions after a search's first);
3. bisection (geometric) narrows the bracket to `precision` (10%: a goodput figure is good to
   about a tenth), within `max_probes` runs.

The goodput is the highest rate that held below the lowest that broke: a noisy run that held above
a broken one does not raise it. Every run is kept as the rate curve, for the report and the plot.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tools.bench.objective import Slo
from tools.bench.results import LevelResult

Measure = Callable[[float | None], Awaitable[LevelResult]]
"""Runs one level at a Poisson rate (req/s), or closed-loop for None, and returns its summary."""


KEPT_UP = 0.9
"""A rate is served when completions keep at least this pace with the arrivals (`kept_up`)."""


def pace(level: LevelResult) -> float | None:
    """Completions per second over arrivals per second between the 10th and the 90th percentile of
    a run's requests (the same requests on both sides): ~1 below capacity, whatever the latency;
    below 1 when a queue grows. None with fewer than 10 timed requests."""
    done = sorted(level.requests, key=lambda r: r.start_s)
    if len(done) < 10 or any(r.e2e_ms is None for r in done):
        return None
    arrivals = [r.start_s for r in done]
    completions = sorted(r.start_s + r.e2e_ms / 1000.0 for r in done)  # type: ignore[operator]
    lo, hi = len(done) // 10, len(done) - 1 - len(done) // 10
    arrived, served = arrivals[hi] - arrivals[lo], completions[hi] - completions[lo]
    return arrived / served if arrived > 0 and served > 0 else 1.0


def kept_up(level: LevelResult) -> str | None:
    """Why the server fell behind the arrivals of a run, or None. A run of a few hundred requests
    above what the server sustains can end before its queue breaks a latency limit; it shows in
    the `pace`: completions slower than arrivals (below `KEPT_UP` of them). A run whose arrivals
    span under two median latencies cannot tell (the server may hold all of it at once)."""
    got = pace(level)
    if got is None:
        return f"{len(level.requests)} requests are too few to tell the pace"
    starts = [r.start_s for r in level.requests]
    span, e2e = max(starts) - min(starts), (level.median_e2e_latency_ms or 0.0) / 1000.0
    if level.request_rate is not None and span < 2 * e2e:
        return f"too short to tell: arrivals over {span:.1f} s, under two median latencies ({e2e:.1f} s)"
    return f"served at {got:.0%} of the arrival rate (a queue grows)" if got < KEPT_UP else None


def broken_limit(level: LevelResult, limits: list[Slo]) -> str | None:
    """Why a run does not meet the limits (a failed request, the server falling behind, a limit
    above its bound, a statistic not measured), or None when it meets every one."""
    if not level.ok:
        return f"{level.failed} of {level.num_prompts} requests failed"
    if behind := kept_up(level):
        return behind
    for slo in limits:
        value = getattr(level, slo.metric)
        if value is None:
            return f"{slo.metric} was not measured"
        if value > slo.max_ms:
            return f"{slo.metric} {value:,.1f} ms > {slo.max_ms:g} ms"
    return None


@dataclass
class RatePoint:
    """One run at one rate: its summary and the limit it broke (None: it held)."""

    rate: float
    level: LevelResult
    broken: str | None

    @property
    def held(self) -> bool:
        return self.broken is None


@dataclass
class RateCurve:
    """Every run of a goodput search, in the order they ran, and what they say."""

    limits: list[Slo]
    closed: LevelResult | None = None
    """The closed-loop run that scaled the search (None when it started from a rate given)."""
    ceiling: float | None = None
    """Request throughput of the closed-loop run, req/s."""
    points: list[RatePoint] = field(default_factory=list)

    @property
    def lowest_broken(self) -> float | None:
        return min((p.rate for p in self.points if not p.held), default=None)

    @property
    def goodput(self) -> float | None:
        """The highest rate that held below the lowest that broke (req/s); None: none held."""
        top = self.lowest_broken
        held = [p.rate for p in self.points if p.held and (top is None or p.rate < top)]
        return max(held, default=None)

    @property
    def estimate(self) -> float | None:
        """The goodput between the last rate that held and the first that broke: where each limit
        that broke there (and the pace) crosses its bound, interpolated on log scales; the lowest
        crossing. A figure that moves smoothly with the server, where `goodput` moves in steps of
        the search's precision (what a paired comparison of small effects needs). None: none held."""
        low, high = self.goodput, self.lowest_broken
        if low is None or high is None:
            return low
        at = {p.rate: p.level for p in self.points}
        a, b = at[low], at[high]
        crossings: list[float] = []
        if not b.ok:
            return low  # requests failed above: nothing to interpolate on
        bounds = [(getattr(a, s.metric), getattr(b, s.metric), s.max_ms) for s in self.limits]
        slow_a, slow_b = pace(a), pace(b)  # pace falls as the rate rises: its inverse rises
        if slow_a and slow_b:
            bounds.append((1 / slow_a, 1 / slow_b, 1 / KEPT_UP))
        for va, vb, bound in bounds:
            if va is None or vb is None or not (0 < va <= bound < vb):
                continue
            f = math.log(bound / va) / math.log(vb / va)
            crossings.append(low * (high / low) ** f)
        # none: what broke above is nothing to interpolate on (a run too short to tell)
        return max(low, min(crossings)) if crossings else low

    def sorted_points(self) -> list[RatePoint]:
        return sorted(self.points, key=lambda p: p.rate)

    def describe(self) -> str:
        limits = " and ".join(f"{s.metric} <= {s.max_ms:g} ms" for s in self.limits)
        if self.goodput is None:
            lowest = min((p.rate for p in self.points), default=0.0)
            return f"no rate tried (lowest {lowest:.3g} req/s) meets {limits}"
        above = self.lowest_broken
        edge = f" (broken at {above:.3g})" if above is not None else " (the highest tried)"
        return f"goodput {self.goodput:.3g} req/s with {limits}{edge}"


async def find_goodput(
    measure: Measure,
    limits: list[Slo],
    *,
    precision: float = 0.10,
    max_probes: int = 8,
    start: float | None = None,
) -> RateCurve:
    """Search the highest rate meeting `limits` (module docstring); `start` (a goodput found before
    on the same server) skips the closed-loop run and brackets in steps of 1.25 instead of 2. At
    most `max_probes` rate runs besides the closed-loop one."""
    if not limits:
        raise ValueError("a goodput search needs at least one limit")
    curve = RateCurve(limits=list(limits))
    step = 2.0 if start is None else 1.25
    if start is None:
        curve.closed = closed = await measure(None)
        curve.ceiling = closed.request_throughput
        if not closed.ok or not curve.ceiling:
            return curve  # the server does not serve the workload at all: no rate can hold
        start = curve.ceiling / 2

    async def probe(rate: float) -> bool:
        level = await measure(rate)
        point = RatePoint(rate, level, broken_limit(level, limits))
        curve.points.append(point)
        return point.held

    rate, floor = start, start / 64
    held = await probe(rate)
    lo, hi = (rate, None) if held else (None, rate)
    while len(curve.points) < max_probes and (lo is None or hi is None):
        if lo is None and hi is not None:  # stepping down to an edge that holds
            if hi / step < floor:
                return curve
            lo, hi = (hi / step, hi) if await probe(hi / step) else (None, hi / step)
        elif lo is not None:  # stepping up to one that breaks
            lo, hi = (lo, lo * step) if not await probe(lo * step) else (lo * step, None)
    while lo is not None and hi is not None and hi / lo > 1 + precision and len(curve.points) < max_probes:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if await probe(mid) else (lo, mid)
    return curve


GOODPUT_PROMPTS = 200
"""Requests per rate run at least: enough that a p99 is not the run's single slowest request."""
GOODPUT_SPANS = 4
"""A rate run's arrivals span at least this many median end-to-end latencies (`kept_up`)."""


def curve_as_dict(curve: RateCurve) -> dict[str, Any]:
    """The curve for JSON: limits, ceiling, goodput, and each run's summary (no per-request rows)."""
    return {
        "limits": [s.model_dump() for s in curve.limits],
        "ceiling_req_s": curve.ceiling,
        "goodput_req_s": curve.goodput,
        "runs": [
            {"rate": p.rate, "held": p.held, "broken": p.broken, **p.level.model_dump(exclude={"requests"})}
            for p in curve.points
        ],
    }
