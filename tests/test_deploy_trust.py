"""A run directory another local user planted (or can write) is refused over a real sshd; ours is 0700."""

from __future__ import annotations

import asyncio
import os
import pwd
import stat
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.users import as_user
from tests.test_deploy import cli
from tools.deploy.deployment import DeployError, Deployment


def test_a_run_dir_planted_by_another_user_is_refused(ssh_sim, other_user: str, shared_dir: Path) -> None:  # type: ignore[no-untyped-def]
    planted = shared_dir / "optagent"
    # The other user creates the run dir first, with a PID file naming its own process group.
    victim = subprocess.Popen(["runuser", "-u", other_user, "--", "setsid", "sleep", "300"])
    try:
        made = as_user(other_user, f"mkdir -m 777 {planted} && echo {victim.pid} > {planted}/sglang.pid")
        assert made.returncode == 0, made.stderr
        sim = ssh_sim(run_dir=str(planted))

        result = cli("status", config=sim.config_path)
        assert result.returncode == 1
        message = " ".join(result.stderr.split())
        assert f"is owned by uid {pwd.getpwnam(other_user).pw_uid}" in message
        result = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path)
        assert result.returncode == 1 and "another user may have planted it" in " ".join(
            result.stderr.split()
        )
        assert victim.poll() is None  # optagent killed nothing
        assert (planted / "sglang.pid").read_text().strip() == str(victim.pid)
        assert not (planted / "sglang.lock").exists()
    finally:
        victim.kill()
        victim.wait()


def test_writable_or_symlinked_run_dirs_are_refused(ssh_sim, shared_dir: Path) -> None:  # type: ignore[no-untyped-def]
    group_writable = shared_dir / "gw"
    group_writable.mkdir()
    group_writable.chmod(0o770)
    link = shared_dir / "link"
    link.symlink_to(group_writable)
    for run_dir, why in [(group_writable, "writable by group or others"), (link, "is a symlink")]:
        sim = ssh_sim(run_dir=str(run_dir), name=f"sim-{run_dir.name}")
        with pytest.raises(DeployError, match=why):
            asyncio.run(Deployment(sim.target).open())


def test_a_new_run_dir_is_created_private(ssh_sim, shared_dir: Path) -> None:  # type: ignore[no-untyped-def]
    run_dir = shared_dir / "fresh" / "run"
    sim = ssh_sim(run_dir=str(run_dir))

    async def scenario() -> str:
        async with Deployment(sim.target) as d:
            return d.run_dir

    assert asyncio.run(scenario()) == str(run_dir)
    for p in (run_dir, run_dir.parent):
        st = p.stat()
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()


def test_a_shared_local_state_dir_is_refused(ssh_sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    sim = ssh_sim(state_dir=state)
    with pytest.raises(DeployError, match="state directory .* writable by group or others"):
        asyncio.run(Deployment(sim.target).open())


def test_a_group_writable_parent_is_refused_as_strictmodes_does() -> None:
    from tools.deploy.dirtrust import DirEntry, UntrustedDirError, check_chain

    run = DirEntry("/home/u/proj/run", 1000, 0o40700, 1000)
    root = DirEntry("/", 0, 0o40755, 0)
    check_chain("run directory", run.path, [run, DirEntry("/home/u/proj", 1000, 0o40755, 100), root], me=1000)
    # group `users` may be the user's own primary group: its other members could still rename the tree
    for gid in (1000, 100):
        shared = DirEntry("/home/u/proj", 1000, 0o40775, gid)
        with pytest.raises(UntrustedDirError, match="/home/u/proj is writable by group or others"):
            check_chain("run directory", run.path, [run, shared, root], me=1000)
    with pytest.raises(UntrustedDirError, match="writable by group or others"):  # the dir itself: never
        check_chain("run directory", run.path, [DirEntry(run.path, 1000, 0o40770, 1000), root], me=1000)
    sticky = DirEntry("/tmp", 0, 0o41777, 0)  # a sticky ancestor like /tmp: only owners rename entries
    check_chain("run directory", run.path, [run, sticky, root], me=1000)
