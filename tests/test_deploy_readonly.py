"""A read-only local unit directory: refused before the host is touched, or undone, never half-committed.

`chattr +i` makes the directory immutable even for root (the tests run as root, which `chmod` cannot stop).
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.test_deploy import cli, healthy, pid_of
from tools.deploy.deployment import DeployError, Deployment
from tools.deploy.units.file import UnitFile


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def settled(sim, original: str) -> None:  # type: ignore[no-untyped-def]
    assert Path(sim.target.remote_unit).read_text() == original
    assert Path(sim.target.local_unit).read_text() == original
    assert not (Path(sim.target.state_dir) / "journal.json").exists()
    assert not (sim.sim_dir / "run" / "sglang.deadman-armed").exists()
    assert healthy(sim.target.endpoint)


def test_a_read_only_local_unit_dir_is_refused_before_the_host_is_touched(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    original, before = Path(sim.target.remote_unit).read_text(), pid_of(sim.sim_dir)
    with immutable(Path(sim.target.local_unit).parent):
        result = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path)
    assert result.returncode == 1, result.stdout + result.stderr
    message = " ".join(result.stderr.split())
    assert (
        f"cannot write to {Path(sim.target.local_unit).parent}" in message
        and "nothing was changed" in message
    )
    assert pid_of(sim.sim_dir) == before
    assert not (sim.sim_dir / "run" / "backups").exists()
    settled(sim, original)


def test_a_commit_that_cannot_write_rolls_back_instead(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    original = Path(sim.target.remote_unit).read_text()
    candidate = UnitFile.parse(original).set_flag("--mem-fraction-static", "0.8").render()

    async def scenario() -> None:
        async with Deployment(sim.target) as d:
            assert (await d.deploy(candidate)).ok
            with (
                immutable(Path(sim.target.local_unit).parent),
                pytest.raises(DeployError, match="cannot commit"),
            ):
                await d.commit()

    asyncio.run(scenario())
    settled(sim, original)


def test_an_interrupted_commit_that_cannot_finish_is_undone_by_the_next_command(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    original = Path(sim.target.remote_unit).read_text()
    killed = cli(
        "deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path,
        env={"OPTAGENT_FAULT_KILL_AT": "commit"},
    )  # fmt: skip
    assert killed.returncode == -9
    with immutable(Path(sim.target.local_unit).parent):
        result = cli("status", config=sim.config_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    assert "could not finish the interrupted commit" in out and "restored the known-good configuration" in out
    settled(sim, original)
    assert cli("status", config=sim.config_path).returncode == 0
