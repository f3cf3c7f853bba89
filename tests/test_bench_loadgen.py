"""The load generator against a real loopback HTTP server: numbers, partial results, errors."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from tests.test_bench_sse_server import Behaviour, SSEServer
from tools.bench.loadgen import run_repeated, run_sweep
from tools.bench.prompts import PromptFileError, load_prompt_file, random_prompts
from tools.bench.results import RequestResult, SweepResult, load_sweeps, save_sweeps, summarize_level
from tools.bench.workload import prompts_for_level
from tools.config import BenchConfig


def settings(**kw) -> BenchConfig:
    base = dict(concurrency=[1, 4], input_len=8, output_len=12, warmup=1, reps=2)
    return BenchConfig(**{**base, **kw})


@pytest.mark.parametrize("api", ["completions", "chat", "generate"])
def test_sweep_measures_every_level(api):
    with SSEServer(Behaviour(ttft_s=0.01, itl_s=0.002)) as srv:
        result = asyncio.run(run_sweep(srv.endpoint, settings(api=api)))
        sent = srv.requests
    assert not result.partial and result.errors == []
    assert result.server_info["served_model_name"] == "test-model"
    assert [lv.max_concurrency for lv in result.levels] == [1, 4]
    assert sent == 1 + 8 + 8  # warm-up + max(8, 2c) per level
    for lv in result.levels:
        assert lv.completed == lv.num_prompts == prompts_for_level(settings(), lv.max_concurrency)
        assert lv.total_output_tokens == 12 * lv.completed
        assert lv.mean_ttft_ms >= 10.0 and lv.median_itl_ms >= 2.0
        assert lv.mean_tpot_ms >= 2.0 and lv.p99_itl_ms >= lv.median_itl_ms
        assert lv.output_throughput == pytest.approx(lv.total_output_tokens / lv.duration)
        assert lv.total_throughput > lv.output_throughput
        assert all(len(r.itl_ms) == 11 for r in lv.requests)


def test_level_statistics_match_numpy():
    reqs = [
        RequestResult(ok=True, output_tokens=5, ttft_ms=t, e2e_ms=t + 40, itl_ms=[10, 10, 10, 10 + t])
        for t in (5.0, 7.0, 30.0, 11.0)
    ] + [RequestResult(ok=False, error="HTTP 500: boom")]
    lv = summarize_level(reqs, max_concurrency=2, duration=2.0)
    ttfts = [5.0, 7.0, 30.0, 11.0]
    assert lv.p99_ttft_ms == pytest.approx(np.percentile(ttfts, 99))
    assert lv.median_ttft_ms == pytest.approx(np.median(ttfts))
    assert lv.p90_itl_ms == pytest.approx(np.percentile([g for r in reqs for g in r.itl_ms], 90))
    assert lv.mean_tpot_ms == pytest.approx(10.0)
    assert (lv.completed, lv.failed, lv.errors) == (4, 1, {"HTTP 500: boom": 1})
    assert lv.output_throughput == pytest.approx(10.0) and not lv.ok


def test_no_successes_gives_missing_numbers_not_zero():
    lv = summarize_level([RequestResult(ok=False, error="x")], max_concurrency=1, duration=1.0)
    assert lv.output_throughput is None and lv.mean_ttft_ms is None and lv.p99_itl_ms is None


def test_server_dying_mid_run_gives_partial_result_with_cause():
    # warm-up 1 + level 1: 8 + the first wave of level 4: 4; the 14th request kills the server.
    with SSEServer(Behaviour(die_after=13)) as srv:
        result = asyncio.run(run_sweep(srv.endpoint, settings(concurrency=[1, 4, 8])))
    assert result.partial
    assert result.level(1).ok
    four = result.level(4)
    assert four.failed >= 1 and four.completed >= 1
    assert any("connection lost" in c or "cannot connect" in c for c in four.errors)
    assert result.level(8) is None
    assert any("server unreachable at concurrency 4" in e for e in result.errors)
    assert any("levels not measured: 8" in e for e in result.errors)


def test_unreachable_endpoint_is_partial_with_no_numbers():
    with SSEServer() as srv:
        endpoint = srv.endpoint
    result = asyncio.run(run_sweep(endpoint, settings()))
    assert result.partial and result.levels == []
    assert result.errors[0].startswith(f"cannot reach {endpoint}")


@pytest.mark.parametrize(
    ("behaviour", "cause"),
    [
        (Behaviour(status=500), "HTTP 500"),
        (Behaviour(malformed=True), "malformed stream: not JSON"),
        (Behaviour(no_done=True), "stream ended before [DONE]"),
        (Behaviour(probe_mode="empty"), "no output tokens"),
    ],
)
def test_bad_responses_are_failures_with_their_cause(behaviour, cause):
    with SSEServer(behaviour) as srv:
        result = asyncio.run(
            run_sweep(srv.endpoint, settings(concurrency=[2], warmup=0, prompts_per_level=4))
        )
    lv = result.level(2)
    assert result.partial and lv.completed == 0 and lv.failed == 4
    assert [c for c in lv.errors if c.startswith(cause)], lv.errors
    assert lv.output_throughput is None


def test_repeated_sweeps_save_and_load(tmp_path):
    with SSEServer() as srv:
        reps = asyncio.run(run_repeated(srv.endpoint, settings(concurrency=[2], prompts_per_level=4)))
    assert [r.seed for r in reps] == [0, 1]
    path = tmp_path / "r.json"
    save_sweeps(reps, path)
    data = json.loads(path.read_text())
    assert isinstance(data, list) and '"itl_ms"' not in json.dumps(data)
    assert data[0]["levels"][0]["output_throughput"] == reps[0].levels[0].output_throughput
    loaded = load_sweeps(path)
    assert [s.level(2).completed for s in loaded] == [4, 4]
    reps[0].save(tmp_path / "one.json")
    assert SweepResult.load(tmp_path / "one.json").settings["concurrency"] == [2]


def test_poisson_mode_records_the_rate():
    with SSEServer() as srv:
        result = asyncio.run(
            run_sweep(
                srv.endpoint, settings(concurrency=[4], warmup=0, prompts_per_level=8), request_rate=200.0
            )
        )
    assert result.level(4).request_rate == 200.0 and result.level(4).completed == 8


def test_progress_reports_live_tokens():
    seen = []
    with SSEServer(Behaviour(itl_s=0.01)) as srv:
        asyncio.run(
            run_sweep(
                srv.endpoint,
                settings(concurrency=[2], output_len=40, prompts_per_level=4),
                on_progress=seen.append,
            )
        )
    assert seen[-1].finished and seen[-1].done == 4 and seen[-1].output_tokens == 160
    assert any(0 < p.output_tokens < 160 for p in seen)


def test_random_prompts_exact_and_seeded():
    a = random_prompts(3, input_len=17, output_len=5, seed=1)
    assert all(len(p.token_ids) == 17 and p.output_len == 5 for p in a)
    assert a == random_prompts(3, input_len=17, output_len=5, seed=1)
    assert a != random_prompts(3, input_len=17, output_len=5, seed=2)


def test_prompt_file_sharegpt_and_errors(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text(
        json.dumps(
            {"conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "x"}]}
        )
        + "\n\n"
        + json.dumps({"prompt": "say hi", "output_len": 3})
        + "\n"
    )
    prompts = load_prompt_file(good, output_len=9)
    assert [(p.text, p.output_len) for p in prompts] == [("hello there", 9), ("say hi", 3)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{oops\n')
    with pytest.raises(PromptFileError, match="bad.jsonl:2"):
        load_prompt_file(bad, output_len=9)
    with SSEServer() as srv:
        result = asyncio.run(
            run_sweep(
                srv.endpoint, settings(concurrency=[1], api="chat", prompts_per_level=4), prompt_file=good
            )
        )
    assert result.level(1).completed == 4 and result.settings["prompt_file"] == str(good)


def test_no_garbage_collection_while_a_level_is_timed():
    """A full collection in a big process stalls the client's event loop for tenths of a second, a dip
    the server never had: the collector may run between levels, never inside one."""
    import gc
    import time

    events: list[tuple[str, float]] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            events.append(("gc", time.perf_counter()))

    def on_progress(p) -> None:
        events.append(("end" if p.finished else "tick", time.perf_counter()))

    old = gc.get_threshold()
    gc.callbacks.append(on_gc)
    gc.set_threshold(1, 1, 1)  # a collection after almost every allocation: one would land in any level
    try:
        with SSEServer(Behaviour(ttft_s=0.01, itl_s=0.03)) as srv:
            result = asyncio.run(run_sweep(srv.endpoint, settings(), on_progress=on_progress))
    finally:
        gc.callbacks.remove(on_gc)
        gc.set_threshold(*old)
    assert not result.partial
    # each level's window: from its first live tick to its final figure
    windows, start = [], None
    for kind, t in events:
        if kind == "tick" and start is None:
            start = t
        elif kind == "end":
            windows.append((start, t))
            start = None
    assert len(windows) == 2 and all(s is not None for s, _ in windows)
    collections = [t for kind, t in events if kind == "gc"]
    assert collections, "the low threshold must make the collector run (between levels)"
    assert not [t for t in collections for s, e in windows if s <= t <= e]


def test_a_stalled_request_stops_the_sweep_within_its_stall_bound():
    """A server that sends a first piece and then nothing: the first request that gets no byte for
    `stall_timeout_s` fails, what is in flight is cancelled and nothing more is sent."""
    import time

    bench = settings(concurrency=[1, 4, 8], warmup=0, stall_timeout_s=0.5)
    with SSEServer(Behaviour(hang_after=3)) as srv:
        started = time.monotonic()
        result = asyncio.run(run_sweep(srv.endpoint, bench))
        took, sent = time.monotonic() - started, srv.requests
    assert result.partial
    assert any("a request stalled at concurrency 1" in e and "no byte for 0.5 s" in e for e in result.errors)
    assert "levels not measured: 4, 8" in result.errors
    assert sent == 4 and took < 3  # the fourth request hung; the rest of the level was never sent


def test_a_request_is_bounded_in_all_even_while_bytes_trickle():
    bench = settings(concurrency=[1], warmup=0, output_len=400, request_timeout_s=0.5, stall_timeout_s=5)
    with SSEServer(Behaviour(itl_s=0.01)) as srv:  # a byte every 10 ms: never a stall, 4 s in all
        result = asyncio.run(run_sweep(srv.endpoint, bench))
    assert result.partial and any("over 0.5 s in all" in e for e in result.errors), result.errors


def test_a_repetition_not_allowed_to_start_is_never_sent():
    """`before_rep` is the budget's safe point: what it raises before a repetition stops the
    benchmark there, the repetitions before it whole, none of the next sent."""

    class OutOfTime(Exception):
        pass

    seen: list[int] = []

    def before(done: list) -> None:
        seen.append(len(done))
        if len(done) == 1:
            raise OutOfTime

    with SSEServer() as srv:
        try:
            asyncio.run(run_repeated(srv.endpoint, settings(concurrency=[2], reps=3), before_rep=before))
        except OutOfTime:
            pass
        else:
            raise AssertionError("the second repetition started")
        sent = srv.requests
    assert seen == [0, 1] and sent == 1 + 8  # warm-up and one level of one repetition, nothing after
