"""asyncssh failures become one clear error and the lock is released (issue 27, item 6); the SSH
connection killed in the middle of a deploy ends on known-good and healthy (item 8). A real sshd
of the test's own on loopback, so that it can lack SFTP or be killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.sshd import SSHD, SSHServer, _wait_for_banner, start_sshd
from tests.test_deploy import OPTAGENT, cli, healthy
from tools.deploy.units.file import UnitFile


class OwnSSHD:
    """An sshd this test may reconfigure, kill and start again on the same port."""

    def __init__(self, directory: Path) -> None:
        self.server, self.proc = start_sshd(directory)
        self.config = directory / "sshd_config"

    def restart(self, *, sftp: bool = True) -> None:
        self.stop()
        lines = self.config.read_text().splitlines()
        lines = [ln for ln in lines if sftp or not ln.startswith("Subsystem")]
        self.config.write_text("\n".join(lines) + "\n")
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.config)], stderr=subprocess.PIPE, text=True
        )
        _wait_for_banner(self.server.port, self.proc)

    def kill_sessions(self) -> int:
        """SIGKILL every session process of this sshd (the listener stays): connections drop."""
        children = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True
        ).stdout.split()
        for pid in children:
            os.kill(int(pid), signal.SIGKILL)
        return len(children)

    def stop(self) -> None:
        # stopped first, the listener forks no new session between the kill and its end (a client
        # reconnecting in that window kept a session, and its rollback reached the "stopped" host)
        self.proc.send_signal(signal.SIGSTOP)
        self.kill_sessions()
        self.proc.kill()
        self.proc.wait(5)


@pytest.fixture
def own_sshd(tmp_path: Path) -> Iterator[OwnSSHD]:
    sshd = OwnSSHD(tmp_path / "own-sshd")
    try:
        yield sshd
    finally:
        if sshd.proc.poll() is None:
            sshd.stop()


def _options(server: SSHServer) -> dict[str, object]:
    return {**server.target_options(), "connect_timeout_s": 2.0}


def test_a_host_without_sftp_gives_one_clear_error_and_no_lock(ssh_sim, own_sshd: OwnSSHD) -> None:  # type: ignore[no-untyped-def]
    own_sshd.restart(sftp=False)
    sim = ssh_sim(**_options(own_sshd.server))
    unit = Path(sim.target.remote_unit).read_text()
    for command in (["status"], ["deploy", "--set", "mem-fraction-static=0.8", "--yes"], ["rollback"]):
        result = cli(*command, config=sim.config_path)
        output = result.stdout + result.stderr
        assert result.returncode == 1 and "Traceback" not in output, (command, output[-3000:])
        assert "cannot start an SFTP session" in output and "Subsystem sftp" in output, output
        assert not (sim.sim_dir / "run" / "sglang.lock").exists(), command
    assert Path(sim.target.remote_unit).read_text() == unit and healthy(sim.target.endpoint)


def test_wrong_key_is_one_clear_error(ssh_sim, own_sshd: OwnSSHD, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    stranger = tmp_path / "stranger_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    sim = ssh_sim(**{**_options(own_sshd.server), "identity_file": str(stranger)})
    result = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output and "authentication failed" in output, output


def _journal_step(state: Path) -> str | None:
    try:
        return json.loads((state / "journal.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return None


@pytest.mark.parametrize("listener", ["kept", "killed"])
def test_the_connection_killed_mid_deploy_ends_on_known_good(
    ssh_sim, own_sshd: OwnSSHD, listener: str
) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim(**{**_options(own_sshd.server), "deadman_s": 4.0, "health_timeout_s": 4.0}, time_scale=0.05)
    remote, local = Path(sim.target.remote_unit), Path(sim.target.local_unit)
    state = Path(sim.target.state_dir)
    known_good = remote.read_text()
    deploy = subprocess.Popen(
        [OPTAGENT, "deploy", "--set", "mem-fraction-static=0.8", "--yes", "--config", str(sim.config_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while _journal_step(state) not in ("restart", "wait") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _journal_step(state) in ("restart", "wait"), deploy.communicate()
    if listener == "killed":
        own_sshd.stop()  # the host is unreachable from now on
    else:
        assert own_sshd.kill_sessions() >= 1
    started = time.monotonic()
    out, err = deploy.communicate(timeout=120)
    took = time.monotonic() - started
    assert "Traceback" not in out + err, err[-3000:]
    assert took < 60, took  # bounded: connect timeouts and retries, not a hang
    if listener == "killed":
        # the host went away during the restart or the wait: either the deploy's own step or its
        # rollback could not reach it, and the failure says so on stderr
        assert deploy.returncode == 1 and "cannot connect" in err, (out[-2000:], err[-2000:])
        deadline = time.monotonic() + 30  # the host's dead-man's switch restores known-good by itself
        while remote.read_text() != known_good and time.monotonic() < deadline:
            time.sleep(0.2)
        own_sshd.restart()
        result = cli("recover", config=sim.config_path, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
    # Either the deploy finished over a new connection, or it was undone: the three copies agree.
    assert remote.read_text() == local.read_text() == (state / "known-good.service").read_text()
    assert not (state / "journal.json").exists() and not (sim.sim_dir / "run" / "sglang.lock").exists()
    assert healthy(sim.target.endpoint)
    flags = UnitFile.parse(remote.read_text()).command.flags
    assert flags["--mem-fraction-static"] in (
        "0.8",
        UnitFile.parse(known_good).command.flags["--mem-fraction-static"],
    )
    if listener == "killed":
        assert remote.read_text() == known_good
