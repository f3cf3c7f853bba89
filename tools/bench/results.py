"""The benchmark result model: per-request records, per-level summaries, whole sweeps.

Level field names follow SGLang's `bench_serving` JSON (`output_throughput`, `mean_ttft_ms`,
`p99_itl_ms`, `max_concurrency`, ...) so numbers can be compared with SGLang's own client. A
statistic that could not be measured is `None`, never a made-up 0.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from tools.localfiles import write_text

FORMAT_VERSION = 1
_PCTS = {"mean": None, "median": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}
_LATENCIES = ("ttft", "tpot", "itl", "e2e_latency")


class RequestResult(BaseModel):
    """One request as the client saw it. Times in milliseconds from the moment it was sent."""

    ok: bool
    input_tokens: int = 0
    output_tokens: int = 0
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    itl_ms: list[float] = Field(default_factory=list, exclude=True)
    """Every inter-token gap; kept in memory for the level statistics, not written to JSON."""
    start_s: float = 0.0
    """Send time in seconds since the level started."""
    cached_tokens: int | None = None
    """Prompt tokens the server found in its prefix cache, as it reported them (SGLang: `/generate`'s
    `meta_info.cached_tokens`; the OpenAI routes' `usage.prompt_tokens_details` only under
    `--enable-cache-report`); None: not reported."""
    turn: int | None = None
    """The request's turn in its conversation (multi-turn workload); None: a prompt alone."""
    error: str | None = None
    text: str = Field("", exclude=True)

    def on_clock(self, scale: float) -> RequestResult:
        """This result with its times divided by `scale` (wall seconds per second of the server's
        clock, `BenchConfig.time_scale`): in the server's own seconds."""
        if scale == 1.0:
            return self
        ms = lambda v: None if v is None else v / scale  # noqa: E731
        return self.model_copy(
            update={"ttft_ms": ms(self.ttft_ms), "e2e_ms": ms(self.e2e_ms), "start_s": self.start_s / scale,
                    "itl_ms": [v / scale for v in self.itl_ms]}
        )  # fmt: skip

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token after the first, as bench_serving defines it."""
        if not self.ok or self.output_tokens < 2 or self.ttft_ms is None or self.e2e_ms is None:
            return None
        return (self.e2e_ms - self.ttft_ms) / (self.output_tokens - 1)


class TurnResult(BaseModel):
    """The requests of one turn of a level's conversations (multi-turn workload): how long their
    prompts were, how much of them the server found cached, and their time to first token."""

    turn: int
    completed: int
    mean_input_tokens: float
    total_cached_tokens: int | None = None
    cache_hit_rate: float | None = None
    """Cached prompt tokens / prompt tokens; None when the server reported no cached tokens."""
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None


class LevelResult(BaseModel):
    """The summary of one concurrency level (or one request rate), bench_serving field names."""

    max_concurrency: int
    request_rate: float | None = None
    """Poisson arrival rate in requests/s; None for closed-loop."""
    num_prompts: int
    duration: float | None = None
    completed: int = 0
    failed: int = 0
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    request_throughput: float | None = None
    input_throughput: float | None = None
    output_throughput: float | None = None
    total_throughput: float | None = None
    concurrency: float | None = None
    """Measured mean number of requests in flight (sum of latencies / duration)."""
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    p90_ttft_ms: float | None = None
    p95_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    p90_tpot_ms: float | None = None
    p95_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    p90_itl_ms: float | None = None
    p95_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    max_itl_ms: float | None = None
    mean_e2e_latency_ms: float | None = None
    median_e2e_latency_ms: float | None = None
    p90_e2e_latency_ms: float | None = None
    p95_e2e_latency_ms: float | None = None
    p99_e2e_latency_ms: float | None = None
    total_cached_tokens: int | None = None
    """Prompt tokens the server reported finding in its prefix cache (None: it reported none)."""
    cache_hit_rate: float | None = None
    """`total_cached_tokens` / the prompt tokens of the requests that reported them."""
    turns: list[TurnResult] = Field(default_factory=list)
    """Per turn of a multi-turn workload, first turn first (empty for prompts alone)."""
    errors: dict[str, int] = Field(default_factory=dict)
    """Distinct error causes and how many requests each ended."""
    accept_length: float | None = None
    """Speculative decoding's accept length over the level: SGLang's `avg_spec_accept_length` read
    after it (tokens per request per verify step, the bonus token included; the server's counters
    start again at the `/flush_cache` before each level), as `bench_serving` reports it; None on a
    server without speculative decoding."""
    goodput: float | None = None
    """A goodput search's result (req/s, `RateCurve.estimate`): this level is its run at the highest
    rate that held; None for every other level."""
    requests: list[RequestResult] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every request of the level completed."""
        return self.failed == 0 and self.completed > 0


class SweepResult(BaseModel):
    """One sweep over concurrency levels, with what was measured and against what."""

    format_version: int = FORMAT_VERSION
    backend: Literal["optagent", "sglang"] = "optagent"
    endpoint: str
    api: str
    settings: dict[str, Any] = Field(default_factory=dict)
    server_info: dict[str, Any] | None = None
    client_host: str = ""
    started_at: str = ""
    finished_at: str = ""
    seed: int = 0
    levels: list[LevelResult] = Field(default_factory=list)
    partial: bool = False
    """True when anything failed or a level is missing: treat the numbers as incomplete."""
    errors: list[str] = Field(default_factory=list)
    rate_curve: list[LevelResult] = Field(default_factory=list)
    """A goodput search's runs, in the order they ran (`request_rate` None: the closed-loop one)."""

    def level(self, concurrency: int) -> LevelResult | None:
        """The level run at `concurrency`, if any."""
        return next((lv for lv in self.levels if lv.max_concurrency == concurrency), None)

    def save(self, path: Path) -> None:
        """Write as indented JSON (missing parent directories are created; `tools.localfiles`)."""
        write_text(path, self.model_dump_json(indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> SweepResult:
        """Read one saved sweep."""
        return cls.model_validate_json(Path(path).read_text())


def load_sweeps(path: Path) -> list[SweepResult]:
    """Read a result file holding one sweep or a JSON list of repeated sweeps."""
    data = json.loads(Path(path).read_text())
    items = data if isinstance(data, list) else [data]
    return [SweepResult.model_validate(item) for item in items]


def save_sweeps(sweeps: list[SweepResult], path: Path) -> None:
    """Write repeated sweeps as a JSON list (one sweep is written as an object)."""
    if len(sweeps) == 1:
        sweeps[0].save(path)
        return
    write_text(path, json.dumps([s.model_dump(mode="json") for s in sweeps], indent=2) + "\n")


def _percentile(sorted_values: list[float], pct: float) -> float:
    """Linear-interpolated percentile (numpy's default), on an already sorted list."""
    k = (len(sorted_values) - 1) * pct / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return sorted_values[lo]
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def _describe(values: list[float], name: str) -> dict[str, float | None]:
    if not values:
        return {f"{p}_{name}_ms": None for p in _PCTS}
    values = sorted(values)
    out: dict[str, float | None] = {}
    for p, pct in _PCTS.items():
        out[f"{p}_{name}_ms"] = sum(values) / len(values) if pct is None else _percentile(values, pct)
    return out


def summarize_level(
    requests: list[RequestResult],
    *,
    max_concurrency: int,
    duration: float | None,
    request_rate: float | None = None,
) -> LevelResult:
    """Aggregate the requests of one level into bench_serving's statistics.

    Throughputs divide by `duration` (first send to last completion). Failed requests count in
    `failed` and `errors` but not in any latency or token statistic.
    """
    done = [r for r in requests if r.ok]
    errors: dict[str, int] = {}
    for r in requests:
        if not r.ok:
            cause = r.error or "unknown error"
            errors[cause] = errors.get(cause, 0) + 1
    fields: dict[str, Any] = {
        "max_concurrency": max_concurrency,
        "request_rate": request_rate,
        "num_prompts": len(requests),
        "duration": duration,
        "completed": len(done),
        "failed": len(requests) - len(done),
        "total_input_tokens": sum(r.input_tokens for r in done),
        "total_output_tokens": sum(r.output_tokens for r in done),
        "errors": errors,
        "requests": requests,
    }
    if done and duration and duration > 0:
        fields["request_throughput"] = len(done) / duration
        fields["input_throughput"] = fields["total_input_tokens"] / duration
        fields["output_throughput"] = fields["total_output_tokens"] / duration
        fields["total_throughput"] = (fields["total_input_tokens"] + fields["total_output_tokens"]) / duration
        fields["concurrency"] = sum(r.e2e_ms or 0.0 for r in done) / 1000.0 / duration
    series = {
        "ttft": [r.ttft_ms for r in done if r.ttft_ms is not None],
        "tpot": [t for r in done if (t := r.tpot_ms) is not None],
        "itl": [gap for r in done for gap in r.itl_ms],
        "e2e_latency": [r.e2e_ms for r in done if r.e2e_ms is not None],
    }
    for name in _LATENCIES:
        fields.update(_describe(series[name], name))
    fields["max_itl_ms"] = max(series["itl"]) if series["itl"] else None
    fields["total_cached_tokens"], fields["cache_hit_rate"] = _cache_hits(done)
    turns = sorted({r.turn for r in done if r.turn is not None})
    fields["turns"] = [_turn(t, [r for r in done if r.turn == t]) for t in turns]
    return LevelResult(**fields)


def _cache_hits(done: list[RequestResult]) -> tuple[int | None, float | None]:
    """Cached prompt tokens and their share of the prompt tokens, over the requests that reported
    them (None, None when none did)."""
    reported = [r for r in done if r.cached_tokens is not None]
    if not reported:
        return None, None
    cached, prompt = sum(r.cached_tokens or 0 for r in reported), sum(r.input_tokens for r in reported)
    return cached, (cached / prompt if prompt else None)


def _turn(turn: int, done: list[RequestResult]) -> TurnResult:
    cached, rate = _cache_hits(done)
    ttft = _describe([r.ttft_ms for r in done if r.ttft_ms is not None], "ttft")
    return TurnResult(
        turn=turn, completed=len(done), mean_input_tokens=sum(r.input_tokens for r in done) / len(done),
        total_cached_tokens=cached, cache_hit_rate=rate, mean_ttft_ms=ttft["mean_ttft_ms"],
        median_ttft_ms=ttft["median_ttft_ms"],
    )  # fmt: skip
