"""A short live run of the seed scenario (time-scaled) lands on the session's numbers.

The exact 10% check is on the model in virtual time (test_sim_model.py); this one checks that the
live server, HTTP streaming included, delivers what the model says, measured by the project's own
load generator (one connection per slot: httpx's shared pool rescans every connection on each request,
which at c=64 made the client, not the server, set the pace), with room for a busy machine.
"""

from __future__ import annotations

import asyncio

from tests.fixtures.sim import SimServer
from tools.bench.loadgen import run_sweep
from tools.config import BenchConfig

SCALE = 0.3


def _closed_loop(endpoint: str, concurrency: int, total: int) -> float:
    """Output tokens per simulated second for `total` 1024-in/256-out requests, `concurrency` at a time."""
    settings = BenchConfig(
        concurrency=[concurrency], input_len=1024, output_len=256, prompts_per_level=total, warmup=1
    )
    sweep = asyncio.run(run_sweep(endpoint, settings))
    level = sweep.level(concurrency)
    assert level is not None and level.ok and not sweep.partial, sweep.errors
    return level.output_throughput * SCALE  # wall seconds are SCALE simulated seconds


def test_seed_live_throughput_near_the_session(sim_server) -> None:  # type: ignore[no-untyped-def]
    srv: SimServer = sim_server("seed", time_scale=SCALE, seed=3, env={"OPTAGENT_SIM_STARTUP_S": "2"})
    c1 = _closed_loop(srv.endpoint, 1, 2)
    c64 = _closed_loop(srv.endpoint, 64, 64)
    assert 122 * 0.8 < c1 < 122 * 1.2, c1
    assert 1583 * 0.8 < c64 < 1583 * 1.2, c64
