"""The host lock holds across PID namespaces and hosts of the same name (issue 52, item 5).

A second optagent in its own PID namespace (`unshare --pid --fork --mount-proc`: same host name,
its own /proc, as in a container) sees no process with the holder's PID. It must refuse, saying who
holds the lock and how to remove it by hand, never break it. A holder in this very namespace that
died is still cleared at once; the holder renews a lease the refusal reports.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.test_deploy import HOLD_LOCK, OPTAGENT
from tools.deploy.lock import HostLock, LockedError
from tools.deploy.remote import LocalTransport
from tools.deploy.units.file import UnitFile

UNSHARE = shutil.which("unshare")
ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(
        UNSHARE is None or os.geteuid() != 0, reason="needs util-linux unshare and root for a PID namespace"
    ),
]

TAKE = textwrap.dedent(
    """\
    import asyncio, sys
    from tools.deploy.lock import HostLock, LockedError
    from tools.deploy.remote import LocalTransport
    async def main():
        lock = HostLock(LocalTransport(), sys.argv[1], lease_s=float(sys.argv[2]))
        try:
            await lock.acquire()
        except LockedError as e:
            print("refused:", e, flush=True)
            return
        print("holding", flush=True)
        if sys.argv[3] == "hold":
            await asyncio.sleep(120)
        await lock.release()
    asyncio.run(main())
    """
)


def _take(path: Path, *, lease: float, hold: bool, namespace: bool) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", TAKE, str(path), str(lease), "hold" if hold else "once"]
    if namespace:
        argv = [UNSHARE, "--pid", "--fork", "--mount-proc", "--kill-child", *argv]  # type: ignore[list-item]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=ROOT)


def _said(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=60)
    return " ".join(out.split())


def test_an_optagent_in_another_pid_namespace_refuses_a_live_lock(tmp_path: Path) -> None:
    lock = tmp_path / "sglang.lock"
    holder = _take(lock, lease=1.5, hold=True, namespace=False)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        held = lock.read_text()
        time.sleep(1.2)  # a renewal or two: the lease is fresh when the other one looks
        said = _said(_take(lock, lease=1.5, hold=False, namespace=True))
        assert said.startswith("refused: the target is locked by another optagent (pid"), said
        assert "so it is running; it runs in another PID namespace on this machine" in said, said
        assert lock.read_text() == held and holder.poll() is None  # not broken, holder untouched
    finally:
        holder.kill()
        holder.wait()


def test_a_dead_holder_from_another_namespace_is_left_for_a_person_to_remove(tmp_path: Path) -> None:
    lock = tmp_path / "sglang.lock"
    holder = _take(lock, lease=1.0, hold=True, namespace=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
    holder.send_signal(signal.SIGKILL)  # unshare's child, the namespace's init, goes with it
    holder.wait()
    held = lock.read_text()
    time.sleep(2.5)  # its lease runs out
    said = _said(_take(lock, lease=1.0, hold=False, namespace=False))
    assert "its lease ran out" in said and "so the lock is not broken" in said, said
    assert f"remove the lock by hand on the host (`rm {lock}`)" in said, said
    assert lock.read_text() == held


def test_a_dead_holder_in_this_namespace_is_cleared_and_a_holder_renews_its_lease(tmp_path: Path) -> None:
    lock = tmp_path / "sglang.lock"
    holder = _take(lock, lease=0.6, hold=True, namespace=False)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
    first = lock.stat().st_mtime_ns
    time.sleep(1.5)
    assert lock.stat().st_mtime_ns > first  # renewed while held
    owner = json.loads(lock.read_text())
    assert owner["pid_ns"] == os.readlink("/proc/self/ns/pid") and owner["lease_s"] == 0.6
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert _said(_take(lock, lease=0.6, hold=False, namespace=False)) == "holding"  # broken at once
    assert not lock.exists()


def test_a_lock_of_an_older_optagent_is_not_broken_on_a_host_name(tmp_path: Path) -> None:
    lock = tmp_path / "sglang.lock"
    lock.write_text(json.dumps({"host": os.uname().nodename, "pid": 2**22 - 3, "start": "1", "token": "t",
                                "since": time.time() - 3600}))  # fmt: skip
    with pytest.raises(LockedError, match="it recorded no PID namespace") as refused:
        asyncio.run(HostLock(LocalTransport(), str(lock)).acquire())
    assert f"`rm {lock}`" in str(refused.value) and lock.exists()


def test_a_second_optagent_in_a_container_does_not_deploy_over_a_live_run(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    before = Path(sim.target.remote_unit).read_text()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, sim.target.model_dump_json()], stdout=subprocess.PIPE, text=True,
        cwd=ROOT,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        deploy = subprocess.run(
            [UNSHARE, "--pid", "--fork", "--mount-proc", OPTAGENT, "deploy", "--set", "mem-fraction-static=0.8",
             "--yes", "--config", str(sim.config_path)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        said = " ".join(deploy.stderr.split())
        assert deploy.returncode == 1 and "locked by another optagent" in said, said
        assert "another PID namespace" in said, said
        assert Path(sim.target.remote_unit).read_text() == before
        assert UnitFile.load(sim.target.local_unit).command.flags["--mem-fraction-static"] != "0.8"
        assert (sim.sim_dir / "run" / "sglang.lock").exists() and holder.poll() is None
    finally:
        holder.kill()
        holder.wait()
