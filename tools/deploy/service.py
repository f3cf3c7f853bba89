"""Starting and stopping the server on the host: systemd, or optagent's own process manager.

`ProcessManager` is what the simulated host and many container setups use: it reads the unit
file's `ExecStart=` and `Environment=` through the transport and starts the command detached, in a
new session (it survives optagent exiting), with a PID file and a log file in `run_dir`.
"""

from __future__ import annotations

import shlex
import time
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from tools.deploy.remote import CommandResult, Transport, TransportError
from tools.deploy.running import (
    RunCheck,
    ServiceError,
    StartRecord,
    process_identity,
    running_check,
    unit_command,
)
from tools.deploy.serverlog import START_MARKER, log_file_tail

if TYPE_CHECKING:
    from tools.config import TargetConfig

__all__ = ["ProcessManager", "ServiceError", "ServiceManager", "SystemdManager", "make_service_manager"]


@runtime_checkable
class ServiceManager(Protocol):
    """Starts, stops and inspects the server's service on the host."""

    async def reload(self) -> None:
        """Make the manager re-read the unit file (systemd's daemon-reload)."""
        ...

    async def restart(self) -> None:
        """Stop the service if it runs, then start it with the unit file as it is now."""
        ...

    async def stop(self) -> None:
        """Stop the service (no error if it is not running)."""
        ...

    async def is_active(self) -> bool:
        """True while the service's process runs."""
        ...

    async def logs(self, lines: int = 50) -> str:
        """The last `lines` lines the service logged (since its last start where known)."""
        ...


def _q(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


class SystemdManager:
    """systemd on the host: `systemctl` and `journalctl`, optionally through `sudo -n`."""

    def __init__(
        self,
        transport: Transport,
        *,
        service: str,
        sudo: bool = False,
        timeout_s: float = 120.0,
        unit_path: str | None = None,
    ):
        self.transport, self.service, self.sudo, self.timeout_s = transport, service, sudo, timeout_s
        self.unit_path = unit_path
        self.unit = service if "." in service else f"{service}.service"

    async def _run(self, argv: list[str], *, check: bool = True) -> CommandResult:
        argv = ["sudo", "-n", *argv] if self.sudo else argv
        result = await self.transport.run(argv, timeout=self.timeout_s)
        if check and not result.ok:
            raise ServiceError(f"`{_q(argv)}` failed ({result.returncode}): {result.stderr.strip()[-400:]}")
        return result

    async def reload(self) -> None:
        """`systemctl daemon-reload`."""
        await self._run(["systemctl", "daemon-reload"])

    async def restart(self) -> None:
        """`systemctl restart UNIT` (its exit status says nothing about health)."""
        await self._run(["systemctl", "restart", self.unit])

    async def stop(self) -> None:
        """`systemctl stop UNIT`."""
        await self._run(["systemctl", "stop", self.unit])

    async def is_active(self) -> bool:
        """Active, activating or reloading, and not waiting to auto-restart after a crash."""
        argv = ["systemctl", "show", "-p", "ActiveState", "-p", "SubState", "--value", self.unit]
        result = await self._run(argv, check=False)
        states = result.stdout.split()
        return (
            result.ok
            and bool(states)
            and states[0] in ("active", "activating", "reloading")
            and ("auto-restart" not in states)
        )

    async def main_pid(self) -> int | None:
        """The service's main process (`MainPID`), None when it has none."""
        result = await self._run(["systemctl", "show", "-p", "MainPID", "--value", self.unit], check=False)
        pid = result.stdout.strip()
        return int(pid) if result.ok and pid.isdigit() and pid != "0" else None

    async def identity(self) -> str | None:
        """`PID STARTTIME` of the main process (for a `StartRecord`), None when it has none."""
        pid = await self.main_pid()
        return None if pid is None else await process_identity(self.transport, pid, sudo=self.sudo)

    async def config_check(self, *, started: StartRecord | None = None) -> RunCheck:
        """Whether the main process runs the unit file as it is now: not when the file changed on disk
        since systemd loaded it (`NeedDaemonReload`), else its whole command line and environment
        compared (`running.running_check`; `started` is optagent's record of its last restart)."""
        result = await self._run(
            ["systemctl", "show", "-p", "NeedDaemonReload", "-p", "MainPID", self.unit], check=False
        )
        if not result.ok:
            return RunCheck(None, f"systemctl show failed: {result.stderr.strip()[-200:]}")
        shown = dict(line.partition("=")[::2] for line in result.stdout.splitlines())
        if shown.get("NeedDaemonReload") == "yes":
            return RunCheck(False, "the unit file changed since systemd loaded it (no daemon-reload)")
        pid = shown.get("MainPID", "0")
        if self.unit_path is None:
            return RunCheck(None, "the unit file's path on the host is not known")
        if not pid.isdigit() or pid == "0":
            return RunCheck(None, f"{self.unit} has no main process")
        return await running_check(
            self.transport, int(pid), unit_path=self.unit_path, sudo=self.sudo, started=started
        )

    async def config_matches(self, *, started: StartRecord | None = None) -> bool | None:
        """`config_check(...).matches`."""
        return (await self.config_check(started=started)).matches

    async def logs(self, lines: int = 50) -> str:
        """`journalctl -u UNIT -n LINES --no-pager -o cat`."""
        argv = ["journalctl", "-u", self.unit, "-n", str(int(lines)), "--no-pager", "-o", "cat"]
        result = await self._run(argv, check=False)
        return result.stdout if result.ok else result.stderr


# Is any non-zombie process of group $p alive? /proc rather than `kill -0`: an unreaped zombie
# (no init reaping in a container) is not running.
_ALIVE_FN = (
    'alive() { cat /proc/[0-9]*/stat 2>/dev/null | awk -v g="$p" '
    '\'{ s = $0; sub(/.*\\) /, "", s); split(s, f, " "); if (f[1] != "Z" && f[3] == g) n++ } END { exit n == 0 }\'; };'
)

# The PID file holds "PID STARTTIME" (field 22 of /proc/PID/stat). A PID is signalled only while its
# process is the one optagent started (same start time), or, once that leader has exited, while its
# group still has members (the kernel gives no new process a PID that is still a group's id). A PID
# file of an older optagent ("PID" alone) counts only for a session leader, as every server it started was.
_OURS_FN = (
    'ours() { s=$(sed \'s/.*) //\' "/proc/$p/stat" 2>/dev/null); if [ -z "$s" ]; then alive; return; fi;'
    ' set -- $s; if [ -n "$st" ]; then [ "${20}" = "$st" ]; else [ "$4" = "$p" ]; fi; };'
)
_READ_PID = (
    'p=; st=; { read -r p st < "$PIDF"; } 2>/dev/null; case "$p" in ""|*[!0-9]*) p=;; esac;'
    ' case "$st" in *[!0-9]*) st=x;; esac;'
)

# The launcher runs under `setsid`: it writes its PID (= process group = session id) and start time to
# a new file (mktemp: O_EXCL, never through a planted link) renamed over the PID file, moves to the
# working directory and execs the server, so signals to the group reach every server process.
_LAUNCHER = (
    "st=$(sed 's/.*) //' /proc/$$/stat | cut -d ' ' -f 20) && t=$(mktemp \"$0.tmp.XXXXXX\") &&"
    ' echo "$$ $st" > "$t" && mv -f "$t" "$0" && cd "$1" && shift && exec "$@"'
)


class ProcessManager:
    """Runs the unit's `ExecStart` itself in a new session; PID file and log in `run_dir`."""

    def __init__(
        self,
        transport: Transport,
        *,
        unit_path: str,
        service: str = "sglang",
        run_dir: str,
        grace_s: float = 10.0,
        timeout_s: float = 60.0,
    ) -> None:
        self.transport, self.unit_path, self.service = transport, unit_path, service
        self.run_dir, self.grace_s, self.timeout_s = run_dir.rstrip("/") or "/", grace_s, timeout_s
        self.pid_path = f"{self.run_dir}/{service}.pid"
        self.log_path = f"{self.run_dir}/{service}.log"

    async def _sh(self, script: str, *args: str, timeout: float | None = None) -> CommandResult:
        return await self.transport.run(["sh", "-c", script, "sh", *args], timeout=timeout or self.timeout_s)

    async def reload(self) -> None:
        """Nothing to do: the unit file is read at every start."""

    async def command_for(self, text: str) -> tuple[list[str], dict[str, str], str]:
        """(argv, environment, working directory) that the unit text `text` asks for (`unit_command`)."""
        return await unit_command(self.transport, text, unit_path=self.unit_path)

    async def command(self) -> tuple[list[str], dict[str, str], str]:
        """(argv, environment, working directory) the unit file on the host asks for."""
        try:
            text = await self.transport.read_file(self.unit_path)
        except FileNotFoundError as e:
            raise ServiceError(f"{self.unit_path}: no such unit file on the host") from e
        return await self.command_for(text)

    def start_shell(self, argv: list[str], env: dict[str, str], cwd: str) -> str:
        """A shell command line that starts `argv` detached; every value quoted by `shlex.quote`."""
        q = shlex.quote
        marker = f"{START_MARKER}{time.strftime('%Y-%m-%dT%H:%M:%S')} ---"
        words = " ".join(q(w) for w in [*(f"{k}={v}" for k, v in env.items()), *argv])
        log, refuse = q(self.log_path), q(f"{self.log_path} is a symlink; refusing to write through it")
        return (
            f"mkdir -p {q(self.run_dir)} && rm -f {q(self.pid_path)} && {{ [ ! -L {log} ] || {{ echo {refuse} >&2;"
            f" false; }}; }} && (umask 077 && printf '%s\\n' {q(marker)} >> {log})"
            f" && {{ setsid sh -c {q(_LAUNCHER)} {q(self.pid_path)} {q(cwd)} env {words}"
            f" >> {log} 2>&1 < /dev/null & }}"
        )

    def pid_prelude(self) -> str:
        """Shell that sets `$p` (empty unless a number) and `$st` from the PID file and defines `alive`
        (the group has a live member) and `ours` (`$p` is the process optagent started)."""
        return f"PIDF={shlex.quote(self.pid_path)}; {_READ_PID} {_ALIVE_FN} {_OURS_FN}"

    def stop_shell(self) -> str:
        """A shell command line that stops the service: SIGTERM to its group, SIGKILL after the grace period.

        A PID whose process is not the one optagent started is never signalled: the file is stale."""
        ticks = max(1, int(self.grace_s * 20))
        return (
            f"{self.pid_prelude()}"
            f' if [ -n "$p" ] && [ "$p" -gt 1 ] && alive; then if ours; then kill -s TERM -- "-$p" 2>/dev/null; i=0;'
            f" while alive && [ $i -lt {ticks} ]; do sleep 0.05; i=$((i+1)); done;"
            f' if alive; then kill -s KILL -- "-$p" 2>/dev/null; i=0; while alive && [ $i -lt 100 ]; do sleep 0.05;'
            f' i=$((i+1)); done; fi; else echo "optagent: PID $p in $PIDF is not the process optagent started;'
            f' not signalled" >&2; fi; fi; rm -f "$PIDF"'
        )

    async def start(self) -> int:
        """Start the service detached; return its PID (also its process group and session id)."""
        argv, env, cwd = await self.command()
        q = shlex.quote
        wait_pid = (
            f"; i=0; while [ ! -s {q(self.pid_path)} ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done;"
            f" cat {q(self.pid_path)}"
        )
        result = await self.transport.run(
            ["sh", "-c", self.start_shell(argv, env, cwd) + wait_pid], timeout=self.timeout_s
        )
        words = result.stdout.split()
        if not result.ok or not words or not words[0].isdigit():
            raise ServiceError(
                f"could not start {self.service}: {(result.stderr or result.stdout).strip()[-400:]}"
            )
        return int(words[0])

    async def pid(self) -> int | None:
        """The PID of the server optagent started, or None (no PID file, or its process is another one)."""
        result = await self._sh(f'{self.pid_prelude()} [ -n "$p" ] && alive && ours && echo "$p"')
        text = result.stdout.strip()
        return int(text) if result.ok and text.isdigit() else None

    async def is_active(self) -> bool:
        """True while a non-zombie process of the group optagent started runs (one round trip)."""
        return (await self._sh(f'{self.pid_prelude()} [ -n "$p" ] && alive && ours')).ok

    async def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after the grace period; remove the PID file."""
        result = await self.transport.run(["sh", "-c", self.stop_shell()], timeout=self.grace_s + 30)
        if not result.ok:
            raise ServiceError(f"could not stop {self.service}: {result.stderr.strip()[-400:]}")

    async def identity(self) -> str | None:
        """`PID STARTTIME` of the server optagent started (for a `StartRecord`), None when none runs."""
        pid = await self.pid()
        return None if pid is None else await process_identity(self.transport, pid)

    async def config_check(self, *, started: StartRecord | None = None) -> RunCheck:
        """Whether the running process was started from the unit file as it is now (its whole command
        line and environment: `running.running_check`); unknown when none runs."""
        pid = await self.pid()
        if pid is None:
            return RunCheck(None, f"no process optagent started runs (no live PID in {self.pid_path})")
        return await running_check(self.transport, pid, unit_path=self.unit_path, started=started)

    async def config_matches(self, *, started: StartRecord | None = None) -> bool | None:
        """`config_check(...).matches`."""
        return (await self.config_check(started=started)).matches

    async def restart(self) -> None:
        """Stop, then start with the unit file as it is now; a file that does not parse stops nothing."""
        await self.command()  # raises UnitFileError/ServiceError while the old server still runs
        await self.stop()
        await self.start()

    async def logs(self, lines: int = 50) -> str:
        """The last `lines` lines of the log since the last start, read from its end (a gigabyte
        of log costs what its tail does: `tools.deploy.serverlog.log_file_tail`)."""
        try:
            return await log_file_tail(self.transport, self.log_path, lines=lines)
        except TransportError:
            return ""


def make_service_manager(target: TargetConfig, transport: Transport) -> ServiceManager:
    """The service manager a target's config asks for."""
    if target.service_manager == "systemd":
        return SystemdManager(
            transport,
            service=target.service,
            sudo=target.sudo,
            timeout_s=target.command_timeout_s,
            unit_path=target.remote_unit,
        )
    return ProcessManager(
        transport,
        unit_path=target.remote_unit,
        service=target.service,
        run_dir=target.run_dir,
        timeout_s=60.0,
    )
