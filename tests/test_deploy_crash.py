"""optagent killed with SIGKILL during a deploy, then `optagent recover`; and the dead-man's switch."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.test_deploy import OPTAGENT, cli, healthy, leftovers, pid_of
from tools.deploy.deployment import Deployment
from tools.deploy.journal import STEPS
from tools.deploy.remote import LocalTransport
from tools.deploy.service import ProcessManager
from tools.deploy.units.file import UnitFile


def served_config_matches(sim_dir: Path) -> bool | None:
    pm = ProcessManager(
        LocalTransport(), unit_path=str(sim_dir / "sglang.service"), run_dir=str(sim_dir / "run")
    )
    return asyncio.run(pm.config_matches())


def assert_settled(sim, expected: str | None = None) -> str:  # type: ignore[no-untyped-def]
    """The host runs its known-good file, healthy, and optagent's state agrees; returns that text."""
    remote = Path(sim.target.remote_unit).read_text()
    assert remote == Path(sim.target.local_unit).read_text()
    known_good = Path(sim.target.state_dir) / "known-good.service"
    assert remote == known_good.read_text() if known_good.exists() else True  # recorded at the first deploy
    if expected is not None:
        assert remote == expected
    assert httpx.get(sim.target.endpoint + "/health", timeout=5).status_code == 200
    assert served_config_matches(sim.sim_dir) is True
    assert not (Path(sim.target.state_dir) / "journal.json").exists()
    assert not leftovers(sim.sim_dir, Path(sim.target.state_dir))
    assert not (sim.sim_dir / "run" / "sglang.deadman-armed").exists()
    return remote


def assert_candidate_guarded(sim) -> None:  # type: ignore[no-untyped-def]
    """Whenever the host's unit file is not known-good (and no commit is under way), the switch is armed."""
    state = Path(sim.target.state_dir)
    journal = state / "journal.json"
    if not journal.exists() or json.loads(journal.read_text())["step"] == "commit":
        return
    if Path(sim.target.remote_unit).read_text() != (state / "known-good.service").read_text():
        assert (sim.sim_dir / "run" / "sglang.deadman-armed").exists(), journal.read_text()


def recover_twice(sim) -> str:  # type: ignore[no-untyped-def]
    result = cli("recover", config=sim.config_path)
    assert result.returncode == 0, result.stdout + result.stderr

    async def again() -> str | None:
        async with Deployment(sim.target) as d:
            return d.recovered

    assert asyncio.run(again()) is None  # a second recovery is a no-op
    return result.stdout


@pytest.mark.slow(seconds=120)
def test_killed_at_every_journal_step_and_at_random_moments(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim(time_scale=0.004, health_timeout_s=4.0)
    current = assert_settled(sim)
    points = [(step, None) for step in STEPS] + [
        (None, d) for d in random.Random(4).sample(range(300, 3000), 11)
    ]
    for i, (step, delay_ms) in enumerate(points):
        value = "--tp-size=64" if step == "rollback" else f"--mem-fraction-static=0.{70 + i}"
        candidate = UnitFile.parse(current).set_flag(*value.split("=")).render()
        env = {**os.environ, "COLUMNS": "200"}
        if step:
            env["OPTAGENT_FAULT_KILL_AT"] = step
        proc = subprocess.Popen(
            [OPTAGENT, "deploy", "--set", value, "--yes", "--config", str(sim.config_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        if delay_ms is not None:
            time.sleep(delay_ms / 1000)
            proc.send_signal(signal.SIGKILL)
        code = proc.wait(60)
        if step:
            assert code == -signal.SIGKILL, (step, proc.stderr.read() if proc.stderr else "")
        assert_candidate_guarded(sim)
        out = recover_twice(sim)
        if step == "commit":
            current = assert_settled(sim, candidate)
        elif step is not None:
            current = assert_settled(sim, current)
            assert "restored the known-good configuration" in out, (step, out)
        else:  # a random moment: either the old or the fully committed configuration
            settled = assert_settled(sim)
            assert settled in (current, candidate), (delay_ms, settled)
            current = settled


def test_deadman_switch_restores_known_good_without_optagent(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim(time_scale=0.004, deadman_s=6.0, health_timeout_s=4.0)
    original = assert_settled(sim)
    env = {**os.environ, "OPTAGENT_FAULT_KILL_AT": "healthy"}
    result = subprocess.run(
        [OPTAGENT, "deploy", "--set", "mem-fraction-static=0.8", "--yes", "--config", str(sim.config_path)],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == -signal.SIGKILL
    assert "--mem-fraction-static 0.8" in Path(sim.target.remote_unit).read_text()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        restored = Path(sim.target.remote_unit).read_text() == original
        fired = (sim.sim_dir / "run" / "sglang.deadman-armed.fired").exists()
        if restored and fired and served_config_matches(sim.sim_dir) and healthy(sim.target.endpoint):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the dead-man's switch did not restore the known-good configuration")
    assert httpx.get(sim.target.endpoint + "/health", timeout=5).status_code == 200
    pid = pid_of(sim.sim_dir)
    out = recover_twice(sim)  # closes the journal; the watchdog already restarted known-good
    assert "restored the known-good configuration" in out
    assert pid_of(sim.sim_dir) == pid
    assert_settled(sim, original)


def test_switch_waits_out_the_health_timeout_and_keepalive_extends_it(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim(time_scale=0.004, deadman_s=1.0, health_timeout_s=4.0)
    original = assert_settled(sim)
    candidate = UnitFile.parse(original).set_flag("--mem-fraction-static", "0.8").render()
    fired = sim.sim_dir / "run" / "sglang.deadman-armed.fired"

    async def scenario() -> None:
        async with Deployment(sim.target) as d:
            assert d.deadman_seconds == 6.0  # never shorter than 1.5 x the health timeout
            assert await d.keepalive() is False  # nothing in flight
            assert (await d.deploy(candidate)).ok
            for _ in range(10):  # 10 s, well past the 6 s the switch was armed for
                assert await d.keepalive() is True
                await asyncio.sleep(1.0)
            assert not fired.exists()
            assert Path(sim.target.remote_unit).read_text() == candidate
            deadline = time.monotonic() + 30
            while not fired.exists() and time.monotonic() < deadline:  # no keepalive: it fires
                await asyncio.sleep(0.2)
            assert fired.exists()
            assert await d.keepalive() is False

    asyncio.run(scenario())
    assert_settled(sim, original)


def test_a_slow_starting_server_sets_the_health_wait_and_the_switch(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    """A server seen to start in ~4 s gets twice its slowest start before a start counts as failed,
    over a configured 7 s that a slightly slower candidate would overrun; the switch waits longer too."""
    sim = ssh_sim(time_scale=0.2, deadman_s=1.0, health_timeout_s=7.0)
    original = assert_settled(sim)
    candidate = UnitFile.parse(original).set_flag("--mem-fraction-static", "0.8").render()

    async def scenario() -> tuple[list[float], float, float]:
        async with Deployment(sim.target) as d:
            assert (d.health_wait, d.deadman_seconds) == (7.0, 10.5)  # nothing seen yet: the config's
            assert (await d.deploy(candidate)).ok
            assert (await d.rollback()).ok
            return list(d.starts), d.health_wait, d.deadman_seconds

    starts, wait, switch = asyncio.run(scenario())
    assert len(starts) == 2 and all(s > 2.5 for s in starts)  # 20 simulated seconds at 0.2
    assert wait == pytest.approx(2 * max(starts)) and wait > 7.0
    assert switch == pytest.approx(1.5 * wait)
    assert_settled(sim, original)
