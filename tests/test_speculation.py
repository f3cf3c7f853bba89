"""Speculative decoding judged on its acceptance (`agent.trial.speculation`): the accept length the
benchmark reads after each level, what the two sides' step times say speculation is worth, and a
candidate that makes it cost refused; on the simulated seed (MTP) the figure SGLang defines."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from agent.trial.speculation import Acceptance, judged, payoffs
from tools.bench.loadgen import run_sweep
from tools.config import BenchConfig

VERIFY_MS, DRAFT_MS = 16.0, 3.0


def _cell(steps: int, accept: float) -> dict:
    """A level where a step takes a verify forward and `steps` draft forwards, `accept` tokens a step."""
    return {"steps": steps, "accept_length": accept, "tpot_ms": (VERIFY_MS + steps * DRAFT_MS) / accept}


def test_two_step_counts_give_speculation_s_speed_up_over_plain_decoding():
    before = {1: Acceptance(3, 2.5, (VERIFY_MS + 3 * DRAFT_MS) / 2.5)}
    after = {1: Acceptance(1, 1.6, (VERIFY_MS + DRAFT_MS) / 1.6)}
    (p, q) = payoffs(before, after)[1]
    assert p == pytest.approx(2.5 * VERIFY_MS / (VERIFY_MS + 3 * DRAFT_MS))
    assert q == pytest.approx(1.6 * VERIFY_MS / (VERIFY_MS + DRAFT_MS))
    same = {1: Acceptance(3, 2.0, 12.0)}
    assert payoffs(before, same) == {}  # the same step count: the step's parts cannot be told apart


def test_a_candidate_that_makes_speculation_cost_is_refused_and_one_that_pays_is_not():
    kg = {"before": {1: _cell(3, 2.5), 64: _cell(3, 2.4)}, "after": {1: _cell(3, 2.5), 64: _cell(3, 2.4)}}
    worse = judged({**kg, "candidate": {1: _cell(5, 1.2), 64: _cell(5, 1.3)}})
    notes, why = worse
    assert notes[0] == "accept length c=1 2.50 -> 1.20, c=64 2.40 -> 1.30"
    assert why is not None and why.startswith("speculation stops paying at c=1 (accept length 1.20)")
    fine = judged({**kg, "candidate": {1: _cell(2, 2.0), 64: _cell(2, 1.9)}})
    assert fine[1] is None and "speed-up over plain decoding" in fine[0][1]
    assert judged({}) == ([], None)  # no speculation: nothing to say


def test_the_benchmark_reads_the_accept_length_sglang_reports_after_each_level(sim_server):
    server = sim_server("seed")  # MTP: 3 steps, top-k 1
    settings = BenchConfig(concurrency=[1, 8], input_len=128, output_len=64, warmup=1, prompts_per_level=8)
    result = asyncio.run(run_sweep(server.endpoint, settings))
    assert not result.partial, result.errors
    steps = result.server_info["speculative_num_steps"]
    for lv in result.levels:
        assert lv.accept_length is not None and 1.0 < lv.accept_length <= steps + 1
    # the server's counters start again at /flush_cache, as SGLang's do: no step since, no figure
    assert httpx.post(server.endpoint + "/flush_cache").status_code == 200
    state = httpx.get(server.endpoint + "/get_server_info").json()["internal_states"][0]
    assert "avg_spec_accept_length" not in state


def test_no_accept_length_without_speculation(sim_server):
    server = sim_server("h100-llama8b")
    settings = BenchConfig(concurrency=[2], input_len=64, output_len=16, warmup=0, prompts_per_level=4)
    result = asyncio.run(run_sweep(server.endpoint, settings))
    assert not result.partial and result.levels[0].accept_length is None


def test_a_trial_that_left_speculation_as_it_was_says_nothing_of_it():
    same = {"before": {1: _cell(3, 2.5)}, "candidate": {1: _cell(3, 2.51)}}
    assert judged(same) == ([], None)
    moved = {"before": {1: _cell(3, 2.5)}, "candidate": {1: _cell(3, 2.2)}}
    assert judged(moved)[0] == ["accept length c=1 2.50 -> 2.20"]
