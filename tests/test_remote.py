"""Transports: local subprocesses and a real OpenSSH sshd on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.sim import free_port
from tools.deploy.remote import CommandError, CommandResult, CommandTimeout, LocalTransport, TransportError
from tools.deploy.ssh import SSHTransport


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def ssh(sshd, **overrides) -> SSHTransport:  # type: ignore[no-untyped-def]
    options = {
        "port": sshd.port,
        "user": sshd.user,
        "identity_file": str(sshd.identity_file),
        "known_hosts": str(sshd.known_hosts),
        "connect_timeout_s": 5.0,
        **overrides,
    }
    return SSHTransport(sshd.host, **options)


def test_local_transport_runs_checks_and_times_out(tmp_path: Path) -> None:
    t = LocalTransport()

    async def scenario() -> None:
        result = await t.run(["sh", "-c", 'printf "%s|" "$@"; echo err >&2', "sh", "a b", "$(id)"])
        assert (result.returncode, result.stdout, result.stderr) == (0, "a b|$(id)|", "err\n")
        assert (await t.run(["cat"], input="piped")).stdout == "piped"
        with pytest.raises(CommandError, match="status 3"):
            await t.run(["sh", "-c", "exit 3"], check=True)
        with pytest.raises(CommandTimeout):
            await t.run(["sleep", "5"], timeout=0.2)
        assert (await t.run(["/no/such/binary"])).returncode == 127

    run(scenario())


def test_local_atomic_write_keeps_mode(tmp_path: Path) -> None:
    path = tmp_path / "unit.service"
    path.write_text("old\n")
    path.chmod(0o640)
    run(LocalTransport().write_file_atomic(str(path), "new\n"))
    assert path.read_text() == "new\n"
    assert path.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["unit.service"]


def test_ssh_runs_commands_and_replaces_files_atomically(sshd, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "remote" / "sglang.service"
    target.parent.mkdir()
    target.write_text("old\n")
    target.chmod(0o600)
    t = ssh(sshd)

    async def scenario() -> None:
        result = await t.run(["printf", "%s|", "a b", "$(id)", "it's"])
        assert result.stdout == "a b|$(id)|it's|"
        first = t._conn
        assert (await t.run(["sh", "-c", "exit 4"])).returncode == 4
        assert t._conn is first  # one connection, reused
        await t.write_file_atomic(str(target), "new content\n")
        assert await t.read_file(str(target)) == "new content\n"
        with pytest.raises(FileNotFoundError):
            await t.read_file(str(tmp_path / "missing"))
        assert await t.exists(str(target)) and not await t.exists(str(tmp_path / "missing"))
        with pytest.raises(CommandTimeout):
            await t.run(["sleep", "5"], timeout=0.3)
        assert (await t.run(["echo", "still usable"])).stdout == "still usable\n"
        await t.close()

    run(scenario())
    assert target.read_text() == "new content\n"
    assert target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["sglang.service"]


def test_ssh_commands_share_one_shell_without_leaking_into_each_other(sshd, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Output framing, exit codes, stdin, `exit`/`cd`/variables, big outputs and concurrency on one shell."""
    t = ssh(sshd)
    big = 3 * 1024 * 1024  # more than asyncssh's 2 MiB receive window, on both streams at once

    async def scenario() -> None:
        assert (await t.run(["sh", "-c", "printf 'no newline'; printf 'e1\\ne2' >&2; exit 7"])) == (
            CommandResult(7, "no newline", "e1\ne2")
        )
        assert (await t.run(["printf", "\\n\\n"])).stdout == "\n\n"
        shell = t._shell
        assert shell is not None
        assert (await t.run(["cat"])).stdout == ""  # stdin is /dev/null, not the command stream
        assert (await t.run(["exit", "3"])).returncode == 3  # a builtin cannot end the shared shell
        await t.run(["cd", str(tmp_path)])
        await t.run(["export", "LEAK=1"])
        assert (await t.run(["sh", "-c", 'pwd; echo "[$LEAK]"'])).stdout != f"{tmp_path}\n[1]\n"
        assert (await t.run(["cat"], input="piped")).stdout == "piped"  # stdin goes to a session of its own
        script = f"head -c {big} /dev/zero | tr '\\0' o; head -c {big} /dev/zero | tr '\\0' e >&2"
        result = await t.run(["sh", "-c", script])
        assert (len(result.stdout), len(result.stderr)) == (big, big)
        assert set(result.stdout) == {"o"} and set(result.stderr) == {"e"}
        results = await asyncio.gather(*(t.run(["echo", str(i)]) for i in range(5)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(5)]
        assert t._shell is shell  # the same shell all along
        with pytest.raises(CommandTimeout):
            await t.run(["sleep", "5"], timeout=0.3)
        assert t._shell is None  # a shell in an unknown state is never reused
        assert (await t.run(["echo", "fresh"])).stdout == "fresh\n"
        await t.close()

    run(scenario())


def test_upload_is_never_partially_visible(sshd, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A reader polling the file while large uploads replace it only ever sees a whole version."""
    target = tmp_path / "big.service"
    versions = ["A" * 400_000 + "\n", "B" * 400_000 + "\n"]
    target.write_text(versions[0])
    reader = subprocess.Popen(
        ["sh", "-c", f'while :; do wc -c < "{target}"; done'], stdout=subprocess.PIPE, text=True
    )
    t = ssh(sshd)

    async def scenario() -> None:
        for i in range(6):
            await t.write_file_atomic(str(target), versions[i % 2])
        await t.close()

    try:
        run(scenario())
    finally:
        reader.terminate()
    sizes = {line.strip() for line in reader.communicate()[0].splitlines() if line.strip()}
    assert sizes == {"400001"}


def test_wrong_or_unknown_host_key_is_refused(sshd, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = tmp_path / "known_hosts_wrong"
    kind, key = other.with_suffix(".pub").read_text().split()[:2]
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {kind} {key}\n")
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    for known in (wrong, empty):
        with pytest.raises(TransportError, match="host key not verified"):
            run(ssh(sshd, known_hosts=str(known)).run(["true"]))
    with pytest.raises(TransportError, match="does not exist"):
        run(ssh(sshd, known_hosts=str(tmp_path / "absent")).run(["true"]))


def test_insecure_mode_is_explicit_and_loud(sshd, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    t = ssh(sshd, known_hosts=str(empty), insecure_no_host_key_check=True)

    async def scenario() -> str:
        try:
            return (await t.run(["echo", "ok"])).stdout
        finally:
            await t.close()

    with caplog.at_level(logging.WARNING):
        assert run(scenario()) == "ok\n"
    assert any("INSECURE" in r.getMessage() for r in caplog.records)


def test_connection_failures_are_retried_boundedly_and_logged(caplog: pytest.LogCaptureFixture, sshd) -> None:  # type: ignore[no-untyped-def]
    t = SSHTransport(
        "127.0.0.1",
        port=free_port(),
        known_hosts=str(sshd.known_hosts),
        connect_attempts=3,
        connect_timeout_s=1,
    )
    with caplog.at_level(logging.WARNING), pytest.raises(TransportError, match="cannot connect"):
        run(t.run(["true"]))
    retries = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 2


def test_agent_is_never_forwarded(sshd, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SSH_AUTH_SOCK", os.environ.get("SSH_AUTH_SOCK", "/nonexistent/agent.sock"))
    t = ssh(sshd)

    async def scenario() -> str:
        try:
            return (await t.run(["sh", "-c", 'echo "[${SSH_AUTH_SOCK:-}]"'])).stdout
        finally:
            await t.close()

    assert run(scenario()) == "[]\n"
