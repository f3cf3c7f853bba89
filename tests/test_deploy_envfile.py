"""`EnvironmentFile=` over a real sshd: the process manager gives the server those variables."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.test_deploy import cli, healthy, pid_of
from tools.deploy.deployment import DeployError, Deployment
from tools.deploy.remote import LocalTransport
from tools.deploy.service import ProcessManager
from tools.deploy.units.envfile import parse_env_file


def _environ(pid: str) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    return dict(item.split("=", 1) for item in raw if "=" in item)


def _with_env_file(text: str, line: str) -> str:
    return text.replace("Type=simple\n", f"Type=simple\n{line}\n")


def test_variables_from_an_environment_file_reach_the_server(ssh_sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    env_file = tmp_path / "sglang.env"
    env_file.write_text('# tuned by hand\nOPTAGENT_MARK="hello world"\n; comment\nSERVED=from-env-file\n')
    remote, local = Path(sim.target.remote_unit), Path(sim.target.local_unit)
    text = _with_env_file(
        remote.read_text(), f"EnvironmentFile={env_file}\nEnvironmentFile=-/nonexistent.env"
    )
    text = text.replace("--served-model-name qwen3.5-122b", "--served-model-name ${SERVED}")
    remote.write_text(text)
    local.write_text(text)
    # known-good is only what runs: the operator restarts the service on the edited file first
    pm = ProcessManager(LocalTransport(), unit_path=str(remote), run_dir=str(sim.sim_dir / "run"))
    asyncio.run(pm.restart())

    result = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path)
    assert result.returncode == 0, result.stdout + result.stderr
    pid = pid_of(sim.sim_dir)
    env = _environ(pid)
    assert env["OPTAGENT_MARK"] == "hello world" and env["SERVED"] == "from-env-file"
    assert b"from-env-file" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    status = cli("status", "--json", config=sim.config_path)
    assert '"config_matches_file": true' in status.stdout, status.stdout
    assert pid_of(sim.sim_dir) == pid and healthy(sim.target.endpoint)


def test_a_missing_environment_file_fails_before_the_server_is_stopped(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    original = Path(sim.target.remote_unit).read_text()
    candidate = _with_env_file(original, "EnvironmentFile=/nonexistent/sglang.env")
    before = pid_of(sim.sim_dir)

    async def scenario() -> None:
        async with Deployment(sim.target) as d:
            with pytest.raises(DeployError, match="EnvironmentFile=/nonexistent/sglang.env does not exist"):
                await d.deploy(candidate)

    asyncio.run(scenario())
    assert pid_of(sim.sim_dir) == before  # never stopped: refused before the host changed
    assert Path(sim.target.remote_unit).read_text() == original
    assert healthy(sim.target.endpoint)


def test_env_file_syntax() -> None:
    text = 'A=1\n  B = \'two words\'\nC="x \\"q\\""\nD=a\\\nb\n'
    assert parse_env_file(text) == {"A": "1", "B": "two words", "C": 'x "q"', "D": "ab"}
    try:
        parse_env_file("export A=1\nnot a pair\n", name="f.env")
    except ValueError as e:
        assert "f.env line 1" in str(e)
    else:
        raise AssertionError("a bad line must be refused")
