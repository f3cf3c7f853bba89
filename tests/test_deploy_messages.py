"""What `deploy` and `status` print (issue 27, item 7): secrets redacted, no message that contradicts
another after a failed rollback, and values SGLang refuses at once (tp-size 0, negative sizes)
refused before any restart. Over a real sshd, against the simulated server."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.test_deploy import OPTAGENT, cli, healthy, pid_of
from tools.deploy.deployment import DeployError, Deployment
from tools.deploy.units.file import UnitFile

KEY = "sk-test-redact-0123456789"


def test_the_api_key_is_never_printed(ssh_sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    with_key = tmp_path / "with-key.toml"  # the key in the config file only, not in the environment
    with_key.write_text(sim.config_path.read_text().replace("[target]\n", f'[target]\napi_key = "{KEY}"\n'))
    outputs = [cli("deploy", "--set", f"api-key={KEY}", "--yes", config=with_key, timeout=120)]
    assert outputs[0].returncode == 0, outputs[0].stdout + outputs[0].stderr
    assert KEY in Path(sim.target.remote_unit).read_text()  # it is deployed, just not shown
    outputs += [
        cli("status", config=with_key),
        cli("status", "--json", config=with_key),
        cli("deploy", "--set", "mem-fraction-static=0.8", "--dry-run", config=with_key),
        # a candidate that does not start: its error and log lines are printed
        cli("deploy", "--set", "mem-fraction-static=0.5", "--yes", config=with_key, timeout=120),
    ]
    assert outputs[1].returncode == 0 and "--api-key" in outputs[1].stdout
    # a failure is told on stderr, its error text as the host gave it (no markup tags shown)
    failed = outputs[4]
    assert failed.returncode == 1 and "last log lines" in failed.stderr, failed.stdout + failed.stderr
    assert "deploy failed: " in failed.stderr and "[red]" not in failed.stderr + failed.stdout
    for result in outputs:
        assert KEY not in result.stdout + result.stderr, result.args
    assert "[REDACTED]" in outputs[0].stdout and "[REDACTED]" in outputs[2].stdout


def test_a_failed_rollback_is_never_called_restored(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    port = int(sim.target.endpoint.rsplit(":", 1)[1])
    before = pid_of(sim.sim_dir)
    deploy = subprocess.Popen(
        [OPTAGENT, "deploy", "--set", "mem-fraction-static=0.8", "--yes", "--config", str(sim.config_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    squatter = socket.socket()  # takes the port as soon as the old server lets it go: nothing starts
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            squatter.bind(("127.0.0.1", port))
            break
        except OSError:
            time.sleep(0.005)
    try:
        out, err = deploy.communicate(timeout=180)
    finally:
        squatter.close()
    text = " ".join((out + err).split())
    assert deploy.returncode == 1 and "ROLLBACK FAILED" in text, text[-3000:]
    assert "the known-good configuration was restored" not in text
    assert "put back but is NOT serving" in text
    assert pid_of(sim.sim_dir) != before or not healthy(sim.target.endpoint)
    result = cli("rollback", config=sim.config_path, timeout=120)  # the port is free again: it comes back
    assert result.returncode == 0 and healthy(sim.target.endpoint), result.stdout + result.stderr


@pytest.mark.parametrize("edit", ["tp-size=0", "dp-size=-5", "mem-fraction-static=0", "pp-size=1.5"])
def test_values_sglang_refuses_at_once_cost_no_restart(ssh_sim, edit: str) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    before, unit = pid_of(sim.sim_dir), Path(sim.target.remote_unit).read_text()
    started = time.monotonic()
    result = cli("deploy", "--set", edit, "--yes", config=sim.config_path)
    assert result.returncode == 2 and f"--{edit.split('=')[0]} must be" in result.stderr, result.stderr
    assert time.monotonic() - started < 20
    candidate = UnitFile.parse(unit).set_flag(f"--{edit.split('=')[0]}", edit.split("=")[1]).render()

    async def through_the_gate() -> None:  # what an agent's trial would do: refused by Deployment itself
        async with Deployment(sim.target) as d:
            with pytest.raises(DeployError, match=r"must be .* \(nothing was changed\)"):
                await d.deploy(candidate)

    asyncio.run(through_the_gate())
    assert pid_of(sim.sim_dir) == before and Path(sim.target.remote_unit).read_text() == unit
    assert not (Path(sim.target.state_dir) / "journal.json").exists() and healthy(sim.target.endpoint)
