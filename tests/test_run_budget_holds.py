"""A whole `optagent run` ends within its wall-time budget (+5%), with known-good serving."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

MINUTES = 2.0


def test_a_run_ends_within_its_budget_with_the_server_healthy(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from sim.host import ensure_up

    # a clock four times as fast as the seed's GPUs: a trial takes ~30 s here, so the playbook's
    # candidates need several times the 2 minutes given and the budget decides where the run stops
    cfg = sim_host(time_scale=0.25)
    ensure_up(tmp_path / "sim")
    t = cfg.target
    lines = ["[target]"]
    lines += [f"{k} = {json.dumps(str(getattr(t, k)))}" for k in ("local_unit", "remote_unit", "endpoint")]
    lines += [f"{k} = {json.dumps(str(getattr(t, k)))}" for k in ("run_dir", "state_dir", "nvidia_smi")]
    lines += ['transport = "local"', 'service_manager = "process"']
    lines += ["[agent]", f"transcripts_dir = {json.dumps(str(tmp_path / 'tx'))}"]
    lines += ["[bench]", "concurrency = [1, 8]", "input_len = 256", "output_len = 64", "warmup = 0",
              "reps = 2", "time_scale = 0.25"]  # fmt: skip
    config = tmp_path / "optagent.toml"
    config.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", "from agent.cli.main import app; app()", "run", "--config", str(config),
         "--yes", "--json", "--max-minutes", str(MINUTES)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert took <= MINUTES * 60 * 1.05, (took, summary["budget"])  # the whole process, start-up included
    assert "budget" in summary["budget"] and summary["restarts"] >= 2  # it ran trials, then stopped
    assert summary["status"].startswith("budget spent"), summary[
        "status"
    ]  # the budget, not the list, ended it
    assert httpx.get(t.endpoint + "/health", timeout=5).status_code == 200
    deployed = Path(t.remote_unit).read_text()
    assert deployed == Path(t.local_unit).read_text()  # the host runs what the local file says
    assert "optagent: a relaunch" not in deployed  # no spread relaunch or candidate left behind
