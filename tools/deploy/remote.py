"""Reaching the host: run commands and read/write files locally or over SSH, with timeouts.

Every call is async. `LocalTransport` runs subprocesses on this machine; `SSHTransport` (in
`tools.deploy.ssh`, imported lazily because asyncssh is heavy) runs them on a remote host.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.deploy.transport import (
    DEFAULT_TIMEOUT_S,
    CommandError,
    CommandResult,
    CommandTimeout,
    Transport,
    TransportError,
    brief,
    check_result,
)
from tools.localfiles import write_text

if TYPE_CHECKING:
    from tools.config import TargetConfig

__all__ = [
    "CommandError",
    "CommandResult",
    "CommandTimeout",
    "LocalTransport",
    "Transport",
    "TransportError",
    "make_transport",
]


class LocalTransport:
    """Runs commands on this machine with subprocesses; paths are local paths."""

    description = "local"

    def __init__(self, *, command_timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.command_timeout_s = command_timeout_s

    async def run(
        self, argv: list[str], *, timeout: float | None = None, check: bool = False, input: str | None = None
    ) -> CommandResult:
        """Run `argv` in its own process group; on timeout the whole group is killed."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as e:
            return check_result(argv, CommandResult(127, "", f"{argv[0]}: {e}"), check)
        data = input.encode() if input is not None else None
        limit = timeout if timeout is not None else self.command_timeout_s
        try:
            out, err = await asyncio.wait_for(proc.communicate(data), limit)
        except (TimeoutError, asyncio.CancelledError) as e:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            if isinstance(e, asyncio.CancelledError):
                raise
            raise CommandTimeout(f"`{brief(argv)}` timed out after {limit:g}s") from None
        result = CommandResult(
            proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")
        )
        return check_result(argv, result, check)

    async def read_file(self, path: str) -> str:
        """Read a local file."""
        return Path(path).expanduser().read_text()

    async def read_tail(self, path: str, *, max_bytes: int) -> str:
        """The last `max_bytes` bytes of a local file (seeking from its end)."""
        with Path(path).expanduser().open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
            return f.read(max_bytes).decode(errors="replace")

    async def write_file_atomic(self, path: str, text: str) -> None:
        """Atomically replace a local file, keeping its mode and owner."""
        write_local_atomic(Path(path).expanduser(), text)

    async def exists(self, path: str) -> bool:
        """True if the local path exists."""
        return Path(path).expanduser().exists()

    async def close(self) -> None:
        """Nothing to release."""


def write_local_atomic(path: Path, text: str, *, mode: int | None = None) -> None:
    """Write `text` to `path` so that readers see the old or the new file, never a partial one, and
    never through a link planted at its name (`tools.localfiles.write_text`)."""
    write_text(path, text, mode=0o644 if mode is None else mode)


def make_transport(target: TargetConfig) -> Transport:
    """The transport a target's config asks for (the SSH one connects lazily, on first use)."""
    if target.transport == "local":
        return LocalTransport(command_timeout_s=target.command_timeout_s)
    from tools.deploy.ssh import SSHTransport

    return SSHTransport.from_target(target)


def __getattr__(name: str) -> Any:
    if name == "SSHTransport":  # imported on demand: asyncssh is slow to import
        from tools.deploy.ssh import SSHTransport

        return SSHTransport
    raise AttributeError(name)
