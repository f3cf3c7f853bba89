"""A short live run of the seed scenario (time-scaled) lands on the session's numbers.

The exact 10% check is on the model in virtual time (test_sim_model.py); this one checks that the
live server, HTTP streaming included, delivers what the model says, with room for a busy machine.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.fixtures.sim import SimServer

SCALE = 0.3


async def _closed_loop(endpoint: str, concurrency: int, total: int) -> float:
    """Output tokens per simulated second for `total` 1024-in/256-out requests, `concurrency` at a time."""
    body = {"prompt": list(range(1, 1025)), "max_tokens": 256, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    tokens = 0
    sem = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal tokens
        async with sem, client.stream("POST", endpoint + "/v1/completions", json=body) as resp:
            async for line in resp.aiter_lines():
                if '"usage": {' in line:
                    tokens += int(line.split('"completion_tokens": ')[1].split(",")[0])

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        # Open the connections first, as a benchmark's warmup does: otherwise the requests trickle in
        # while connections are set up and get prefilled in many small batches.
        warm = {"prompt": [1], "max_tokens": 1}
        await asyncio.gather(
            *(client.post(endpoint + "/v1/completions", json=warm) for _ in range(concurrency))
        )
        start = time.monotonic()
        await asyncio.gather(*(one(client) for _ in range(total)))
        wall = time.monotonic() - start
    return tokens / (wall / SCALE)


def test_seed_live_throughput_near_the_session(sim_server) -> None:  # type: ignore[no-untyped-def]
    srv: SimServer = sim_server("seed", time_scale=SCALE, seed=3, env={"OPTAGENT_SIM_STARTUP_S": "2"})
    c1 = asyncio.run(_closed_loop(srv.endpoint, 1, 2))
    c64 = asyncio.run(_closed_loop(srv.endpoint, 64, 64))
    assert 122 * 0.8 < c1 < 122 * 1.2, c1
    assert 1583 * 0.8 < c64 < 1583 * 1.2, c64
