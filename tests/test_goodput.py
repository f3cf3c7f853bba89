"""Goodput under an SLO: the goal read into limits, the rate search, the pace check, and
`optagent bench --goal` against the simulated server (its queueing is SGLang's scheduler's)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench.goodput import RateCurve, broken_limit, find_goodput, kept_up
from tools.bench.loadgen import rate_runs
from tools.bench.objective import GoalError, Slo, read_goal
from tools.bench.results import LevelResult, RequestResult, SweepResult, summarize_level
from tools.config import BenchConfig

OPTAGENT = [sys.executable, "-c", "from agent.cli.main import app; app()"]
GOAL = "maximize goodput with p99 TTFT under 2 s and p99 TPOT under 60 ms"


def test_a_goodput_goal_names_every_limit_and_nothing_else_reads_as_one() -> None:
    objective = read_goal("maximize goodput with p99 TTFT under 300 ms and p95 TPOT < 0.04 s").objective
    assert objective.kind == "goodput" and objective.higher_is_better
    assert objective.limits == [
        Slo(metric="p99_ttft_ms", max_ms=300.0),
        Slo(metric="p95_tpot_ms", max_ms=40.0),
    ]
    assert read_goal("goodput with ttft within 1 s").objective.limits == [
        Slo(metric="p99_ttft_ms", max_ms=1000.0)
    ]
    kept = read_goal("improve throughput keeping p99 TTFT under 500 ms").objective
    assert kept.kind == "throughput" and kept.limits == [] and kept.slo is not None
    with pytest.raises(GoalError, match="goodput needs latency limits"):
        read_goal("maximize goodput")
    with pytest.raises(GoalError, match="not at a concurrency"):
        read_goal("goodput with p99 ttft at concurrency 8 under 300 ms")


def _level(rate: float, ttft_ms: float, *, pace: float = 1.0, n: int = 100):  # type: ignore[no-untyped-def]
    """A run at `rate` whose every request waits `ttft_ms` for its first token and whose
    completions come at `pace` times the arrivals' pace."""
    reqs = []
    for i in range(n):
        start = i / rate
        done = i / (rate * pace) + 0.5  # completion time: a queue grows when pace < 1
        reqs.append(RequestResult(ok=True, output_tokens=11, ttft_ms=ttft_ms, e2e_ms=(done - start) * 1000 + ttft_ms,
                                  start_s=start))  # fmt: skip
    return summarize_level(reqs, max_concurrency=n, duration=n / rate + 1, request_rate=rate)


def test_the_search_brackets_then_bisects_to_the_edge_in_few_runs() -> None:
    """A server whose TTFT passes 300 ms above 10 req/s: found within 10% in at most 8 runs, none
    held above one that broke; a server that breaks at every rate has no goodput."""
    limits = [Slo(metric="p99_ttft_ms", max_ms=300.0)]
    asked: list[float | None] = []

    async def server(rate: float | None):  # type: ignore[no-untyped-def]
        asked.append(rate)
        return _level(rate or 40.0, 100.0 if rate is None or rate <= 10 else 900.0)

    curve = asyncio.run(find_goodput(server, limits))
    assert asked[0] is None and curve.ceiling == pytest.approx(100 / (100 / 40 + 1))  # closed loop first
    assert curve.goodput is not None and 10 / 1.1 <= curve.goodput <= 10
    assert curve.lowest_broken is not None and curve.lowest_broken / curve.goodput <= 1.1
    assert len(curve.points) <= 8 and "goodput" in curve.describe()

    async def hopeless(rate: float | None):  # type: ignore[no-untyped-def]
        return _level(rate or 40.0, 900.0)

    none = asyncio.run(find_goodput(hopeless, limits))
    assert none.goodput is None and "no rate tried" in none.describe()
    assert min(p.rate for p in none.points) >= none.ceiling / 128  # it gave up at 1/64 of the start


def test_a_noisy_run_held_above_a_broken_one_does_not_raise_the_goodput() -> None:
    limits = [Slo(metric="p99_ttft_ms", max_ms=300.0)]
    curve = RateCurve(limits=limits)
    from tools.bench.goodput import RatePoint

    for rate, ttft in ((5.0, 100.0), (8.0, 900.0), (9.0, 100.0)):
        level = _level(rate, ttft)
        curve.points.append(RatePoint(rate, level, broken_limit(level, limits)))
    assert curve.goodput == 5.0 and curve.lowest_broken == 8.0


def test_completions_falling_behind_arrivals_break_the_rate_whatever_the_latency() -> None:
    assert kept_up(_level(10.0, 50.0, pace=1.0)) is None
    assert kept_up(_level(10.0, 50.0, pace=0.95)) is None  # within the measure's reach
    behind = kept_up(_level(10.0, 50.0, pace=0.7))
    assert behind is not None and "70% of the arrival rate" in behind
    assert broken_limit(_level(10.0, 50.0, pace=0.7), [Slo(metric="p99_ttft_ms", max_ms=300.0)]) == behind
    # a server that holds the whole run at once keeps pace with any rate: the run is too short to tell
    burst = kept_up(_level(1000.0, 50.0))
    assert burst is not None and burst.startswith("too short to tell: arrivals over 0.1 s")


@pytest.mark.slow(seconds=60)
@pytest.mark.quiet
def test_the_simulated_server_has_a_goodput_below_what_it_serves_all_at_once(sim_server) -> None:  # type: ignore[no-untyped-def]
    """On the seed (SGLang's scheduler simulated at 10x): rates up to the goodput meet both limits,
    the first above it breaks one of them or falls behind; the same limits made stricter give a
    lower goodput (the search follows the server, not a constant)."""
    srv = sim_server("seed", time_scale=0.1)
    settings = BenchConfig(input_len=1024, output_len=256, warmup=2, time_scale=0.1)
    loose = read_goal(GOAL).objective.limits
    curve = asyncio.run(find_goodput(rate_runs(srv.endpoint, settings, prompts=150), loose))
    assert curve.goodput is not None and curve.ceiling is not None, curve.describe()
    held = [p for p in curve.points if p.held]
    assert all(p.level.p99_ttft_ms <= 2000 and p.level.p99_tpot_ms <= 60 for p in held)
    assert curve.lowest_broken is not None and curve.lowest_broken > curve.goodput
    strict = read_goal("goodput with p99 TTFT under 600 ms and p99 TPOT under 60 ms").objective.limits
    tighter = asyncio.run(find_goodput(rate_runs(srv.endpoint, settings, prompts=150), strict))
    assert tighter.goodput is not None and tighter.goodput < curve.goodput, (
        tighter.describe(),
        curve.describe(),
    )


@pytest.mark.slow(seconds=60)
@pytest.mark.quiet
def test_bench_goal_prints_the_rate_curve_and_saves_it(sim_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    srv = sim_server("seed", time_scale=0.05)
    config = tmp_path / "optagent.toml"
    config.write_text(
        f'[target]\nendpoint = "{srv.endpoint}"\n[bench]\ninput_len = 1024\noutput_len = 256\n'
        "warmup = 2\ntime_scale = 0.05\n"
    )
    out, png = tmp_path / "curve.json", tmp_path / "curve.png"
    done = subprocess.run(
        [*OPTAGENT, "bench", "--config", str(config), "--goal", GOAL, "--prompts-per-level", "120",
         "--json", str(out), "--plot", str(png)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rate curve (Poisson arrivals)" in done.stdout and "p99_ttft_ms <= 2000 ms" in done.stdout
    saved = json.loads(out.read_text())
    assert saved["goodput_req_s"] is not None and len(saved["runs"]) >= 3
    assert f"goodput {saved['goodput_req_s']:.3g} req/s" in done.stdout
    assert all(r["completed"] == r["num_prompts"] >= 120 for r in saved["runs"]) and {
        r["held"] for r in saved["runs"]
    } == {
        True,
        False,
    }
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["bench", "--goal", "improve throughput"], "takes a goodput goal"),
        (["bench", "--goal", "maximize goodput"], "goodput needs latency limits"),
        (["bench", "--goal", GOAL, "--concurrency", "1,8"], "--concurrency cannot be used"),
        (["bench", "--goal", GOAL, "--request-rate", "3"], "--request-rate cannot be used"),
    ],
)
def test_a_goodput_goal_where_it_cannot_serve_exits_2_before_anything_runs(
    args: list[str], says: str, tmp_path: Path
) -> None:
    config = tmp_path / "optagent.toml"  # a server nobody listens at: nothing may reach it
    config.write_text('[target]\nendpoint = "http://127.0.0.1:9"\n')
    done = subprocess.run([*OPTAGENT, *args, "--config", str(config)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, "COLUMNS": "300"})  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in " ".join((done.stdout + done.stderr).split())


def test_the_estimate_is_where_the_broken_limit_crosses_its_bound_between_the_edge_runs() -> None:
    """Held at 8 req/s with p99 TTFT 200 ms, broken at 10 with 400 ms, limit 300: the crossing on
    log scales is 8 x 1.25^(ln 1.5 / ln 2) = 9.11 req/s; `goodput` stays the step the search took."""
    from tools.bench.goodput import RatePoint

    limits = [Slo(metric="p99_ttft_ms", max_ms=300.0)]
    curve = RateCurve(limits=limits)
    for rate, ttft in ((4.0, 100.0), (8.0, 200.0), (10.0, 400.0)):
        level = _level(rate, ttft)
        curve.points.append(RatePoint(rate, level, broken_limit(level, limits)))
    assert curve.goodput == 8.0
    assert curve.estimate == pytest.approx(8 * 1.25 ** (math.log(1.5) / math.log(2)))
    behind = _level(10.0, 250.0, pace=0.5)  # broken by the pace alone, under the latency limit
    curve.points[-1] = RatePoint(10.0, behind, broken_limit(behind, limits))
    assert curve.points[-1].broken and 8.0 < curve.estimate < 10.0
    burst = _level(10.0, 100.0, n=10)  # broken only as too short to tell: nothing to interpolate on
    curve.points[-1] = RatePoint(10.0, burst, broken_limit(burst, limits))
    assert (curve.points[-1].broken or "").startswith("too short") and curve.estimate == 8.0


def test_goodput_limits_in_the_config_are_latency_statistics_at_one_run_size() -> None:
    from pydantic import ValidationError

    ok = BenchConfig(goodput_limits={"p99_ttft_ms": 300, "median_tpot_ms": 40}, concurrency=[200])
    assert ok.goodput_limits == {"p99_ttft_ms": 300.0, "median_tpot_ms": 40.0}
    for bad, says in (
        ({"goodput_limits": {"p99_ttft": 300}, "concurrency": [200]}, "no latency statistic"),
        ({"goodput_limits": {"p99_ttft_ms": 0}, "concurrency": [200]}, "above 0 ms"),
        ({"goodput_limits": {"p99_ttft_ms": 300}, "concurrency": [1, 8]}, "one concurrency value"),
    ):
        with pytest.raises(ValidationError, match=says):
            BenchConfig(**bad)


def _goodput_sweep(seed: int, value: float | None) -> SweepResult:
    level = (
        []
        if value is None
        else [LevelResult(max_concurrency=200, num_prompts=200, completed=200, goodput=value)]
    )
    return SweepResult(endpoint="http://x", api="completions", seed=seed, levels=level, partial=value is None)


def test_a_paired_comparison_of_goodput_searches_decides_on_the_goodput() -> None:
    """Blocks of goodput repetitions go through the same A/B/A statistics as sweeps: +15% on three
    repetitions a side is kept; a candidate whose search found no rate meeting the limits is not."""
    from tools.bench.paired import paired_compare

    objective = read_goal(GOAL).objective
    rng = random.Random(3)
    block = lambda g: [_goodput_sweep(r, g * math.exp(rng.gauss(0, 0.01))) for r in range(3)]  # noqa: E731
    better = paired_compare(block(10.0), block(11.5), block(10.0), objective)
    assert better.verdict == "improved" and better.ratio == pytest.approx(1.15, abs=0.03), better.summary
    assert better.summary.startswith("improved") and "goodput" in better.summary
    same = paired_compare(block(10.0), block(10.0), block(10.0), objective)
    assert same.verdict in ("no_change", "inconclusive")
    none = paired_compare(block(10.0), [_goodput_sweep(r, None) for r in range(3)], block(10.0), objective)
    assert none.verdict == "regressed"


@pytest.mark.slow(seconds=60)
@pytest.mark.quiet
def test_with_goodput_limits_a_sweep_is_a_search_and_the_next_starts_where_it_ended(sim_server) -> None:  # type: ignore[no-untyped-def]
    from tools.bench.loadgen import goodput_hint, run_sweep

    srv = sim_server("seed", time_scale=0.05)
    settings = BenchConfig(input_len=1024, output_len=256, warmup=1, time_scale=0.05, concurrency=[120],
                           goodput_limits={"p99_ttft_ms": 2000, "p99_tpot_ms": 60})  # fmt: skip
    first = asyncio.run(run_sweep(srv.endpoint, settings, seed=0))
    assert not first.partial and [lv.max_concurrency for lv in first.levels] == [120], first.errors
    found = first.levels[0].goodput
    assert found and first.rate_curve[0].request_rate is None  # from scratch: the closed loop first
    held = [lv for lv in first.rate_curve if lv.request_rate and lv.request_rate <= found]
    assert held and all(lv.p99_ttft_ms <= 2000 and lv.p99_tpot_ms <= 60 for lv in held)
    again = asyncio.run(run_sweep(srv.endpoint, settings, seed=1, start_rate=goodput_hint([first])))
    assert again.rate_curve[0].request_rate == pytest.approx(found)  # no closed loop: it starts there
    assert len(again.rate_curve) < len(first.rate_curve)
    assert again.levels[0].goodput == pytest.approx(found, rel=0.25)


def test_a_goodput_decision_reads_as_a_rate_where_higher_is_better() -> None:
    from agent.transcripts.markdown import metric_label
    from tools.bench.effect import Effect

    assert metric_label("goodput") == "goodput req/s"
    assert not Effect(metric="goodput", rule="objective", verdict="improved").lower_is_better
    assert Effect(metric="p99_ttft_ms", rule="objective", verdict="improved").lower_is_better
