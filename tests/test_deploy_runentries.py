"""What is inside the run directory is checked before use, and a PID is signalled only when it is ours.

A real sshd on loopback and a second local user: while the run dir was 0777 (an old umask), that user
planted a symlink where the launcher writes its PID and a PID file of the dead-man's watchdog naming
a process of theirs; the admin then ran `chmod go-w`. Issue 27, item 1.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.fixtures.users import as_user
from tests.test_deploy import cli, healthy, pid_of
from tools.deploy.deadman import DeadmanSwitch
from tools.deploy.deployment import DeployError, Deployment
from tools.deploy.remote import LocalTransport
from tools.deploy.service import ProcessManager


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    return state != "Z"


def test_entries_another_user_planted_are_named_and_refused(
    ssh_sim, other_user: str, shared_dir: Path
) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    run = sim.sim_dir / "run"
    run.chmod(0o777)  # an old umask
    precious = shared_dir / "precious.txt"  # a file of the SSH user
    precious.write_text("the SSH user's data\n")
    victim = subprocess.Popen(["runuser", "-u", other_user, "--", "setsid", "sleep", "300"])
    try:
        stage = shared_dir / "stage"
        made = as_user(
            other_user,
            f"mkdir {stage} && ln -s {precious} {stage}/sglang.pid.tmp && "
            f"echo {victim.pid} > {stage}/sglang.deadman.pid && chmod 666 {stage}/sglang.deadman.pid",
        )
        assert made.returncode == 0, made.stderr
        for name in ("sglang.pid.tmp", "sglang.deadman.pid"):  # planted: renamed in, owner kept
            os.rename(stage / name, run / name)
        run.chmod(0o755)  # the advised `chmod go-w DIR`
        server_pid = pid_of(sim.sim_dir)

        for command in (["status"], ["deploy", "--set", "mem-fraction-static=0.8", "--yes"]):
            result = cli(*command, config=sim.config_path)
            message = " ".join(result.stderr.split())
            assert result.returncode == 1, (command, result.stdout, message)
            assert "holds entries optagent did not make" in message
            assert f"{run}/sglang.pid.tmp (a symlink)" in message
            uid = int(subprocess.run(["id", "-u", other_user], capture_output=True, text=True).stdout)
            assert f"{run}/sglang.deadman.pid (owned by uid {uid})" in message

        assert precious.read_text() == "the SSH user's data\n" and not (run / "sglang.lock").exists()
        assert _alive(victim.pid) and pid_of(sim.sim_dir) == server_pid and healthy(sim.target.endpoint)

        for name in ("sglang.pid.tmp", "sglang.deadman.pid"):  # the admin removes what was planted
            (run / name).unlink()
        result = cli(
            "deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path, timeout=120
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert pid_of(sim.sim_dir) != server_pid and healthy(sim.target.endpoint)
        assert precious.read_text() == "the SSH user's data\n" and _alive(victim.pid)
        for entry in [*run.iterdir(), *(run / "backups").iterdir()]:  # ours, writable by nobody else
            st = entry.lstat()
            assert not entry.is_symlink() and st.st_uid == os.geteuid() and st.st_mode & 0o022 == 0, entry
            assert entry.is_dir() if entry.name == "backups" else entry.is_file() and st.st_nlink == 1, entry
    finally:
        victim.kill()
        victim.wait()


def test_a_symlink_in_the_run_dir_path_is_refused_however_it_is_spelled(
    ssh_sim, other_user: str, shared_dir: Path
) -> None:  # type: ignore[no-untyped-def]
    real = shared_dir / "real"
    real.mkdir(mode=0o700)
    mine = shared_dir / "mine"
    mine.symlink_to(real)
    theirs = shared_dir / "theirs"
    assert as_user(other_user, f"ln -s {real} {theirs}").returncode == 0
    through = shared_dir / "through"  # ours, but it leads through theirs
    through.symlink_to(theirs)
    for run_dir, why in [
        (f"{mine}/.", "is a symlink"),  # the last component, spelled `DIR/.`
        (f"{mine}/", "is a symlink"),
        (f"{theirs}/run", f"the symlink {theirs} on the way is owned by uid"),
        (f"{through}/run", f"the symlink {theirs} on the way is owned by uid"),
        (f"{real}/../real/run", "without `..`"),
    ]:
        sim = ssh_sim(run_dir=run_dir, name=f"sim{abs(hash(run_dir)) % 10**6}")
        with pytest.raises(DeployError, match=why):
            asyncio.run(Deployment(sim.target).open())
    sim = ssh_sim(run_dir=f"{mine}/run", name="sim-ok")  # our own symlink in a sticky dir: fine
    assert asyncio.run(_opened_run_dir(sim.target)) == f"{real}/run"


async def _opened_run_dir(target) -> str:  # type: ignore[no-untyped-def]
    d = Deployment(target)
    try:
        await d.open()
        return d.run_dir
    finally:
        await d.transport.close()


def test_a_group_writable_ancestor_is_refused_over_ssh(ssh_sim, shared_dir: Path) -> None:  # type: ignore[no-untyped-def]
    opt = shared_dir / "opt"
    opt.mkdir()
    os.chown(opt, -1, os.getegid())  # the SSH user's own primary group, which looks private
    opt.chmod(0o775)  # yet another member of it could rename the tree
    sim = ssh_sim(run_dir=str(opt / "optagent" / "run"))
    with pytest.raises(DeployError, match=f"{opt} is writable by group or others"):
        asyncio.run(Deployment(sim.target).open())


def _session_sleep() -> subprocess.Popen:
    proc = subprocess.Popen(["setsid", "sleep", "300"])
    for _ in range(100):  # setsid forks when it is a group leader; wait for `sleep` itself
        if Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"sleep"):
            break
        time.sleep(0.01)
    return proc


def test_a_pid_whose_process_is_another_one_is_never_signalled(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    pm = ProcessManager(
        LocalTransport(), unit_path=str(tmp_path / "sglang.service"), run_dir=str(run), grace_s=1
    )
    other = _session_sleep()  # a session leader, like a server: only its start time tells it apart
    try:
        (run / "sglang.pid").write_text(f"{other.pid} 12345\n")  # a stale file: PID reused since
        assert not asyncio.run(pm.is_active()) and asyncio.run(pm.pid()) is None
        asyncio.run(pm.stop())
        assert _alive(other.pid) and not (run / "sglang.pid").exists()

        switch = DeadmanSwitch(pm.transport, pm, run_dir=str(run), unit_path=pm.unit_path, service="sglang")
        (run / "sglang.deadman-armed").write_text("armed\n")
        (run / "sglang.deadman.pid").write_text(f"{other.pid}\n")  # not a watchdog's command line
        assert asyncio.run(switch.disarm())
        assert _alive(other.pid) and not (run / "sglang.deadman-armed").exists()

        start = Path(f"/proc/{other.pid}/stat").read_text().rpartition(")")[2].split()[19]
        for text in (f"{other.pid} {start}\n", f"{other.pid}\n"):  # ours; and an older optagent's file
            (run / "sglang.pid").write_text(text)
            assert asyncio.run(pm.is_active()) and asyncio.run(pm.pid()) == other.pid
        asyncio.run(pm.stop())
        other.wait(5)
    finally:
        other.kill()
        other.wait()


def test_a_planted_local_state_entry_is_refused(ssh_sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    secret = tmp_path / "secret.service"
    secret.write_text("not a unit\n")
    (state / "known-good.service").symlink_to(secret)
    sim = ssh_sim(state_dir=state)
    with pytest.raises(DeployError, match=r"known-good.service \(a symlink\)"):
        asyncio.run(Deployment(sim.target).open())
    shutil.rmtree(state)


def test_backups_of_a_group_writable_unit_are_not_foreign_entries(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    Path(sim.target.remote_unit).chmod(0o664)  # made under umask 002 on the host
    for value in ("0.81", "0.82"):  # the second deploy checks the backups the first one made
        result = cli(
            "deploy", "--set", f"mem-fraction-static={value}", "--yes", config=sim.config_path, timeout=120
        )
        assert result.returncode == 0, result.stdout + result.stderr
    backups = list((sim.sim_dir / "run" / "backups").iterdir())
    assert len(backups) == 2 and all(b.stat().st_mode & 0o022 == 0 for b in backups)
    assert Path(sim.target.remote_unit).stat().st_mode & 0o777 == 0o664  # the unit keeps its own mode
