"""A candidate's block that lasts longer than the host's dead-man switch is kept alive inside the
block (issue 52, item 1): without the push (`agent.trial.steps._kept_alive`) the host restores
known-good mid-measurement, behind the runner's back, and the block measures known-good as the
candidate.

A real simulated host (its own dead-man watchdog, started by the deploy), a real `Deployment`, and
`measure_block` running the real benchmark against it for well over the switch's delay."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from agent.trial.record import Baseline
from agent.trial.runner import TrialRunner
from agent.trial.steps import measure_block
from tools.bench.objective import objective_from_goal
from tools.config import BenchConfig
from tools.deploy.deployment import Deployment
from tools.deploy.units.file import UnitFile

pytestmark = pytest.mark.slow(seconds=40)

SMALL = BenchConfig(concurrency=[1], input_len=32, output_len=8, prompts_per_level=2, warmup=0, reps=1)


def test_a_candidate_block_longer_than_the_dead_man_switch_keeps_the_candidate(sim_host) -> None:  # type: ignore[no-untyped-def]
    from sim import host

    cfg = sim_host("seed", time_scale=0.004)
    sim_dir = Path(cfg.target.remote_unit).parent
    short = {"health_timeout_s": 4.0, "deadman_s": 1.0}  # the switch: 1.5 x the health wait, 6 s
    cfg = cfg.model_copy(update={"target": cfg.target.model_copy(update=short)})
    host.ensure_up(sim_dir)
    original = Path(cfg.target.remote_unit).read_text()
    candidate = UnitFile.parse(original).set_flag("--mem-fraction-static", "0.8").render()
    fired = sim_dir / "run" / "sglang.deadman-armed.fired"

    async def scenario() -> tuple[float, int, bool]:
        async with Deployment(cfg.target) as d:
            assert (await d.deploy(candidate)).ok
            switch = d.deadman_seconds
            runner = TrialRunner(
                deployment=d, endpoint=cfg.target.endpoint, bench=SMALL,
                objective=objective_from_goal(None), baseline=Baseline(reps=[], probe=None, text=original),
            )  # fmt: skip
            started = time.monotonic()
            until = started + 2.5 * switch  # long past the switch's delay, and its watchdog's next look
            reps = await measure_block(
                runner, None, "candidate", start=1, max_reps=10_000, more=lambda _: time.monotonic() < until
            )
            seconds = time.monotonic() - started
            kept = not fired.exists() and Path(cfg.target.remote_unit).read_text() == candidate
            assert (await d.rollback()).ok
            return seconds / switch, len(reps), kept

    switches, reps, kept = asyncio.run(scenario())
    assert kept, "the dead-man switch fired during the candidate's block: known-good came back under it"
    assert switches >= 2.5 and reps > 1  # the block outlasted the switch more than twice, rep by rep
    assert not fired.exists() and Path(cfg.target.remote_unit).read_text() == original
    assert httpx.get(cfg.target.endpoint + "/health", timeout=5).status_code == 200
