"""Deploy over a real sshd to the simulated server: commit, roll back, drift, dry run, hostile input, locks."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from tools.deploy.deployment import DeployError, Deployment, DriftError
from tools.deploy.lock import LockedError
from tools.deploy.units.file import UnitFile

pytestmark = pytest.mark.server

OPTAGENT = shutil.which("optagent") or str(Path(sys.executable).with_name("optagent"))


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def cli(*args: str, config: Path, env: dict[str, str] | None = None, timeout: float = 60):  # type: ignore[no-untyped-def]
    return subprocess.run(
        [OPTAGENT, *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def pid_of(sim_dir: Path) -> str:
    return (sim_dir / "run" / "sglang.pid").read_text().split()[0]


def healthy(endpoint: str) -> bool:
    try:
        return httpx.get(endpoint + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def leftovers(*dirs: Path) -> list[Path]:
    return [p for d in dirs for p in d.rglob("*") if "tmp" in p.name or p.name.endswith(".lock")]


def test_deploy_and_commit_over_ssh(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    original = Path(sim.target.remote_unit).read_text()
    candidate = UnitFile.parse(original).set_flag("--mem-fraction-static", "0.8").render()

    async def scenario() -> None:
        async with Deployment(sim.target) as d:
            assert d.transport.description.startswith("ssh://")
            outcome = await d.deploy(candidate, reason="test")
            assert outcome.ok, outcome.error
            assert "+    --mem-fraction-static 0.8 \\" in outcome.diff
            assert Path(sim.target.local_unit).read_text() == original  # not yet: only on commit
            await d.commit()

    run(scenario())
    assert Path(sim.target.remote_unit).read_text() == candidate
    assert Path(sim.target.local_unit).read_text() == candidate
    assert (Path(sim.target.state_dir) / "known-good.service").read_text() == candidate
    backups = list((sim.sim_dir / "run" / "backups").iterdir())
    assert len(backups) == 1 and backups[0].read_text() == original
    assert healthy(sim.target.endpoint)
    assert not leftovers(sim.sim_dir, Path(sim.target.state_dir))


@pytest.mark.parametrize(
    ("flag", "value", "log_line"),
    [
        ("--tp-size", "64", "invalid device ordinal"),  # refuses to start
        ("--attention-backend", "fa4", "requires an SM100-family GPU"),  # exits seconds later
        ("--enable-torch-compile", None, "has not finished (stuck)"),  # never gets healthy
    ],
)
def test_a_failing_candidate_is_rolled_back(ssh_sim, flag: str, value: str | None, log_line: str) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim(health_timeout_s=4.0)
    original = Path(sim.target.remote_unit).read_text()
    candidate = UnitFile.parse(original).set_flag(flag, value).render()

    async def scenario():  # type: ignore[no-untyped-def]
        async with Deployment(sim.target) as d:
            return await d.deploy(candidate)

    outcome = run(scenario())
    assert not outcome.ok and outcome.rolled_back
    assert log_line in outcome.log_tail
    assert Path(sim.target.remote_unit).read_text() == original
    assert Path(sim.target.local_unit).read_text() == original
    assert healthy(sim.target.endpoint)
    assert not (Path(sim.target.state_dir) / "journal.json").exists()


def test_drift_stops_and_overwrites_nothing(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    remote = Path(sim.target.remote_unit)
    drifted = remote.read_text() + "# edited by hand on the host\n"
    remote.write_text(drifted)
    candidate = UnitFile.parse(drifted).set_flag("--mem-fraction-static", "0.8").render()

    async def scenario() -> None:
        async with Deployment(sim.target) as d:
            with pytest.raises(DriftError, match="edited by hand"):
                await d.deploy(candidate)

    run(scenario())
    assert remote.read_text() == drifted
    assert not (sim.sim_dir / "run" / "backups").exists()


def test_rollback_with_nothing_in_flight_restarts_nothing(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    before = pid_of(sim.sim_dir)
    result = cli("rollback", config=sim.config_path)
    assert result.returncode == 0, result.stderr
    assert "nothing in flight" in result.stdout
    assert pid_of(sim.sim_dir) == before


def snapshot(*dirs: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for d in dirs for p in d.rglob("*") if p.is_file()}


def test_dry_run_writes_nothing_and_restarts_nothing(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    state = Path(sim.target.state_dir)
    before, pid = snapshot(sim.sim_dir, state.parent), pid_of(sim.sim_dir)
    result = cli("deploy", "--set", "mem-fraction-static=0.8", "--unset", "--trust-remote-code", "--dry-run",
                 config=sim.config_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "+    --mem-fraction-static 0.8 \\" in result.stdout
    assert "-    --trust-remote-code \\" in result.stdout
    log = sim.sim_dir / "run" / "sglang.log"
    after = snapshot(sim.sim_dir, state.parent)
    after[str(log)] = before[str(log)]  # the server's own log may grow; optagent does not write it
    assert after == before
    assert pid_of(sim.sim_dir) == pid


def test_hostile_values_are_rejected_or_stay_one_argument(ssh_sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    before = snapshot(sim.sim_dir / "local")
    remote_before = Path(sim.target.remote_unit).read_text()
    for bad in [
        "mem-fraction-static=0.8\n[Service]\nExecStartPre=/bin/sh -c id",
        "tp-size=4\x1b[2J",
        "--=1",
        "a b=1",
    ]:
        result = cli("deploy", "--set", bad, "--yes", config=sim.config_path)
        assert result.returncode == 2, (bad, result.stdout, result.stderr)
    assert Path(sim.target.remote_unit).read_text() == remote_before
    assert snapshot(sim.sim_dir / "local") == before
    assert not (sim.sim_dir / "run" / "backups").exists()

    pwned = tmp_path / "pwned"
    value = f'x"; touch {pwned}; echo "$(touch {pwned})`touch {pwned}`%n'
    result = cli("deploy", "--set", f"served-model-name={value}", "--yes", config=sim.config_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not pwned.exists()
    cmdline = Path(f"/proc/{pid_of(sim.sim_dir)}/cmdline").read_bytes().split(b"\0")
    assert value.encode() in cmdline
    assert UnitFile.load(sim.target.local_unit).command.flags["--served-model-name"] == value


HOLD_LOCK = textwrap.dedent(
    """\
    import asyncio, sys
    from tools.config import TargetConfig
    from tools.deploy.deployment import Deployment
    target = TargetConfig.model_validate_json(sys.argv[1])
    async def main():
        async with Deployment(target):
            print("holding", flush=True)
            await asyncio.sleep(60)
    asyncio.run(main())
    """
)


def test_one_optagent_per_target_and_stale_locks_are_cleared(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, sim.target.model_dump_json()], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        refused = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path)
        assert refused.returncode == 1 and "locked by another optagent" in refused.stderr
        with pytest.raises(LockedError):
            run(Deployment(sim.target).__aenter__())
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (sim.sim_dir / "run" / "sglang.lock").exists()  # left behind by the killed holder
    result = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path)
    assert result.returncode == 0, result.stderr
    assert not (sim.sim_dir / "run" / "sglang.lock").exists()


def test_two_concurrent_deploys_exactly_one_proceeds(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    # A start of ~9 s keeps the two deploys overlapping even when one CLI starts seconds later
    # (a loaded machine); a quicker one lets them run one after the other, both rightly.
    sim = ssh_sim(time_scale=0.3, health_timeout_s=60.0)
    procs = [
        subprocess.Popen(
            [
                OPTAGENT,
                "deploy",
                "--set",
                f"mem-fraction-static={v}",
                "--yes",
                "--config",
                str(sim.config_path),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for v in ("0.81", "0.82")
    ]
    results = [(p.wait(180), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 1], results
    assert any("locked" in err for code, err in results if code == 1)
    flags = UnitFile.load(sim.target.local_unit).command.flags
    assert flags["--mem-fraction-static"] in ("0.81", "0.82")
    assert Path(sim.target.remote_unit).read_text() == Path(sim.target.local_unit).read_text()


def test_restart_rate_limit_and_failure_stop(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim(max_consecutive_failures=1, health_timeout_s=3.0)
    original = Path(sim.target.remote_unit).read_text()
    bad = UnitFile.parse(original).set_flag("--tp-size", "64").render()
    good = UnitFile.parse(original).set_flag("--mem-fraction-static", "0.8").render()

    async def scenario() -> None:
        async with Deployment(sim.target) as d:
            assert not (await d.deploy(bad)).ok
            with pytest.raises(DeployError, match="consecutive failed candidates"):
                await d.deploy(good)

    run(scenario())
    limited = sim.target.model_copy(update={"max_restarts_per_minute": 1, "max_consecutive_failures": 5})

    async def limited_scenario() -> None:
        async with Deployment(limited) as d:
            with pytest.raises(DeployError, match="restart rate limit"):
                await d.deploy(good)

    run(limited_scenario())
    assert Path(sim.target.remote_unit).read_text() == original

    async def paced_scenario() -> float:
        """A run's deployment (`pace=True`) waits until the limit allows the restart instead."""
        async with Deployment(limited, pace=True) as d:
            d.journal.record(restart=True, failure=False)  # one restart "just now": the limit is spent
            waited = d.restart_wait()
            assert 55 < waited <= 60
            counters = d.journal.counters()  # ... as if it had happened 57 s ago
            d.journal.counters_path.write_text(json.dumps({**counters, "restarts": [time.time() - 57]}))
            started = time.monotonic()
            assert (await d.deploy(good)).ok
            await d.rollback()
            return time.monotonic() - started

    assert run(paced_scenario()) >= 2.5  # it waited out the remaining ~3 s
    assert Path(sim.target.remote_unit).read_text() == original


def test_deploy_without_a_terminal_or_yes_is_bad_usage_and_touches_nothing(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    state = Path(sim.target.state_dir)
    before, pid = snapshot(sim.sim_dir, state.parent), pid_of(sim.sim_dir)
    result = subprocess.run(
        [OPTAGENT, "deploy", "--set", "mem-fraction-static=0.8", "--config", str(sim.config_path)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--yes" in result.stdout + result.stderr
    log = sim.sim_dir / "run" / "sglang.log"
    after = snapshot(sim.sim_dir, state.parent)
    after[str(log)] = before[str(log)]
    assert after == before  # no lock file, no journal, no backup, no upload
    assert pid_of(sim.sim_dir) == pid
