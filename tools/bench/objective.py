"""What a comparison optimizes, chosen from the user's goal text, and an optional SLO.

The goal text is read once, where it enters (`read_goal`), into a `Goal`: the objective it names and
the benchmark lengths it asks for. What comes after (the session, the planner, the trial runner)
reads that value and never parses the text again."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field

THROUGHPUT_METRICS = ("output_throughput", "total_throughput", "request_throughput", "input_throughput")
_STATS = {"p99": "p99", "p95": "p95", "p90": "p90", "p50": "median", "median": "median", "mean": "mean",
          "average": "mean", "avg": "mean"}  # fmt: skip
_START, _END = r"(?<![A-Za-z0-9])", r"(?![A-Za-z])"
"""Word boundaries for the goal's words: "title" holds no "itl", "format c8" no "at c8"; a number
may follow a word ("c64", "p99")."""
_LAT = (
    rf"{_START}(ttft|time to first token|tpot|time per output token|itl|inter[- ]token latency|"
    rf"e2e(?: latency)?|end[- ]to[- ]end(?: latency)?){_END}"
)
_STAT = rf"{_START}(p99|p95|p90|p50|median|mean|average|avg){_END}"
_LEVEL = rf"(?:{_START}(?:at|for){_END}|@)\s*(?:concurrency|c|a concurrency of){_END}\s*(?:=|:|of)?\s*(\d+)"
_SLO = re.compile(
    rf"(?:{_STAT}\s+)?{_LAT}\s*(?:{_LEVEL}\s*)?(?:<=?|{_START}(?:under|below|at most|less than|within|not above))\s*"
    rf"(\d+(?:\.\d+)?)\s*(ms|s)\b(?:\s*{_LEVEL})?",
    re.I,
)


class Slo(BaseModel):
    """A service-level limit a candidate must meet: `metric` (a `*_ms` level field) <= `max_ms`,
    at `level` or at every level."""

    metric: str
    max_ms: float
    level: int | None = None

    def values(self, reps: list[Any]) -> dict[int, list[float]]:
        """Per level the limit covers (its level, else every level), the metric's measured values."""
        out: dict[int, list[float]] = {}
        for sweep in reps:
            for lv in sweep.levels:
                if self.level is None or lv.max_concurrency == self.level:
                    value = getattr(lv, self.metric)
                    out.setdefault(lv.max_concurrency, []).extend([] if value is None else [value])
        return dict(sorted(out.items()))

    def broken_by(self, reps: list[Any], known_good: list[Any] | None = None) -> str | None:
        """Why a block of sweeps breaks the limit, or None: at a level it covers the metric's mean
        over the repetitions exceeds `max_ms` (or was not measured). With `known_good`, a level
        where known-good's mean breaks it too is not held against the block: there the limit was
        not being kept, and a change is judged by the goal's objective alone."""
        already = {c for c, v in self.values(known_good or []).items() if v and sum(v) / len(v) > self.max_ms}
        for c, v in self.values(reps).items():
            if c in already:
                continue
            if not v:
                return f"{self.metric} at concurrency {c} was not measured"
            if (mean := sum(v) / len(v)) > self.max_ms:
                return (
                    f"{self.metric} at concurrency {c} is {mean:,.1f} ms over {len(v)} repetitions, "
                    f"above the limit of {self.max_ms:g} ms"
                )
        return None


class Objective(BaseModel):
    """The number a comparison decides on: the geometric mean of `metrics` over `levels` (None:
    every level both sides measured; `lowest_level`: only the lowest of those)."""

    kind: Literal["throughput", "latency", "metric", "goodput"] = "throughput"
    metrics: list[str] = ["output_throughput"]
    levels: list[int] | None = None
    lowest_level: bool = False
    slo: Slo | None = None
    limits: list[Slo] = []
    """A goodput goal's limits: the highest Poisson request rate meeting all of them is the
    objective (`tools.bench.goodput`); empty for every other kind."""
    description: str = "geometric mean of output_throughput across levels"
    words: str = ""
    """The words of the goal the objective was read from ('' for the default: nothing matched)."""

    @property
    def higher_is_better(self) -> bool:
        """Throughputs go up, latencies go down; one objective never mixes the two."""
        return self.metrics[0] in (*THROUGHPUT_METRICS, "goodput")


def _limit(m: re.Match[str]) -> Slo:
    stat, name, lvl1, value, unit, lvl2 = m.groups()
    level = lvl1 or lvl2
    max_ms = float(value) * (1000.0 if unit.lower() == "s" else 1.0)
    return Slo(metric=_latency_field(stat or "p99", name), max_ms=max_ms, level=int(level) if level else None)


def _goodput(text: str) -> Objective:
    """A goodput goal: every latency limit it names (p99 unless it says otherwise), no level."""
    limits = [_limit(m) for m in _SLO.finditer(text)]
    if not limits:
        raise GoalError(
            f"goodput needs latency limits, none found in {text!r}: e.g. "
            "'maximize goodput with p99 TTFT under 300 ms and p99 TPOT under 40 ms'"
        )
    if leveled := [s for s in limits if s.level is not None]:
        raise GoalError(
            f"a goodput limit holds at every request rate, not at a concurrency: {leveled[0].metric} "
            f"at concurrency {leveled[0].level} in {text!r}"
        )
    named = " and ".join(f"{s.metric} <= {s.max_ms:g} ms" for s in limits)
    return Objective(
        kind="goodput", metrics=["goodput"], limits=limits, words=text,
        description=f"goodput: the highest request rate (req/s) with {named}",
    )  # fmt: skip


def _latency_field(stat: str | None, name: str) -> str:
    name = name.lower()
    base = (
        "ttft" if name.startswith(("ttft", "time to"))
        else "tpot" if name.startswith(("tpot", "time per"))
        else "itl" if name.startswith(("itl", "inter"))
        else "e2e_latency"
    )  # fmt: skip
    return f"{_STATS[(stat or 'median').lower()]}_{base}_ms"


_PER_USER = re.compile(
    r"\b(?:tokens?|tok|tps)\s*(?:(?:/|per)\s*(?:s|sec|second)\s*)?(?:/|per)\s*(?:user|request|stream|sequence)\b"
    r"|\bper[- ](?:user|request|stream)\s+(?:throughput|tok/s|tokens?/s|speed|tps)\b",
    re.I,
)
"""Words for one stream's speed ("tokens per second per user", "per-user throughput"): TPOT."""


def objective_from_goal(goal: str | None) -> Objective:
    """Pick the objective from free text. Examples:

    - "maximize throughput" (also the default) -> geometric mean of output tok/s over levels
    - "lower latency" -> median TTFT and TPOT at the lowest concurrency
    - "p99 ttft at concurrency 8" -> that metric at that level
    - "... keeping p99 TTFT under 500 ms" -> adds an SLO that candidates must meet
    """
    text = (goal or "").strip()
    if re.search(rf"{_START}goodput{_END}", text, re.I):
        return _goodput(text)
    slo = None
    if m := _SLO.search(text):
        slo = _limit(m)
        text = text[: m.start()] + text[m.end() :]
    level_m = re.search(_LEVEL, text, re.I)
    level = int(level_m.group(1)) if level_m else None
    per_user = _PER_USER.search(text)
    lat = re.search(rf"(?:{_STAT}\s+)?{_LAT}", text, re.I)
    if per_user and not lat:  # one stream's decode speed: 1000 / its time per output token
        where = f"concurrency {level}" if level else "every level"
        return Objective(kind="metric", metrics=["median_tpot_ms"], levels=[level] if level else None, slo=slo,
                         description=f"median_tpot_ms at {where} (each user's tok/s is 1000 / TPOT)",
                         words=" ... ".join(w for w in (per_user.group(0), level_m and level_m.group(0)) if w))  # fmt: skip
    if lat:
        field = _latency_field(lat.group(1), lat.group(2))
        where = f"concurrency {level}" if level else "every level"
        return Objective(kind="metric", metrics=[field], levels=[level] if level else None, slo=slo,
                         description=f"{field} at {where}",
                         words=" ... ".join(w for w in (lat.group(0), level_m and level_m.group(0)) if w))  # fmt: skip
    tput = re.search(
        rf"{_START}(?:(request|total|input|output)\s*)?(?:throughputs?|tok/s|tokens?/s|req/s){_END}",
        text,
        re.I,
    )
    if tput and (tput.group(1) or level):
        field = f"{(tput.group(1) or 'output').lower()}_throughput"
        if "req/s" in tput.group(0).lower():
            field = "request_throughput"
        where = f"concurrency {level}" if level else "across levels"
        return Objective(kind="metric", metrics=[field], levels=[level] if level else None, slo=slo,
                         description=f"{field} at {where}" if level else f"geometric mean of {field} {where}",
                         words=" ... ".join(w for w in (tput.group(0).strip(), level_m and level_m.group(0)) if w))  # fmt: skip
    latency = re.search(
        rf"{_START}(?:\w*latenc\w*|responsive\w*|interactive\w*|faster (?:first|response){_END})", text, re.I
    )
    if latency and not tput:
        return Objective(kind="latency", metrics=["median_ttft_ms", "median_tpot_ms"], lowest_level=True,
                         slo=slo, description="median TTFT and TPOT at the lowest concurrency",
                         words=latency.group(0))  # fmt: skip
    return Objective(slo=slo, words=tput.group(0).strip() if tput else "")


GOAL_EXAMPLES = (
    "improve throughput",
    "maximize output throughput at concurrency 64",
    "lower latency",
    "p99 ttft at concurrency 8",
    "improve throughput keeping p99 TTFT under 500 ms",
    "maximize goodput with p99 TTFT under 300 ms and p99 TPOT under 40 ms",
)


class GoalError(ValueError):
    """A goal no objective can be read from; the message suggests goals that can."""


_LENGTHS = re.compile(
    r"\b(long|longer|short|shorter)\s+(prompts?|inputs?|contexts?|documents?|outputs?|answers?|"
    r"responses?|generations?|completions?)\b",
    re.I,
)
LONG_INPUT, SHORT_INPUT, LONG_OUTPUT, SHORT_OUTPUT = 4096, 128, 1024, 32


def _length_hints(goal: str | None) -> tuple[dict[str, int], str]:
    """Benchmark lengths the goal asks for, and the words it asked with: "long prompts" ->
    ({"input_len": 4096}, "long prompts"); "short answers" -> output_len 32. ({}, '') without."""
    hints: dict[str, int] = {}
    words = []
    for m in _LENGTHS.finditer(goal or ""):
        long = m.group(1).lower().startswith("long")
        if m.group(2).lower().startswith(("prompt", "input", "context", "document")):
            hints["input_len"] = LONG_INPUT if long else SHORT_INPUT
        else:
            hints["output_len"] = LONG_OUTPUT if long else SHORT_OUTPUT
        words.append(m.group(0))
    return hints, ", ".join(words)


def unmeasured_levels(objective: Objective, measured: list[int]) -> list[int]:
    """The concurrency levels the objective or its limit names that `measured` lacks: a goal "at
    concurrency 512" is judged at 512, so the benchmark must measure it there too."""
    slo = [objective.slo.level] if objective.slo is not None and objective.slo.level else []
    return sorted({c for c in [*(objective.levels or []), *slo] if c not in measured})


class Goal(BaseModel):
    """The user's goal, read once (`read_goal`): its text, the objective it names, and the benchmark
    lengths it asks for."""

    text: str = ""
    objective: Objective = Field(default_factory=Objective)
    lengths: dict[str, int] = {}
    """Benchmark lengths the goal asks for: "long prompts" -> {"input_len": 4096}; {} without."""
    length_words: str = ""
    """The words that asked for `lengths` ("long prompts"; '' without)."""

    @property
    def named(self) -> bool:
        """Whether the words name an objective or a limit (an empty goal names the default)."""
        return bool(self.objective.words or self.objective.slo is not None or not self.text.strip())


def read_goal(goal: str | None, *, strict: bool = True) -> Goal:
    """The goal text read once: its objective (`objective_from_goal`) and its benchmark lengths.
    `strict` refuses a goal whose words name no objective (the default is chosen only for an empty
    goal): `GoalError` with goals that work, instead of silently throughput."""
    text = goal or ""
    lengths, words = _length_hints(text)
    read = Goal(text=text, objective=objective_from_goal(text), lengths=lengths, length_words=words)
    if read.named or not strict:
        return read
    tries = "; ".join(f"'{g}'" for g in GOAL_EXAMPLES)
    raise GoalError(f"cannot tell what to optimize from {goal!r}: name throughput or latency, e.g. {tries}")
