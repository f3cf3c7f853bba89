"""A configuration that the benchmark's own load takes down: the baseline's ends the run, a
candidate's is rolled back, each with what the server's log said, and the server serves known-good
again (real simulated server, real unit files, real deploys)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from agent.prepare import SessionError
from agent.session import RunOptions, run_session
from agent.transcripts.transcript import Transcript
from agent.ui import RunUI
from sim import host
from sim.scenario import SCENARIO_DIR
from tests.fixtures.sim import free_port
from tools.bench.objective import read_goal

pytestmark = pytest.mark.server


@pytest.mark.timeout(300)
def test_a_baseline_that_crashes_the_server_ends_the_run_with_the_server_serving_again(tmp_path, sglang_0523):
    # the seed with 95% of memory to the static pool: it starts and serves c=1, and a c=64 prefill
    # chunk needs more activation memory than is left (`torch.OutOfMemoryError`, the server exits)
    text = (SCENARIO_DIR / "seed.toml").read_text()
    text = text.replace('"--mem-fraction-static", "0.85"', '"--mem-fraction-static", "0.95"')
    scenario = tmp_path / "crashes.toml"
    scenario.write_text(re.sub(r"startup_s = [\d.]+", "startup_s = 2", text))
    config = host.ensure_up(tmp_path / "sim", scenario=scenario, port=free_port(), time_scale=0.5)
    unit = Path(config.target.remote_unit).read_text()
    assert "--mem-fraction-static 0.95" in unit
    config = config.model_copy(
        update={
            "research": config.research.model_copy(update={"source_dir": sglang_0523.root}),
            "bench": config.bench.model_copy(
                update={"concurrency": [1, 64], "input_len": 1024, "output_len": 64, "reps": 2, "warmup": 0}
            ),
            "agent": config.agent.model_copy(update={"transcripts_dir": tmp_path / "transcripts"}),
        }
    )
    transcript = Transcript.create(
        tmp_path / "transcripts", kind="run", goal="g", model="builtin", target="sim"
    )
    console = Console(width=200, record=True)
    try:
        with pytest.raises(SessionError) as e:
            asyncio.run(
                run_session(
                    config, RunOptions(goal=read_goal("improve throughput")), RunUI(console, transcript)
                )
            )
    finally:
        transcript.close({"status": "test"})
        served = httpx.get(config.target.endpoint + "/health", timeout=10).status_code
        host.down(tmp_path / "sim")
    message = str(e.value)
    assert message.startswith("the baseline benchmark failed:")
    assert "the server went down under the load (its log: torch.OutOfMemoryError" in message
    assert "restarted and serves again" in message
    assert "a lower --mem-fraction-static" in message  # what to change, from what the log said
    assert served == 200
    assert Path(config.target.remote_unit).read_text() == unit  # known-good, unchanged
    assert "restarting the known-good configuration" in console.export_text()


@pytest.mark.timeout(300)
def test_a_candidate_that_goes_down_under_load_is_rolled_back_with_what_its_log_said(tmp_path):
    from agent.trial.record import Baseline, TrialChange
    from agent.trial.runner import TrialRunner
    from tools.bench.objective import Objective
    from tools.bench.probe import run_probe
    from tools.deploy.deployment import Deployment

    text = (SCENARIO_DIR / "seed.toml").read_text()
    scenario = tmp_path / "fast.toml"
    scenario.write_text(re.sub(r"startup_s = [\d.]+", "startup_s = 2", text))
    config = host.ensure_up(tmp_path / "sim", scenario=scenario, port=free_port(), time_scale=0.5)
    bench = config.bench.model_copy(
        update={"concurrency": [1, 64], "input_len": 1024, "output_len": 32, "reps": 2, "warmup": 0}
    )
    unit = Path(config.target.local_unit).read_text()
    target = config.target.model_copy(update={"max_restarts_per_minute": 100})

    async def trial():  # type: ignore[no-untyped-def]
        probe = await run_probe(target.endpoint)
        async with Deployment(target) as deployment:
            runner = TrialRunner(
                deployment=deployment, endpoint=target.endpoint, bench=bench, objective=Objective(),
                baseline=Baseline(reps=[], probe=probe, text=unit),
            )  # fmt: skip
            # 95% of memory to the static pool: it starts, and the c=64 prefill runs out of memory
            return await runner.run([TrialChange(flag="--mem-fraction-static", value="0.95")], reason="t")

    try:
        record = asyncio.run(trial())
        served = httpx.get(target.endpoint + "/health", timeout=10).status_code
    finally:
        host.down(tmp_path / "sim")
    assert record.decision == "rolled_back"
    assert record.why.startswith("errors under load: ")
    assert "the server went down under the load (its log: torch.OutOfMemoryError" in record.why
    assert served == 200 and Path(target.remote_unit).read_text() == unit
