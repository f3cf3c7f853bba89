"""Known-good is only what runs and serves: a unit file edited on the host but never restarted is not
recorded, and nothing is stopped (issue 27, item 2). Over a real sshd, against the simulated server."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.test_deploy import cli, healthy, pid_of
from tools.deploy.remote import LocalTransport
from tools.deploy.service import ProcessManager
from tools.deploy.units.file import UnitFile


def test_a_unit_edited_but_never_restarted_is_not_recorded_as_known_good(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    remote, local = Path(sim.target.remote_unit), Path(sim.target.local_unit)
    state = Path(sim.target.state_dir)
    # Edited on the host (a flag the running server was not started with); the old process still serves.
    edited = UnitFile.parse(remote.read_text()).set_flag("--mem-fraction-static", "0.83").render()
    assert edited != remote.read_text()
    remote.write_text(edited)
    local.unlink()  # optagent knows nothing yet: known-good would come from the host
    before = pid_of(sim.sim_dir)

    result = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path)
    message = " ".join(result.stderr.split())
    assert result.returncode == 1, result.stdout + result.stderr
    assert "is not what the service runs" in message and "Nothing was changed" in message
    assert pid_of(sim.sim_dir) == before and healthy(sim.target.endpoint)  # never stopped
    assert remote.read_text() == edited and not local.exists()
    assert not (state / "known-good.service").exists() and not (sim.sim_dir / "run" / "sglang.lock").exists()

    # Once the operator restarts it on the edited file, that is what runs: it may become known-good.
    result = cli("status", config=sim.config_path)  # `status` records nothing either
    assert not (state / "known-good.service").exists()
    pm = ProcessManager(LocalTransport(), unit_path=str(remote), run_dir=str(sim.sim_dir / "run"))
    asyncio.run(pm.restart())
    result = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert UnitFile.parse(remote.read_text()).command.flags["--mem-fraction-static"] == "0.8"
    assert healthy(sim.target.endpoint)
