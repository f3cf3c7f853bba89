"""Seed scenario output throughput at concurrency 1, 8, 64 and the simulated server's CPU use.

    python benchmarks/bench_sim.py [--scenario seed] [--time-scale 1.0] [--levels 1,8,64]
    python benchmarks/bench_sim.py --radix-effect [--scenario seed] [--levels 1,8,64]

`--radix-effect` prints instead, from the noise-free model (`sim.offline`), what
`--disable-radix-cache` costs on random prompts (1024 in) and on bench_serving's default
generated-shared-prefix shape (a 2048-token system prompt shared by groups of 16, 128-token
questions), 256 out.

Throughput is in simulated seconds (wall / time scale); CPU is the server process's user+system time
over the wall time of each level (1.0 = one core). Connections are opened before each level.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fixtures.sim import start_sim_server  # noqa: E402

BODY = {"prompt": list(range(1, 1025)), "max_tokens": 256, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}}  # fmt: skip


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _level(endpoint: str, concurrency: int, total: int) -> tuple[float, float, int]:
    """(wall seconds, mean TTFT wall seconds, output tokens) of a closed-loop run."""
    tokens, ttfts = 0, []
    sem = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal tokens
        async with sem:
            t0 = time.monotonic()
            async with client.stream("POST", endpoint + "/v1/completions", json=BODY) as resp:
                first = True
                async for line in resp.aiter_lines():
                    if first and line.startswith("data: "):
                        ttfts.append(time.monotonic() - t0)
                        first = False
                    if '"usage": {' in line:
                        tokens += int(line.split('"completion_tokens": ')[1].split(",")[0])

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=concurrency)) as client:
        warm = {"prompt": [1], "max_tokens": 1}
        await asyncio.gather(
            *(client.post(endpoint + "/v1/completions", json=warm) for _ in range(concurrency))
        )
        start = time.monotonic()
        await asyncio.gather(*(one(client) for _ in range(total)))
        return time.monotonic() - start, sum(ttfts) / len(ttfts), tokens


def radix_effect(scenario: str, levels: list[int]) -> None:
    from sim.offline import offline_throughput

    off = ["--disable-radix-cache"]
    shared = {"input_len": 128, "shared_prefix": 2048, "group_size": 16}
    print(f"scenario={scenario}: output tok/s (simulated), radix cache on -> off")
    print(f"{'conc':>5} {'random':>22} {'shared-prefix':>24}")
    for c in levels:
        n = max(64, 4 * c)
        rnd = [offline_throughput(scenario, f, concurrency=c, requests=n) for f in ([], off)]
        gsp = [offline_throughput(scenario, f, concurrency=c, requests=n, **shared) for f in ([], off)]
        cells = [f"{a:>7.1f} -> {b:>7.1f} {b / a - 1:>+6.1%}" for a, b in (rnd, gsp)]
        print(f"{c:>5} {cells[0]:>22} {cells[1]:>24}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="seed")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--levels", default="1,8,64")
    parser.add_argument("--seed", type=int, default=None, help="fix the run-to-run noise")
    parser.add_argument("--radix-effect", action="store_true")
    opts = parser.parse_args()
    if opts.radix_effect:
        radix_effect(opts.scenario, [int(x) for x in opts.levels.split(",")])
        return
    server = start_sim_server(
        opts.scenario, time_scale=opts.time_scale, seed=opts.seed, env={"OPTAGENT_SIM_STARTUP_S": "1"}
    )
    try:
        print(f"scenario={opts.scenario} time_scale={opts.time_scale} endpoint={server.endpoint}")
        print(f"{'conc':>5} {'requests':>8} {'out tok/s':>10} {'mean TTFT s':>12} {'server CPU':>11}")
        for level in (int(x) for x in opts.levels.split(",")):
            total = max(2, 2 * level) if level < 64 else level
            cpu0 = _cpu_seconds(server.proc.pid)
            wall, ttft, tokens = asyncio.run(_level(server.endpoint, level, total))
            cpu = (_cpu_seconds(server.proc.pid) - cpu0) / wall
            sim_s = wall / opts.time_scale
            print(
                f"{level:>5} {total:>8} {tokens / sim_s:>10.1f} {ttft / opts.time_scale:>12.3f} {cpu:>10.0%}"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
