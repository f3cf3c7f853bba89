"""Clear errors: the server's own error line, an honest rollback, lock and config problems, status exit codes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.test_deploy import OPTAGENT, cli, healthy, pid_of
from tests.test_deploy_readonly import immutable
from tools.deploy.deployment import Deployment
from tools.deploy.lock import LockedError
from tools.deploy.units.file import UnitFile

pytestmark = pytest.mark.server


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        (
            "--tp-size",
            "abc",
            "serve: error: argument --tp-size/--tensor-parallel-size: invalid int value: 'abc'",
        ),
        ("--tp-size", "64", "invalid device ordinal"),
    ],
)
def test_a_failed_start_shows_the_servers_own_error_line(ssh_sim, flag: str, value: str, said: str) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim(health_timeout_s=4.0)
    candidate = UnitFile.parse(Path(sim.target.remote_unit).read_text()).set_flag(flag, value).render()

    async def scenario():  # type: ignore[no-untyped-def]
        async with Deployment(sim.target) as d:
            return await d.deploy(candidate)

    outcome = asyncio.run(scenario())
    assert not outcome.ok and "; the server said: " in outcome.error
    assert said in outcome.error.split("; the server said: ", 1)[1]
    assert "server_args=" not in outcome.error and len(outcome.error) < 600
    assert all(len(line) < 400 for line in outcome.log_tail.splitlines())
    assert healthy(sim.target.endpoint)


def _kill_server(sim) -> None:  # type: ignore[no-untyped-def]
    pid = int(pid_of(sim.sim_dir))
    os.killpg(pid, signal.SIGKILL)
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            break
        asyncio.run(asyncio.sleep(0.05))


def test_rollback_brings_a_dead_server_back_and_status_says_unhealthy(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    healthy_status = cli("status", "--json", config=sim.config_path)
    assert healthy_status.returncode == 0 and json.loads(healthy_status.stdout)["lock"] is None

    _kill_server(sim)
    status = cli("status", "--json", config=sim.config_path)
    assert status.returncode == 1 and json.loads(status.stdout)["health"]["ok"] is False
    result = cli("rollback", config=sim.config_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "already runs" not in result.stdout and "rolled back" in result.stdout
    assert healthy(sim.target.endpoint)
    again = cli("rollback", config=sim.config_path)
    assert (
        "nothing in flight: the host already runs the known-good configuration, and it is healthy"
        in " ".join(again.stdout.split())
    )


def test_a_lock_that_cannot_be_created_says_why(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    with (
        immutable(sim.sim_dir / "run"),
        pytest.raises(LockedError, match="cannot create the lock .*not permitted"),
    ):
        asyncio.run(Deployment(sim.target).__aenter__())


def test_a_config_that_is_not_utf8_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "optagent.toml"
    bad.write_bytes(b'[target]\nhost = "caf\xe9"\n')
    result = subprocess.run(
        [OPTAGENT, "status", "--config", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "not UTF-8 text" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr


def test_flags_with_the_server_down_says_how_to_go_on(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    from sim import host

    sim = ssh_sim()
    host.down(sim.sim_dir)
    result = cli("flags", "--grep", "mem-fraction", config=sim.config_path)
    assert result.returncode == 1
    message = " ".join(result.stderr.split())
    assert "cannot detect the SGLang version" in message and "--version 0.5.23" in message
    ok = subprocess.run([OPTAGENT, "flags", "--version", "0.5.23", "--grep", "mem-fraction-static", "--json"],
                        capture_output=True, text=True, timeout=120)  # fmt: skip
    assert ok.returncode == 0 and "--mem-fraction-static" in ok.stdout


def test_bench_levels_separated_by_spaces_are_two_levels(ssh_sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    out = tmp_path / "b.json"
    result = cli("bench", "--concurrency", "1 8", "--input-len", "16", "--output-len", "4", "--reps", "1",
                 "--prompts-per-level", "2", "--warmup", "0", "--json", str(out), config=sim.config_path)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert [lv["max_concurrency"] for lv in json.loads(out.read_text())["levels"]] == [1, 8]


def test_run_says_why_the_simulator_cannot_start_without_a_traceback(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tools.config import DEFAULT_SIM_DIR

    work = tmp_path / "work"
    cfg = sim_host(name=f"work/{DEFAULT_SIM_DIR}")
    unit = Path(cfg.target.remote_unit)
    unit.write_text(unit.read_text().replace("--tp-size 4", "--tp-size 64"))
    result = subprocess.run([OPTAGENT, "run", "--goal", "x", "--yes"], cwd=work, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert result.returncode == 1
    message = " ".join(result.stderr.split())
    assert "cannot start the simulated deployment" in message and "invalid device ordinal" in message
    assert "Traceback" not in result.stdout + result.stderr and "server_args" not in message
