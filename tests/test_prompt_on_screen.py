"""A question stays on the screen while it waits: `optagent deploy` on a real terminal (a pty)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

OPTAGENT = [sys.executable, "-c", "from agent.cli.main import app; app()"]
PROMPT = b"Deploy this change? [y/N]:"


def _read(fd: int, seconds: float) -> bytes:
    """What the terminal receives within `seconds`."""
    out, end = b"", time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    return out


def test_the_deploy_question_is_not_drawn_over(ssh_sim) -> None:  # type: ignore[no-untyped-def]
    sim = ssh_sim()
    pid = (Path(sim.sim_dir) / "run" / "sglang.pid").read_text().split()[0]
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [*OPTAGENT, "deploy", "--set", "mem-fraction-static=0.8", "--config", str(sim.config_path)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "COLUMNS": "100", "TERM": "xterm-256color"},
        close_fds=True,
    )
    os.close(slave)
    try:
        seen = b""
        deadline = time.monotonic() + 60
        while PROMPT not in seen and time.monotonic() < deadline and proc.poll() is None:
            seen += _read(master, 0.5)
        assert PROMPT in seen, seen.decode(errors="replace")
        assert b"mem-fraction-static" in seen  # the diff is shown above the question
        # while the question waits nothing is drawn: no bar redraws over it, no line clearing
        later = _read(master, 2.5)
        assert later == b"", later
        os.write(master, b"n\r")
        rest = _read(master, 10)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert proc.returncode == 1, rest.decode(errors="replace")
    assert b"not confirmed" in rest
    # declining changed nothing: the same server process serves
    assert (Path(sim.sim_dir) / "run" / "sglang.pid").read_text().split()[0] == pid
