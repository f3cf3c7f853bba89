"""Faults not tried before (issue 27, item 8): a full local state dir (a 64 KiB tmpfs), a server that
answers /health 200 but fails every generation, two optagents on one target at once. Each ends on
known-good and healthy or with a clear error, nothing lost, in bounded time. Real sshd on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_deploy import OPTAGENT, cli, healthy, pid_of
from tools.deploy.deployment import Deployment
from tools.deploy.units.file import UnitFile


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(mount: Path, leave: int) -> Path:
    """A filler file that leaves about `leave` bytes free on the tmpfs."""
    filler = mount / "filler"
    filler.unlink(missing_ok=True)
    st = os.statvfs(mount)
    size = max(0, st.f_bavail * st.f_frsize - leave)
    with open(filler, "wb") as f, contextlib.suppress(OSError):
        f.write(b"x" * size)
    return filler


def _flag(unit: Path) -> str | None:
    return UnitFile.parse(unit.read_text()).command.flags.get("--mem-fraction-static")


def test_a_full_local_state_dir_never_strands_the_host(ssh_sim, small_tmpfs: Path) -> None:  # type: ignore[no-untyped-def]
    state, local_dir = small_tmpfs / "state", small_tmpfs / "local"
    local_dir.mkdir(mode=0o700)
    sim = ssh_sim(state_dir=state, local_unit=local_dir / "sglang.service")
    remote = Path(sim.target.remote_unit)
    (local_dir / "sglang.service").write_text(remote.read_text())
    first = cli("deploy", "--set", "mem-fraction-static=0.8", "--yes", config=sim.config_path, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    outcomes = []
    for i, pages in enumerate([0, 1, 2, 3, 4, 5, 6, 8]):  # every point a write can fail at, one page apart
        filler = _fill(small_tmpfs, pages * 4096)
        before_flag, before_pid = _flag(remote), pid_of(sim.sim_dir)
        started = time.monotonic()
        result = cli(
            "deploy", "--set", f"mem-fraction-static=0.8{i + 1}", "--yes", config=sim.config_path, timeout=180
        )
        took = time.monotonic() - started
        output = result.stdout + result.stderr
        assert result.returncode in (0, 1) and "Traceback" not in output, (pages, output[-3000:])
        assert took < 90, (pages, took)
        if result.returncode == 1:
            assert "No space left on device" in " ".join(output.split()), (pages, output[-2000:])
        outcomes.append((pages, result.returncode, pid_of(sim.sim_dir) == before_pid))
        filler.unlink()  # space again: whatever happened is finished or undone, and the copies agree
        assert cli("recover", config=sim.config_path, timeout=120).returncode == 0
        assert remote.read_text() == (local_dir / "sglang.service").read_text()
        assert remote.read_text() == (state / "known-good.service").read_text()
        assert not (state / "journal.json").exists() and healthy(sim.target.endpoint)
        if result.returncode == 1:
            assert _flag(remote) == before_flag, pages  # refused or rolled back: known-good stays
    print("full-disk outcomes (free pages, exit code, server not restarted):", outcomes)
    assert outcomes[0][1] == 1 and outcomes[0][2], outcomes  # a full disk is refused before any restart
    assert outcomes[-1][1] == 0, outcomes  # and with room enough it deploys


BROKEN_SERVER = textwrap.dedent(
    """
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def do_POST(self):
            if sys.argv[3] == "error":
                self.send_response(500); self.end_headers(); self.wfile.write(b"CUDA error: illegal memory access")
            else:
                body = json.dumps({"meta_info": {}}).encode()
                self.send_response(200); self.end_headers(); self.wfile.write(body)
        def log_message(self, *args):
            pass

    HTTPServer(("127.0.0.1", int(sys.argv[2])), Handler).serve_forever()
    """
)


@pytest.mark.parametrize("mode", ["error", "no-text"])
def test_health_200_but_generation_failing_is_rolled_back(ssh_sim, tmp_path: Path, mode: str) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    server = tmp_path / "broken_server.py"
    server.write_text(BROKEN_SERVER)
    remote = Path(sim.target.remote_unit)
    known_good = remote.read_text()
    port = sim.target.endpoint.rsplit(":", 1)[1]
    lines = [
        f"ExecStart={sys.executable} {server} --port {port} {mode}" if line.startswith("ExecStart=") else line
        for line in known_good.replace("\\\n", " ").splitlines()
    ]
    candidate = "\n".join(lines) + "\n"

    async def scenario():  # type: ignore[no-untyped-def]
        async with Deployment(sim.target) as d:
            return await d.deploy(candidate)

    started = time.monotonic()
    outcome = asyncio.run(scenario())
    took = time.monotonic() - started
    assert not outcome.ok and outcome.rolled_back and outcome.restored, outcome.error
    why = "generation returned HTTP 500" if mode == "error" else "generation returned no text"
    assert why in outcome.error, outcome.error
    assert took < sim.target.health_timeout_s + 40, took  # the health timeout, then the rollback
    assert remote.read_text() == known_good and healthy(sim.target.endpoint)


def test_two_optagents_on_one_target_at_once(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    remote = Path(sim.target.remote_unit)
    procs = [
        subprocess.Popen(
            [
                OPTAGENT,
                "deploy",
                "--set",
                f"mem-fraction-static={v}",
                "--yes",
                "--config",
                str(sim.config_path),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        for v in ("0.81", "0.82")
    ]
    results = [(p.wait(180), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    texts = [" ".join((out + err).split()) for _, out, err in results]
    assert "Traceback" not in " ".join(texts)
    if codes == [0, 1]:  # at the same time: one deploys, the other is told who holds the target
        loser = texts[[code for code, _, _ in results].index(1)]
        assert "locked by another optagent" in loser, loser
    else:  # one finished before the other took the lock: both deployed, one after the other
        assert codes == [0, 0], texts
    assert _flag(remote) in ("0.81", "0.82") and healthy(sim.target.endpoint)
    assert remote.read_text() == Path(sim.target.local_unit).read_text()
    assert not (sim.sim_dir / "run" / "sglang.lock").exists()
