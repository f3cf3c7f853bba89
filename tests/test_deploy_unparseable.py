"""A unit that does not parse is never recorded as known-good and never stops a running server."""

from __future__ import annotations

from pathlib import Path

from tests.test_deploy import cli, healthy, pid_of


def _alive(pid: str) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_a_local_unit_without_execstart_is_refused_and_not_recorded(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    local = Path(sim.target.local_unit)
    local.write_text(local.read_text().replace("ExecStart=", "ExecStartPre="))
    before = pid_of(sim.sim_dir)

    result = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no ExecStart" in result.stderr and "nothing was changed" in " ".join(result.stderr.split())
    assert not (Path(sim.target.state_dir) / "known-good.service").exists()

    result = cli("status", config=sim.config_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert pid_of(sim.sim_dir) == before and _alive(before)
    assert healthy(sim.target.endpoint)


def test_status_and_recover_never_stop_a_server_whose_unit_does_not_parse(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    remote = Path(sim.target.remote_unit)
    broken = remote.read_text().replace("Type=simple\n", "Type=simple\nEnvironment=JUSTAWORD\n")
    state = Path(sim.target.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    for path in (remote, Path(sim.target.local_unit), state / "known-good.service"):
        path.write_text(broken)  # recorded by an older optagent, then the server kept running
    before = pid_of(sim.sim_dir)

    for command in ("status", "recover"):
        result = cli(command, config=sim.config_path)
        assert result.returncode == 0, (command, result.stdout, result.stderr)
        assert pid_of(sim.sim_dir) == before and _alive(before), command
    status = cli("status", "--json", config=sim.config_path)
    assert "is not NAME=value" in status.stdout
    assert healthy(sim.target.endpoint)

    result = cli("rollback", config=sim.config_path)  # nothing in flight: touches nothing
    assert pid_of(sim.sim_dir) == before and _alive(before)
    result = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path)
    assert result.returncode == 2 and "JUSTAWORD" in result.stderr
    assert pid_of(sim.sim_dir) == before and _alive(before) and remote.read_text() == broken
