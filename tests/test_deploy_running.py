"""Known-good only for exactly what runs (issue 52, item 2), and no restart of a server already
running known-good (issue 52, a smaller item). Over a real sshd, against the simulated server.

What a user expects: a unit file whose program path was edited on the host (and locally) without a
restart is not what runs, whatever its arguments; a launch script edited without a restart cannot be
told from the running process at all, so it is never recorded as known-good until a restart after
the edit has proven it. Either way the deploy is refused before anything changes and the server
keeps serving. A deploy interrupted before its restart (optagent killed, the local disk full) leaves
the server running known-good: recovering puts the file back and does not restart it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_deploy import OPTAGENT, cli, healthy, pid_of
from tools.deploy.deployment import Deployment
from tools.deploy.remote import LocalTransport
from tools.deploy.service import ProcessManager
from tools.deploy.units.file import UnitFile


def _status(config: Path) -> dict:  # type: ignore[type-arg]
    result = cli("status", "--json", config=config)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def test_a_program_path_edited_without_a_restart_is_not_what_runs(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    remote, local, state = (
        Path(sim.target.remote_unit),
        Path(sim.target.local_unit),
        Path(sim.target.state_dir),
    )
    text = remote.read_text()
    program = UnitFile.parse(text).command.executable
    edited = text.replace(f"ExecStart={program} ", "ExecStart=/opt/moved/bin/optagent-sim ", 1)
    assert edited != text
    remote.write_text(edited)
    local.write_text(edited)
    before = pid_of(sim.sim_dir)

    matches = _status(sim.config_path)["config_matches_file"]
    assert str(matches).startswith("no:") and "/opt/moved/bin/optagent-sim" in matches, matches
    result = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path, timeout=120)
    message = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 1 and "is not what the service runs" in message, message
    assert "Nothing was changed" in message and "ROLLBACK FAILED" not in message, message
    assert pid_of(sim.sim_dir) == before and healthy(sim.target.endpoint)
    assert remote.read_text() == edited and not (state / "known-good.service").exists()


def _script(unit_text: str, *, program: str | None = None) -> str:
    unit = UnitFile.parse(unit_text)
    argv = unit.exec_argv()
    if program is not None:
        argv[0] = program
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in unit.environment.items())
    return (
        f"#!/bin/sh\n# the simulated server, started by a launch script\n{exports}exec {shlex.join(argv)}\n"
    )


def _restart_after_the_edit(manager: ProcessManager) -> None:
    """What an operator does: restart the service on the file as it is (a moment after editing it)."""
    time.sleep(0.6)
    asyncio.run(manager.restart())


def test_a_launch_script_becomes_known_good_only_once_a_restart_proved_it(ssh_sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    unit_path, run_dir = Path(sim.target.remote_unit), sim.sim_dir / "run"
    asyncio.run(ProcessManager(LocalTransport(), unit_path=str(unit_path), run_dir=str(run_dir)).stop())
    script, local = sim.sim_dir / "launch.sh", sim.sim_dir / "local" / "launch.sh"
    good = _script(unit_path.read_text())
    script.write_text(good)
    local.write_text(good)
    config = tmp_path / "script.toml"
    config.write_text(
        sim.config_path.read_text()
        .replace(json.dumps(str(unit_path)), json.dumps(str(script)))
        .replace(json.dumps(str(sim.target.local_unit)), json.dumps(str(local)))
    )
    manager = ProcessManager(LocalTransport(), unit_path=str(script), run_dir=str(run_dir))
    _restart_after_the_edit(manager)
    deadline = time.monotonic() + 30
    while not healthy(sim.target.endpoint) and time.monotonic() < deadline:
        time.sleep(0.1)
    state = Path(sim.target.state_dir)

    # Edited on the host and locally (a program that does not exist), never restarted: still serving.
    broken = _script(unit_path.read_text(), program="/opt/moved/bin/optagent-sim")
    script.write_text(broken)
    local.write_text(broken)
    before = pid_of(sim.sim_dir)
    matches = _status(config)["config_matches_file"]
    assert matches.startswith("unknown:") and "changed after the service started" in matches, matches
    result = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=config, timeout=120)
    message = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 1 and "cannot tell whether the service runs" in message, message
    assert "Nothing was changed" in message, message
    assert pid_of(sim.sim_dir) == before and healthy(sim.target.endpoint)
    assert script.read_text() == broken and not (state / "known-good.service").exists()

    # The operator puts the right script back and restarts it: now it is proven, and deploys work.
    script.write_text(good)
    local.write_text(good)
    _restart_after_the_edit(manager)
    result = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=config, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--mem-fraction-static 0.8" in script.read_text() and healthy(sim.target.endpoint)
    assert (state / "known-good.service").read_text() == script.read_text()
    assert _status(config)["config_matches_file"] is True  # optagent's own restart proves it


def test_recovery_leaves_a_server_that_already_runs_known_good_alone(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    remote = Path(sim.target.remote_unit)
    first = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    known_good = remote.read_text()
    killed = subprocess.run(  # killed once the restart is journaled, before it is made
        [OPTAGENT, "deploy", "--set", "mem-fraction-static=0.81", "--yes", "--config", str(sim.config_path)],
        capture_output=True,
        env={**os.environ, "OPTAGENT_FAULT_KILL_AT": "restart"},
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL
    assert "--mem-fraction-static 0.81" in remote.read_text()  # uploaded, never started
    before = pid_of(sim.sim_dir)

    status = cli("status", config=sim.config_path, timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "restored the known-good configuration" in " ".join(status.stdout.split())
    assert remote.read_text() == known_good and healthy(sim.target.endpoint)
    assert pid_of(sim.sim_dir) == before  # it ran known-good all along: not restarted


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(mount: Path) -> Path:
    filler = mount / "filler"
    with contextlib.suppress(OSError), open(filler, "wb", buffering=0) as f:
        while True:
            f.write(b"x" * 4096)
    return filler


def test_a_local_disk_filled_mid_deploy_says_where_and_keeps_known_good_running(
    ssh_sim, small_tmpfs: Path
) -> None:  # type: ignore[no-untyped-def]
    state = small_tmpfs / "state"
    sim = ssh_sim(state_dir=state)
    first = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    remote = Path(sim.target.remote_unit)
    known_good = remote.read_text()
    candidate = UnitFile.parse(known_good).set_flag("--mem-fraction-static", "0.81").render()
    before = pid_of(sim.sim_dir)
    filled: list[Path] = []

    def progress(phase: str, elapsed: float, total: float | None) -> None:
        if phase == "restart" and not filled:  # the restart is journaled; now the disk is full
            filled.append(_fill(small_tmpfs))

    async def scenario():  # type: ignore[no-untyped-def]
        async with Deployment(sim.target, on_progress=progress) as d:
            return await d.deploy(candidate)

    outcome = asyncio.run(scenario())
    assert filled and not outcome.ok and outcome.restored, outcome.error
    assert f"cannot write {state / 'counters.json'}" in outcome.error, outcome.error
    assert "No space left on device" in outcome.error and "optagent recover" in outcome.error, outcome.error
    assert remote.read_text() == known_good and healthy(sim.target.endpoint)
    assert pid_of(sim.sim_dir) == before  # the candidate never started: nothing to undo by a restart
    filled[0].unlink()
    status = cli("status", config=sim.config_path, timeout=120)
    assert status.returncode == 0 and pid_of(sim.sim_dir) == before, status.stdout + status.stderr
