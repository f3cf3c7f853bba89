"""`SSHTransport`: commands and files on a remote host over one reused asyncssh connection.

Host keys are checked against known_hosts (an unknown or changed key is refused); turning the check
off is an explicit option that logs a loud warning. Keys or the agent authenticate; the agent is
never forwarded. Connecting is retried with tenacity (bounded, each retry logged); a command that
was sent is never retried, because it may have run.

Commands run in one long-lived `sh` on the host, one at a time: a new SSH session per command costs
a login-shell start (often 100 ms with a busy `.bashrc`), a line to the open shell about 1 ms. Each
command runs in a subshell with stdin from /dev/null, and its output ends at a random marker line.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import posixpath
import shlex
import socket
import uuid
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.utils import CryptographyDeprecationWarning

# asyncssh still names cryptography's DSA types, which cryptography deprecates: a note for asyncssh's
# maintainers that every `optagent status` would print. Only that category, only from asyncssh.
warnings.filterwarnings("ignore", category=CryptographyDeprecationWarning, module=r"asyncssh(\.|$)")

import asyncssh  # noqa: E402
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential  # noqa: E402

from tools.deploy.transport import (  # noqa: E402
    DEFAULT_TIMEOUT_S,
    CommandResult,
    CommandTimeout,
    TransportError,
    brief,
    check_result,
)

if TYPE_CHECKING:
    from tools.config import TargetConfig

log = logging.getLogger(__name__)
_FATAL = (asyncssh.HostKeyNotVerifiable, asyncssh.PermissionDenied, asyncssh.KeyImportError)


def _retryable(exc: BaseException) -> bool:
    return not isinstance(exc, _FATAL) and isinstance(exc, OSError | asyncssh.Error | TimeoutError)


def _log_retry(state: Any) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning("SSH connection attempt %d failed (%s); retrying", state.attempt_number, exc)


def _sftp_path(path: str) -> str:
    # SFTP paths are relative to the login directory already; `~/` would be taken literally.
    return path[2:] if path.startswith("~/") else path


async def _read_through(stream: asyncssh.SSHReader[bytes], marker: bytes) -> tuple[bytes, bytes]:
    """Read up to `marker` and the rest of its line: (the data before it, the rest of that line)."""
    buf = bytearray()
    while True:
        at = buf.find(marker)
        end = buf.find(b"\n", at + len(marker)) if at >= 0 else -1
        if end >= 0:
            return bytes(buf[:at]), bytes(buf[at + len(marker) : end])
        chunk = await stream.read(1 << 16)
        if not chunk:
            raise EOFError("the remote shell ended")
        buf += chunk


class SSHTransport:
    """Runs commands on `host` over SSH; every command has a timeout."""

    def __init__(
        self,
        host: str,
        *,
        port: int = 22,
        user: str | None = None,
        identity_file: str | None = None,
        known_hosts: str | None = "~/.ssh/known_hosts",
        insecure_no_host_key_check: bool = False,
        connect_timeout_s: float = 15.0,
        command_timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_attempts: int = 4,
    ) -> None:
        self.host, self.port, self.user = host, port, user
        self.identity_file, self.known_hosts = identity_file, known_hosts
        self.insecure = insecure_no_host_key_check
        self.connect_timeout_s, self.command_timeout_s = connect_timeout_s, command_timeout_s
        self.connect_attempts = connect_attempts
        self.description = f"ssh://{user + '@' if user else ''}{host}:{port}"
        self._conn: asyncssh.SSHClientConnection | None = None
        self._sftp: asyncssh.SFTPClient | None = None
        self._shell: asyncssh.SSHClientProcess[bytes] | None = None
        self._lock, self._shell_lock = asyncio.Lock(), asyncio.Lock()
        self._no_shell: str | None = None
        """Set once the host refused this account commands (SFTP only): said again, never retried."""

    @classmethod
    def from_target(cls, target: TargetConfig) -> SSHTransport:
        """An SSH transport configured from the `[target]` section."""
        return cls(
            target.host,
            port=target.ssh_port,
            user=target.user,
            identity_file=target.identity_file,
            known_hosts=target.known_hosts,
            insecure_no_host_key_check=target.insecure_no_host_key_check,
            connect_timeout_s=target.connect_timeout_s,
            command_timeout_s=target.command_timeout_s,
        )

    async def _connect_once(self) -> asyncssh.SSHClientConnection:
        options: dict[str, Any] = {
            "port": self.port,
            "agent_forwarding": False,
            "connect_timeout": self.connect_timeout_s,
            "keepalive_interval": 15,
        }
        if self.user:
            options["username"] = self.user
        if self.identity_file:
            options["client_keys"] = [str(Path(self.identity_file).expanduser())]
        if self.insecure:
            log.warning(
                "INSECURE: host key verification is OFF for %s (insecure_no_host_key_check = true); "
                "a machine in the middle could impersonate the host",
                self.description,
            )
            options["known_hosts"] = None
        else:
            path = Path(self.known_hosts or "~/.ssh/known_hosts").expanduser()
            if not path.exists():
                raise TransportError(f"known_hosts file {path} does not exist; cannot verify {self.host}")
            options["known_hosts"] = str(path)
        return await asyncssh.connect(self.host, **options)

    async def connection(self) -> asyncssh.SSHClientConnection:
        """The shared connection, opened (with bounded, logged retries) on first use."""
        async with self._lock:
            if self._conn is not None:
                return self._conn
            try:
                async for attempt in AsyncRetrying(
                    stop=stop_after_attempt(self.connect_attempts),
                    wait=wait_exponential(multiplier=0.2, max=3),
                    retry=retry_if_exception(_retryable),
                    before_sleep=_log_retry,
                    reraise=True,
                ):
                    with attempt:
                        self._conn = await self._connect_once()
            except asyncssh.HostKeyNotVerifiable as e:
                raise TransportError(
                    f"{self.description}: host key not verified against {self.known_hosts} ({e.reason}); "
                    "refusing to connect (unknown or changed host key): if the host was reinstalled, check "
                    "its key with its administrator, then update that file (`ssh-keygen -R`, `ssh-keyscan`)"
                ) from e
            except asyncssh.PermissionDenied as e:
                who = f"as {self.user}" if self.user else "as the local user name"
                key = f"the key {self.identity_file}" if self.identity_file else "your SSH keys or agent"
                raise TransportError(
                    f"{self.description}: authentication failed {who} with {key} ({e.reason}); check "
                    "`user` and `identity_file` in optagent.toml and that key in the host's authorized_keys"
                ) from e
            except (OSError, asyncssh.Error, TimeoutError) as e:
                raise TransportError(f"{self.description}: cannot connect: {self._why(e)}") from e
            assert self._conn is not None
            return self._conn

    def _why(self, e: BaseException) -> str:
        """Why connecting failed, and what to check, for an error that may carry no text at all."""
        text = str(e)
        if isinstance(e, TimeoutError):  # no TCP answer, or no SSH banner, in time
            return (
                f"no SSH answer within {self.connect_timeout_s:g} s (the host down or unreachable, a "
                f"firewall dropping port {self.port}, or sshd stopped or overloaded); check the host, "
                "`ssh_port` and `connect_timeout_s`"
            )
        if isinstance(e, ConnectionRefusedError) or "Connect call failed" in text or "refused" in text:
            return (
                f"connection refused on port {self.port}: no sshd listens there; check that sshd runs on "
                "the host and `ssh_port` in optagent.toml"
            )
        if isinstance(e, socket.gaierror):
            return f"the host name {self.host} does not resolve ({e.strerror}); check `host` in optagent.toml"
        if isinstance(e, OSError) and e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return f"{e.strerror}: check the address and this machine's network route to it"
        if isinstance(e, asyncssh.KeyImportError):
            return f"cannot read the key {self.identity_file}: {text}; check `identity_file`"
        if isinstance(e, asyncssh.Error):
            return (
                f"the host ended the SSH handshake ({e.reason or type(e).__name__}); its sshd log says why "
                "(MaxStartups, AllowUsers or DenyUsers, a firewall)"
            )
        return f"{type(e).__name__}: {text}" if text else type(e).__name__

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.abort()
        self._conn, self._sftp, self._shell = None, None, None

    async def run(
        self, argv: list[str], *, timeout: float | None = None, check: bool = False, input: str | None = None
    ) -> CommandResult:
        """Run `argv` on the host (each word quoted for the remote shell)."""
        conn = await self.connection()
        command = " ".join(shlex.quote(a) for a in argv)
        limit = timeout if timeout is not None else self.command_timeout_s
        try:
            if input is None and not self._shell_lock.locked():
                code, out, err = await asyncio.wait_for(self._run_in_shell(command), limit)
            else:  # stdin to pass, or the shell is busy with a concurrent command: a session of its own
                data = input.encode() if input is not None else None
                proc = await asyncio.wait_for(
                    conn.run(command, input=data, check=False, encoding=None), limit
                )
                code = proc.exit_status if proc.exit_status is not None else 255
                out, err = bytes(proc.stdout or b""), bytes(proc.stderr or b"")
        except TimeoutError:
            raise CommandTimeout(
                f"`{brief(argv)}` on {self.description} timed out after {limit:g}s"
            ) from None
        except (OSError, asyncssh.Error, EOFError) as e:
            self._drop()
            raise TransportError(
                f"{self.description}: connection lost running `{brief(argv)}`: {e or type(e).__name__}"
            ) from e
        if code < 0:  # killed by a signal
            code = 255
        result = CommandResult(code, out.decode(errors="replace"), err.decode(errors="replace"))
        return check_result(argv, result, check)

    async def _run_in_shell(self, command: str) -> tuple[int, bytes, bytes]:
        if self._no_shell is not None:
            raise TransportError(self._no_shell)
        async with self._shell_lock:
            try:
                if self._shell is None:
                    conn = await self.connection()
                    self._shell = await conn.create_process("exec sh", encoding=None)
                    try:
                        await self._exchange(self._shell, "true")  # the login shell's start-up output
                    # the shell ended at once (read to its end, or, sooner, closed before "true" was
                    # written: BrokenPipeError): is this account allowed commands at all?
                    except (EOFError, BrokenPipeError):
                        self._no_shell = await self._why_no_shell(conn)
                        if self._no_shell is not None:
                            raise TransportError(self._no_shell) from None
                        raise
                return await self._exchange(self._shell, command)
            except BaseException:
                # timed out, cancelled or lost: the shell's state is unknown, never reuse it
                if self._shell is not None:
                    self._shell.close()
                self._shell = None
                raise

    async def _why_no_shell(self, conn: asyncssh.SSHClientConnection) -> str | None:
        """Why this account cannot run commands (an SFTP-only account: `ForceCommand internal-sftp`),
        or None when a command does run and the shell ended for another reason."""
        marker = f"optagent-{uuid.uuid4().hex[:8]}"
        try:
            proc = await asyncio.wait_for(conn.run(f"echo {marker}", check=False), self.connect_timeout_s)
        except (OSError, asyncssh.Error, TimeoutError):
            return None
        out = f"{proc.stdout or ''}{proc.stderr or ''}"
        if marker in out:
            return None
        said = next((line.strip() for line in out.splitlines() if line.strip()), "")
        who = f"the account {self.user}" if self.user else "this account"
        return (
            f"{self.description}: {who} may use only SFTP, commands cannot run there"
            + (f" (the host said: {said[:200]})" if said else "")
            + "; optagent runs its launcher, systemctl and its lock as commands on the host: give the account a "
            "shell (remove `ForceCommand internal-sftp` from its sshd `Match` block) or use another account"
        )

    @staticmethod
    async def _exchange(shell: asyncssh.SSHClientProcess[bytes], command: str) -> tuple[int, bytes, bytes]:
        marker = f"\n{uuid.uuid4().hex} "
        shell.stdin.write(
            f"( {command}\n) </dev/null; printf '{marker}%d\\n' $?; printf '{marker}\\n' >&2\n".encode()
        )
        (out, status), (err, _) = await asyncio.gather(
            _read_through(shell.stdout, marker.encode()), _read_through(shell.stderr, marker.encode())
        )
        return int(status), out, err

    async def _sftp_client(self) -> asyncssh.SFTPClient:
        if self._sftp is None:
            conn = await self.connection()
            try:
                self._sftp = await asyncio.wait_for(conn.start_sftp_client(), self.command_timeout_s)
            except TimeoutError:
                raise TransportError(f"{self.description}: the SFTP session did not start in time") from None
            except (OSError, asyncssh.Error) as e:
                self._drop()
                raise TransportError(
                    f"{self.description}: cannot start an SFTP session ({e}); optagent reads and writes the "
                    "unit file over SFTP: enable sshd's `Subsystem sftp` (e.g. `Subsystem sftp internal-sftp`)"
                ) from e
        return self._sftp

    async def read_file(self, path: str) -> str:
        """Read a file on the host over SFTP."""
        sftp = await self._sftp_client()
        try:
            async with sftp.open(_sftp_path(path), "rb") as f:
                data = await asyncio.wait_for(f.read(), self.command_timeout_s)
        except asyncssh.SFTPNoSuchFile as e:
            raise FileNotFoundError(path) from e
        except (OSError, asyncssh.Error) as e:
            self._drop()
            raise TransportError(f"{self.description}: cannot read {path}: {e}") from e
        return bytes(data).decode()

    async def read_tail(self, path: str, *, max_bytes: int) -> str:
        """The last `max_bytes` bytes of a file on the host: SFTP seeks from its end, so a gigabyte of
        log costs what its tail does."""
        sftp = await self._sftp_client()
        try:
            async with sftp.open(_sftp_path(path), "rb") as f:
                size = (await f.stat()).size or 0
                await f.seek(max(0, size - max_bytes))
                data = await asyncio.wait_for(f.read(max_bytes), self.command_timeout_s)
        except asyncssh.SFTPNoSuchFile as e:
            raise FileNotFoundError(path) from e
        except (OSError, asyncssh.Error) as e:
            self._drop()
            raise TransportError(f"{self.description}: cannot read {path}: {e}") from e
        return bytes(data).decode(errors="replace")

    async def write_file_atomic(self, path: str, text: str) -> None:
        """Temp file in the destination directory, fsync, keep mode and owner, SFTP posix-rename."""
        sftp = await self._sftp_client()
        path = _sftp_path(path)
        directory, name = posixpath.split(path)
        tmp = posixpath.join(directory, f".{name}.{uuid.uuid4().hex[:12]}.optagent-tmp")
        try:
            attrs = await sftp.stat(path) if await sftp.exists(path) else None
            # "x": O_EXCL, so the temp file is new, never a planted link or someone else's file
            async with sftp.open(tmp, "xb", asyncssh.SFTPAttrs(permissions=0o600)) as f:
                await f.write(text.encode())
                await f.fsync()
            if attrs is not None:
                await sftp.chmod(tmp, attrs.permissions & 0o7777)
                try:
                    await sftp.chown(tmp, attrs.uid, attrs.gid)
                except asyncssh.SFTPError:
                    log.info("could not keep the owner of %s (not allowed); mode kept", path)
            else:
                await sftp.chmod(tmp, 0o644)
            await sftp.posix_rename(tmp, path)
        except (OSError, asyncssh.Error) as e:
            try:
                if await sftp.exists(tmp):
                    await sftp.remove(tmp)
            except (OSError, asyncssh.Error):
                self._drop()
            raise TransportError(f"{self.description}: cannot write {path}: {e}") from e

    async def exists(self, path: str) -> bool:
        """True if `path` exists on the host."""
        sftp = await self._sftp_client()
        try:
            return await sftp.exists(_sftp_path(path))
        except (OSError, asyncssh.Error) as e:
            self._drop()
            raise TransportError(f"{self.description}: cannot look for {path}: {e}") from e

    async def close(self) -> None:
        """Close the SFTP session and the connection (a connection already lost closes quietly)."""
        try:
            if self._sftp is not None:
                self._sftp.exit()
            if self._shell is not None:
                self._shell.close()
            if self._conn is not None:
                self._conn.close()
                await asyncio.wait_for(self._conn.wait_closed(), self.connect_timeout_s)
        except (OSError, asyncssh.Error, TimeoutError) as e:
            log.info("closing %s: %s", self.description, e)
        finally:
            self._conn, self._sftp, self._shell = None, None, None
