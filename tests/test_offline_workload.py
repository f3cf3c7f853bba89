"""`sim.offline` on the benchmark's own workload (issue 29): the prompts the client sends at a level
(`tools.bench.workload.level_prompts`) admitted as the served simulator admits them, so the
noise-free model behind `benchmarks/bench_agent.py`'s oracle sees what prefix reuse is worth."""

from __future__ import annotations

import asyncio

import pytest

from sim.offline import offline_throughput
from tools.bench.loadgen import run_sweep
from tools.bench.workload import level_prompts
from tools.config import BenchConfig

OFF = ["--disable-radix-cache"]
SHARED = BenchConfig(
    concurrency=[8], workload="shared-prefix", gsp_output_len=64, prompts_per_level=32, warmup=0, reps=1
)


def offline_cost(settings: BenchConfig, c: int) -> float:
    prompts = level_prompts(settings, c, 0)
    on = offline_throughput("seed", concurrency=c, prompts=prompts)
    return offline_throughput("seed", OFF, concurrency=c, prompts=prompts) / on - 1


def test_offline_prefix_reuse_follows_the_workload():
    random = SHARED.model_copy(update={"workload": "random", "output_len": 64})
    mix = SHARED.model_copy(update={"workload": {"random": 0.5, "shared-prefix": 0.5}})
    costs = {name: offline_cost(s, 8) for name, s in (("random", random), ("mix", mix), ("shared", SHARED))}
    assert costs["random"] == 0.0  # no two random prompts share a 16-token block
    assert costs["shared"] < costs["mix"] < -0.03  # the mix pays for its shared half
    # the prompts are the client's: 32 of them, 2 groups of 16 sharing a 2048-token system prompt
    prompts = level_prompts(SHARED, 8, 0)
    assert len(prompts) == 32 and {p.input_len for p in prompts} == {2048 + 128}
    assert offline_throughput("seed", concurrency=8, prompts=prompts) > offline_throughput(
        "seed", concurrency=8, input_len=2176, output_len=64, requests=32
    )  # reuse pays against the same lengths with nothing shared


@pytest.mark.slow(seconds=40)
def test_offline_and_served_radix_cost_agree_on_shared_prefixes(sim_server):
    """The same prompts sent to the served simulator (fixed noise seed) cost about what the offline
    model says when the radix cache is off."""
    served = {}
    for flags in ([], OFF):
        srv = sim_server("seed", flags, time_scale=0.05, seed=7)
        result = asyncio.run(run_sweep(srv.endpoint, SHARED, seed=0))
        assert not result.partial and result.level(8).completed == 32
        served[bool(flags)] = result.level(8).output_throughput
        srv.stop()
    cost_served = served[True] / served[False] - 1
    cost_offline = offline_cost(SHARED, 8)
    print(f"c=8 --disable-radix-cache: served {cost_served:+.1%}, offline {cost_offline:+.1%}")
    assert cost_served < -0.03 and cost_offline < -0.03  # the same sign, beyond the noise
    assert abs(cost_served - cost_offline) < max(0.05, 0.35 * abs(cost_offline))  # a similar size
