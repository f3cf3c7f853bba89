"""A running configuration that the baseline's own load takes down: the run stops with what the
server said, and the server is serving known-good again (real simulated server, real unit files)."""

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
    transcript = Transcript.create(tmp_path / "transcripts", kind="run", goal="g", model="builtin", target="sim")
    console = Console(width=200, record=True)
    try:
        with pytest.raises(SessionError) as e:
            asyncio.run(run_session(config, RunOptions(goal="improve throughput"), RunUI(console, transcript)))
    finally:
        transcript.close({"status": "test"})
        served = httpx.get(config.target.endpoint + "/health", timeout=10).status_code
        host.down(tmp_path / "sim")
    message = str(e.value)
    assert message.startswith("the baseline benchmark failed:")
    assert "went down under the benchmark's load (its log: torch.OutOfMemoryError" in message
    assert "restarted and serves again" in message
    assert "a lower --mem-fraction-static" in message  # what to change, from what the log said
    assert served == 200
    assert Path(config.target.remote_unit).read_text() == unit  # known-good, unchanged
    assert "restarting the known-good configuration" in console.export_text()
