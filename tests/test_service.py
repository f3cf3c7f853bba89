"""Service managers: the process manager runs a real server; systemd's exact commands are recorded."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from tests.fixtures.sim import free_port
from tools.deploy.deadman import DeadmanSwitch
from tools.deploy.health import wait_healthy
from tools.deploy.remote import LocalTransport
from tools.deploy.service import ProcessManager, SystemdManager

SERVER = textwrap.dedent(
    """\
    import http.server, json, os, sys, time
    port = int(sys.argv[sys.argv.index("--port") + 1])
    if "--exit-now" in sys.argv:
        print("fatal: bad flag --exit-now", flush=True); sys.exit(3)
    time.sleep(float(os.environ.get("DELAY", "0.1")))
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def do_POST(self):
            self.rfile.read(int(self.headers.get("content-length", 0)))
            body = json.dumps({"text": "x", "argv": sys.argv[1:], "env": os.environ.get("GREETING")}).encode()
            self.send_response(200); self.send_header("content-type", "application/json"); self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a): pass
    print("serving", sys.argv[1:], flush=True)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def write_unit(path: Path, port: int, *extra: str) -> None:
    server = path.parent / "server.py"
    server.write_text(SERVER)
    words = " ".join(shlex.quote(w) for w in extra)
    path.write_text(
        "[Service]\n"
        'Environment="GREETING=hello world; $(id)" DELAY=0.1\n'
        f"ExecStart={sys.executable} {server} --port {port} --name 'a b' {words}\n"
    )


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_process_manager_starts_detached_and_stops(tmp_path: Path) -> None:
    port = free_port()
    unit = tmp_path / "sglang.service"
    write_unit(unit, port)
    pm = ProcessManager(LocalTransport(), unit_path=str(unit), run_dir=str(tmp_path / "run"), grace_s=2)

    async def scenario() -> None:
        pid = await pm.start()
        start = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
        assert (tmp_path / "run" / "sglang.pid").read_text().split() == [str(pid), start]
        assert os.getpgid(pid) == pid and os.getsid(pid) == pid  # its own session and process group
        health = await wait_healthy(f"http://127.0.0.1:{port}", timeout=10, is_alive=pm.is_active)
        assert health.ok, health.reason
        r = httpx.post(f"http://127.0.0.1:{port}/generate", json={})
        assert r.json()["argv"] == ["--port", str(port), "--name", "a b"]
        assert r.json()["env"] == "hello world; $(id)"
        assert await pm.config_matches() is True
        write_unit(unit, port, "--changed")
        assert await pm.config_matches() is False
        await pm.stop()
        assert not await pm.is_active()
        assert not (tmp_path / "run" / "sglang.pid").exists()
        assert "serving" in await pm.logs()

    run(scenario())


def test_wait_healthy_bails_out_when_the_process_dies(tmp_path: Path) -> None:
    port = free_port()
    unit = tmp_path / "sglang.service"
    write_unit(unit, port, "--exit-now")
    pm = ProcessManager(LocalTransport(), unit_path=str(unit), run_dir=str(tmp_path / "run"))
    phases: list[str] = []

    async def scenario() -> None:
        await pm.start()
        health = await wait_healthy(
            f"http://127.0.0.1:{port}",
            timeout=30,
            is_alive=pm.is_active,
            on_progress=lambda e, t, p: phases.append(p),
        )
        assert not health.ok and "exited" in health.reason
        assert health.seconds < 30
        assert "fatal: bad flag --exit-now" in await pm.logs()

    run(scenario())
    assert phases and phases[0] == "health"


@pytest.fixture
def recording_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`systemctl`, `journalctl`, `systemd-run` and `sudo` stand-ins first on PATH; each records its argv."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir()
    for name in ("systemctl", "journalctl", "systemd-run", "sudo"):
        script = bin_dir / name
        script.write_text(
            f"#!{sys.executable}\n"
            "import json, os, sys\n"
            f"open({str(log)!r}, 'a').write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + '\\n')\n"
            "if sys.argv[1:3] == ['show', '-p'] and 'ActiveState' in sys.argv: print('active'); print('running')\n"
            "if 'MainPID' in sys.argv: print('NeedDaemonReload=no'); print('MainPID=' + os.environ.get('FAKE_MAINPID', '0'))\n"
            "if os.path.basename(sys.argv[0]) == 'journalctl': print('line 1'); print('line 2')\n"
        )
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_systemd_manager_runs_exactly_these_commands(recording_path: Path) -> None:
    sm = SystemdManager(LocalTransport(), service="sglang-qwen")

    async def scenario() -> None:
        await sm.reload()
        await sm.restart()
        assert await sm.is_active()
        assert await sm.config_matches() is None  # no unit path: nothing to compare, never "yes"
        assert await sm.logs(5) == "line 1\nline 2\n"
        await sm.stop()

    run(scenario())
    assert calls(recording_path) == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "restart", "sglang-qwen.service"],
        ["systemctl", "show", "-p", "ActiveState", "-p", "SubState", "--value", "sglang-qwen.service"],
        ["systemctl", "show", "-p", "NeedDaemonReload", "-p", "MainPID", "sglang-qwen.service"],
        ["journalctl", "-u", "sglang-qwen.service", "-n", "5", "--no-pager", "-o", "cat"],
        ["systemctl", "stop", "sglang-qwen.service"],
    ]


def test_systemd_config_matches_compares_the_main_process_with_the_unit_file(
    recording_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reloaded but never restarted: systemd has no NeedDaemonReload, yet the process runs the old line.
    systemd gives the process the ExecStart= words as written: argv[0] is the program's path."""
    unit = tmp_path / "sglang.service"
    unit.write_text("[Service]\nEnvironment=MARK=one\nExecStart=/bin/sleep 300\n")
    main = subprocess.Popen(["/bin/sleep", "300"], env={**os.environ, "MARK": "one"})
    try:
        monkeypatch.setenv("FAKE_MAINPID", str(main.pid))
        sm = SystemdManager(LocalTransport(), service="sglang", unit_path=str(unit))
        assert run(sm.config_matches()) is True
        unit.write_text("[Service]\nEnvironment=MARK=one\nExecStart=/bin/sleep 301\n")
        assert run(sm.config_matches()) is False
        unit.write_text("[Service]\nEnvironment=MARK=two\nExecStart=/bin/sleep 300\n")
        assert run(sm.config_matches()) is False
        unit.write_text("[Service]\nEnvironment=MARK=one\nExecStart=/usr/local/bin/sleep 300\n")
        check = run(sm.config_check())  # only the program's path differs (issue 52, item 2a)
        assert check.matches is False and "/usr/local/bin/sleep" in check.why, check
    finally:
        main.kill()
        main.wait()


def test_systemd_manager_with_sudo_and_its_deadman_timer(recording_path: Path, tmp_path: Path) -> None:
    sm = SystemdManager(LocalTransport(), service="sglang", sudo=True)
    unit = tmp_path / "sglang.service"
    unit.write_text("[Service]\nExecStart=/bin/true\n")
    switch = DeadmanSwitch(LocalTransport(), sm, run_dir=str(tmp_path), unit_path=str(unit), service="sglang")

    async def scenario() -> None:
        await sm.restart()
        await switch.arm("[Service]\nExecStart=/bin/known-good\n", 90)
        assert await switch.is_armed()
        assert await switch.disarm() is True
        assert not await switch.is_armed()

    run(scenario())
    recorded = calls(recording_path)
    assert recorded[0] == ["sudo", "-n", "systemctl", "restart", "sglang.service"]
    assert recorded[1] == ["sudo", "-n", "systemctl", "stop", "optagent-deadman-sglang.timer"]
    run_cmd = recorded[2]
    assert run_cmd[:6] == ["sudo", "-n", "systemd-run", "--unit=optagent-deadman-sglang", "--on-active=90",
                           "--timer-property=AccuracySec=1s"]  # fmt: skip
    assert run_cmd[6:8] == ["/bin/sh", "-c"]
    assert "systemctl daemon-reload && systemctl restart sglang.service" in run_cmd[8]
    assert recorded[3] == ["sudo", "-n", "systemctl", "stop", "optagent-deadman-sglang.timer"]
    assert (tmp_path / "sglang.known-good").read_text() == "[Service]\nExecStart=/bin/known-good\n"
