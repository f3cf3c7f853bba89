"""A restart storm stops at the daily budget (issue 27, item 8): `max_restarts_per_day` counts every
restart optagent causes on a target, in any 24 hours, across commands and runs; a deploy beyond it is
refused before any restart, a rollback never is. Over a real sshd, against the simulated server."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.test_deploy import cli, healthy, pid_of


def test_the_daily_restart_budget_refuses_the_next_deploy_but_not_a_rollback(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim(max_restarts_per_day=3)
    state = Path(sim.target.state_dir)
    for value in ("0.81", "0.82"):  # one restart each
        result = cli(
            "deploy", "--set", f"mem-fraction-static={value}", "--yes", config=sim.config_path, timeout=120
        )
        assert result.returncode == 0, result.stdout + result.stderr
    # yesterday's restarts do not count; a day of them is kept, not just the last minute
    counters = json.loads((state / "counters.json").read_text())
    counters["restarts"] = [time.time() - 90_000, *counters["restarts"]]
    (state / "counters.json").write_text(json.dumps(counters))
    result = cli("deploy", "--set", "mem-fraction-static=0.83", "--yes", config=sim.config_path, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr  # the third of today
    assert len(json.loads((state / "counters.json").read_text())["restarts"]) == 3

    before = pid_of(sim.sim_dir)
    result = cli("deploy", "--set", "mem-fraction-static=0.84", "--yes", config=sim.config_path)
    message = " ".join(result.stderr.split())
    assert result.returncode == 1 and "daily restart budget spent: 3 restarts" in message, message
    assert "max_restarts_per_day = 3" in message and pid_of(sim.sim_dir) == before
    status = cli("status", "--json", config=sim.config_path)
    assert json.loads(status.stdout)["restarts_last_day"] == "3 (max 3)"

    os.killpg(int(before), signal.SIGKILL)  # the server dies
    time.sleep(0.5)
    result = cli("rollback", config=sim.config_path, timeout=120)  # bringing it back is never refused
    assert result.returncode == 0 and healthy(sim.target.endpoint), result.stdout + result.stderr
