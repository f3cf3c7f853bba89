"""A deploy never drops a flag it did not mean to touch, and a wrapper's options are never server
flags (issue 52, item 4). Over a real sshd, against the simulated server, whose process manager
starts `ExecStart=` with systemd's expansion: `$EXTRA` alone is split into the server's arguments.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from tests.test_deploy import cli, healthy, pid_of
from tools.deploy.remote import LocalTransport
from tools.deploy.service import ProcessManager


def _cmdline(sim_dir: Path) -> list[str]:
    return Path(f"/proc/{pid_of(sim_dir)}/cmdline").read_bytes().decode().split("\0")[:-1]


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _edit_and_restart(sim, change) -> str:  # type: ignore[no-untyped-def]
    """Edit the unit on the host and locally, then restart it as an operator would (a moment later)."""
    remote, local = Path(sim.target.remote_unit), Path(sim.target.local_unit)
    text = change(remote.read_text())
    remote.write_text(text)
    local.write_text(text)
    time.sleep(0.6)
    manager = ProcessManager(LocalTransport(), unit_path=str(remote), run_dir=str(sim.sim_dir / "run"))
    asyncio.run(manager.restart())
    deadline = time.monotonic() + 30
    while not healthy(sim.target.endpoint) and time.monotonic() < deadline:
        time.sleep(0.1)
    return text


def _status(config: Path) -> dict:  # type: ignore[type-arg]
    result = cli("status", "--json", config=config)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def test_flags_in_a_variable_stay_and_can_be_edited_where_they_are(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()

    def with_extra(text: str) -> str:
        text = text.replace("    --max-running-requests 64 \\\n", "").replace(
            "    --cuda-graph-max-bs-decode 32 \\\n", ""
        )
        text = text.replace("--mem-fraction-static 0.85 \\\n", "--mem-fraction-static 0.85 $EXTRA \\\n")
        return text.replace(
            "Type=simple\n",
            'Type=simple\nEnvironment="EXTRA=--cuda-graph-max-bs-decode 32 --max-running-requests 64"\n',
        )

    _edit_and_restart(sim, with_extra)
    argv = _cmdline(sim.sim_dir)
    assert _after(argv, "--max-running-requests") == "64" and _after(argv, "--mem-fraction-static") == "0.85"
    flags = _status(sim.config_path)["deployed_flags"]
    assert flags["--mem-fraction-static"] == "0.85", flags  # not "0.85 ${EXTRA}"
    assert flags["--cuda-graph-max-bs-decode"] == "32" and flags["--max-running-requests"] == "64", flags

    result = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    argv = _cmdline(sim.sim_dir)
    assert _after(argv, "--mem-fraction-static") == "0.8"
    assert (
        _after(argv, "--cuda-graph-max-bs-decode") == "32" and _after(argv, "--max-running-requests") == "64"
    )

    result = cli("deploy", "--set", "max-running-requests=48", "--yes", config=sim.config_path, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'Environment="EXTRA=--cuda-graph-max-bs-decode 32 --max-running-requests 48"' in result.stdout
    argv = _cmdline(sim.sim_dir)
    assert _after(argv, "--max-running-requests") == "48" and argv.count("--max-running-requests") == 1
    assert "$EXTRA" in Path(sim.target.remote_unit).read_text()
    assert _status(sim.config_path)["config_matches_file"] is True


def test_a_wrapper_s_options_are_neither_flags_nor_a_reason_to_refuse(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    _edit_and_restart(
        sim, lambda text: text.replace("ExecStart=", "ExecStart=/usr/bin/taskset --cpu-list 0-1 ", 1)
    )
    info = _status(sim.config_path)
    assert "--cpu-list" not in info["deployed_flags"] and info["deployed_flags"]["--tp-size"] == "4", info
    assert info["config_matches_file"] is True, info  # proven: started after the file last changed
    before = pid_of(sim.sim_dir)
    result = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert pid_of(sim.sim_dir) != before and healthy(sim.target.endpoint)
    assert "ExecStart=/usr/bin/taskset --cpu-list 0-1 " in Path(sim.target.remote_unit).read_text()
    assert _status(sim.config_path)["config_matches_file"] is True  # optagent's own restart proves it
