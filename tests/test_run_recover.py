"""`optagent run` killed with SIGKILL in the middle of a trial, then run again: it recovers first."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim import host
from sim.scenario import SCENARIO_DIR
from tests.fixtures.sim import free_port
from tools.deploy.units.file import UnitFile


def _toml(config, source_dir: Path, transcripts: Path) -> str:
    t = config.target
    lines = ["[target]"]
    for key in ("local_unit", "remote_unit", "run_dir", "nvidia_smi", "endpoint", "state_dir"):
        lines.append(f"{key} = {json.dumps(str(getattr(t, key)))}")
    lines += [
        'service_manager = "process"',
        "health_timeout_s = 60.0",
        "max_restarts_per_minute = 100",
        "[bench]",
        "concurrency = [1, 64]",
        "input_len = 1024",
        "output_len = 64",
        "warmup = 0",
        "reps = 3",
        "spread_launches = 0",  # the first trial's deploy is what the kill must land in
        "[agent]",
        f"transcripts_dir = {json.dumps(str(transcripts))}",
        "[research]",
        f"source_dir = {json.dumps(str(source_dir))}",
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.slow(seconds=60)
def test_killed_mid_trial_then_rerun_recovers_the_target(tmp_path: Path, sglang_0523):
    scenario = tmp_path / "fast.toml"
    scenario.write_text(
        re.sub(r"startup_s = [\d.]+", "startup_s = 4", (SCENARIO_DIR / "seed.toml").read_text())
    )
    config = host.ensure_up(tmp_path / "sim", scenario=scenario, port=free_port(), time_scale=0.25)
    baseline_text = Path(config.target.remote_unit).read_text()
    cfg_file = tmp_path / "optagent.toml"
    cfg_file.write_text(_toml(config, sglang_0523.root, tmp_path / "transcripts"))
    journal = Path(config.target.state_dir) / "journal.json"
    argv = [
        sys.executable,
        "-c",
        "from agent.cli.main import app; app()",
        "run",
        "--config",
        str(cfg_file),
        "--yes",
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    try:
        first = subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 120
        while not journal.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert journal.exists(), "no trial started"
        time.sleep(1.0)  # inside the trial: uploading, restarting or waiting for health
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert journal.exists()  # the trial was in flight when optagent died

        second = subprocess.run(
            [*argv, "--dry-run"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
        )
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        assert "recovered an unfinished change first" in second.stdout
        assert not journal.exists()
        remote = Path(config.target.remote_unit).read_text()
        assert remote == baseline_text
        assert UnitFile.load(config.target.local_unit).render() == baseline_text
    finally:
        host.down(tmp_path / "sim")


def test_a_local_unit_file_edited_since_the_last_deploy_stops_the_run_before_its_baseline(
    tmp_path: Path, sglang_0523
) -> None:
    import asyncio

    from tools.deploy.deployment import Deployment

    config = host.ensure_up(tmp_path / "sim", scenario="seed", port=free_port(), time_scale=0.25)
    cfg_file = tmp_path / "optagent.toml"
    cfg_file.write_text(_toml(config, sglang_0523.root, tmp_path / "transcripts"))

    async def record_known_good() -> None:
        async with Deployment(config.target) as d:
            await d.known_good()  # seen running and healthy: recorded

    try:
        asyncio.run(record_known_good())
        local = Path(config.target.local_unit)
        local.write_text(local.read_text().replace("--tp-size 4", "--tp-size 2"))  # edited by hand
        done = subprocess.run(
            [sys.executable, "-c", "from agent.cli.main import app; app()", "run", "--config", str(cfg_file), "--yes"],
            cwd=tmp_path, capture_output=True, text=True, timeout=240,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "COLUMNS": "200"},
        )  # fmt: skip
    finally:
        host.down(tmp_path / "sim")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    said = " ".join((done.stdout + done.stderr).split())
    assert "error: the local unit file" in said and "was edited since the last deploy" in said
    assert "DriftError" not in said and "--tp-size 2" in said  # the diff, without a type name
    assert "baseline" not in said.split("error:")[0]  # refused at preflight: nothing measured
