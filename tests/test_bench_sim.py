"""The benchmark engine against the simulated SGLang server (a real subprocess on loopback)."""

from __future__ import annotations

import asyncio

import pytest

from tools.bench.loadgen import run_repeated, run_sweep
from tools.bench.stats import compare
from tools.config import BenchConfig

SMALL = dict(concurrency=[1, 4], input_len=128, output_len=32, warmup=1)


@pytest.mark.parametrize("api", ["completions", "chat", "generate"])
def test_sweep_against_simulator(sim_server, api):
    server = sim_server("seed")
    result = asyncio.run(run_sweep(server.endpoint, BenchConfig(api=api, **SMALL)))
    assert not result.partial, result.errors
    assert result.server_info["served_model_name"] == "qwen3.5-122b"
    for lv in result.levels:
        assert lv.completed == lv.num_prompts and lv.total_output_tokens == 32 * lv.completed
        assert lv.median_ttft_ms > 0 and lv.median_tpot_ms > 0 and lv.output_throughput > 0
    if api != "chat":  # token-id prompts: the server counts exactly input_len tokens
        assert result.levels[0].total_input_tokens == 128 * result.levels[0].completed


def test_simulator_killed_mid_run_gives_partial_result(sim_server):
    server = sim_server("seed")
    killed = []

    def on_progress(p):
        if p.output_tokens > 0 and not p.finished and not killed:
            server.proc.kill()
            killed.append(p)

    settings = BenchConfig(concurrency=[2, 8], input_len=64, output_len=2048, warmup=0, prompts_per_level=4)
    result = asyncio.run(run_sweep(server.endpoint, settings, on_progress=on_progress))
    assert killed and killed[0].concurrency == 2 and result.partial
    two = result.level(2)
    assert two.failed > 0 and any("connection lost" in e or "cannot connect" in e for e in two.errors), (
        two.errors
    )
    assert result.level(8) is None and "levels not measured: 8" in result.errors[-1]
    assert "server unreachable at concurrency 2" in result.errors[0]


def test_compare_detects_a_slower_configuration(sim_server):
    settings = BenchConfig(concurrency=[1, 16], input_len=128, output_len=64, warmup=1, reps=3)
    base = sim_server("seed", time_scale=0.02)
    baseline = asyncio.run(run_repeated(base.endpoint, settings))
    base.stop()
    # One request at a time: concurrency 16 collapses to the speed of concurrency 1.
    slow = sim_server("seed", ["--max-running-requests", "1"], time_scale=0.02)
    candidate = asyncio.run(run_repeated(slow.endpoint, settings))
    result = compare(baseline, candidate)
    assert result.verdict == "regressed", result.summary
    assert result.ratio < 0.8
