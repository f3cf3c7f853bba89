"""What the host's SSH side says when it fails, and what reading its log costs (issue 52, smaller
items): an unreachable sshd gives its reason and what to check; an account allowed only SFTP is said
so, without printing the script that could not run; a 1 GiB server log is read from its end only.
A real sshd of the test's own on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.sshd import SSHD, _wait_for_banner
from tests.test_deploy import cli
from tests.test_deploy_sshfail import OwnSSHD, _options

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def own_sshd(tmp_path: Path) -> Iterator[OwnSSHD]:
    sshd = OwnSSHD(tmp_path / "own-sshd")
    try:
        yield sshd
    finally:
        if sshd.proc.poll() is None:
            sshd.stop()


def _said(result: subprocess.CompletedProcess[str]) -> str:
    return " ".join((result.stdout + result.stderr).split())


def test_an_unreachable_sshd_says_why_and_what_to_check(ssh_sim, own_sshd: OwnSSHD) -> None:  # type: ignore[no-untyped-def]
    port = own_sshd.server.port
    sim = ssh_sim(**{**_options(own_sshd.server), "connect_timeout_s": 1.0})
    own_sshd.proc.send_signal(signal.SIGSTOP)  # it accepts connections and never answers
    try:
        stopped = cli("status", config=sim.config_path, timeout=120)
    finally:
        own_sshd.proc.send_signal(signal.SIGCONT)
    said = _said(stopped)
    assert stopped.returncode == 1 and "Traceback" not in said, said
    assert (
        f"cannot connect: no SSH answer within 1 s (the host down or unreachable, a firewall dropping port {port}"
        in said
    )
    own_sshd.stop()  # nothing listens any more
    refused = cli("status", config=sim.config_path, timeout=120)
    said = _said(refused)
    assert refused.returncode == 1 and "Traceback" not in said, said
    assert (
        f"cannot connect: connection refused on port {port}: no sshd listens there; check that sshd runs"
        in said
    )
    assert "cannot connect: ," not in said and not said.rstrip().endswith("cannot connect:")


def test_an_sftp_only_account_is_said_plainly_without_the_script(ssh_sim, own_sshd: OwnSSHD) -> None:  # type: ignore[no-untyped-def]
    own_sshd.stop()
    own_sshd.config.write_text(own_sshd.config.read_text() + "ForceCommand internal-sftp\n")
    own_sshd.proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(own_sshd.config)], stderr=subprocess.PIPE, text=True
    )
    _wait_for_banner(own_sshd.server.port, own_sshd.proc)
    sim = ssh_sim(**_options(own_sshd.server))
    for command in (["status"], ["deploy", "--set", "mem-fraction-static=0.8", "--yes"]):
        result = cli(*command, config=sim.config_path, timeout=120)
        said = _said(result)
        assert result.returncode == 1 and "Traceback" not in said, said
        assert "may use only SFTP, commands cannot run there" in said, said
        assert "This service allows sftp connections only." in said and "ForceCommand internal-sftp" in said
        assert "connection lost running" not in said and 'echo "uid=$(id -u)' not in said, said  # no script
        assert len(said) < 800, said


READ_TAIL = textwrap.dedent(
    """\
    import asyncio, sys
    from tools.config import TargetConfig
    from tools.deploy.deployment import Deployment
    target = TargetConfig.model_validate_json(sys.argv[1])
    async def main():
        d = Deployment(target)
        try:
            await d.open()
            print(await d.log_tail(5))
        finally:
            await d.transport.close()
    asyncio.run(main())
    # VmHWM: this program's own peak (ru_maxrss would carry the forking test worker's over exec)
    hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    print(f"maxrss {hwm.split()[1]}")
    """
)


def test_a_gigabyte_host_log_is_read_from_its_end_only(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    log = sim.sim_dir / "run" / "sglang.log"
    with log.open("ab") as f:  # a gigabyte the server wrote since its start (sparse: no disk used)
        f.truncate(log.stat().st_size + (1 << 30))
    with log.open("a") as f:
        f.write("\n".join(f"line {i}" for i in range(100)) + "\nValueError: the last words\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", READ_TAIL, sim.target.model_dump_json()],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    # the reader's own peak in KiB (RUSAGE_CHILDREN would count every earlier child of this worker)
    peak_mib = int(done.stdout.splitlines()[-1].split()[1]) / 1024
    assert done.stdout.splitlines()[-6:-1] == [
        "line 96",
        "line 97",
        "line 98",
        "line 99",
        "ValueError: the last words",
    ]
    assert took < 10, took
    assert peak_mib < 500, peak_mib  # a whole read held the gigabyte twice over (2.17 GB)
    assert os.path.getsize(log) > 1 << 30
