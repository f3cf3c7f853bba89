"""What every transport shares: the `Transport` protocol, command results and errors (below both
`remote` (local transport, the factory) and `ssh`)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

DEFAULT_TIMEOUT_S = 120.0


class TransportError(Exception):
    """The host could not be reached or a file operation on it failed."""


@dataclass(frozen=True)
class CommandResult:
    """What a command returned."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0."""
        return self.returncode == 0


def brief(argv: list[str]) -> str:
    """A command as messages show it: a `sh -c` script (often a kilobyte of shell) is named, never
    printed, and anything else is cut to 120 characters."""
    if len(argv) >= 3 and argv[1] == "-c" and posixpath.basename(argv[0]) in ("sh", "bash", "dash"):
        return f"{argv[0]} -c <a script of {len(argv[2]):,} characters>"
    text = " ".join(argv)
    return text if len(text) <= 120 else f"{text[:117]}..."


class CommandError(TransportError):
    """A command run with `check=True` exited non-zero."""

    def __init__(self, argv: list[str], result: CommandResult) -> None:
        tail = (result.stderr or result.stdout).strip()[-500:]
        super().__init__(f"`{brief(argv)}` exited with status {result.returncode}: {tail}")
        self.result = result


class CommandTimeout(TransportError):
    """A command did not finish within its timeout (it has been killed)."""


@runtime_checkable
class Transport(Protocol):
    """How optagent runs commands and moves files on the target host."""

    description: str

    async def run(
        self, argv: list[str], *, timeout: float | None = None, check: bool = False, input: str | None = None
    ) -> CommandResult:
        """Run `argv` (no shell unless argv says so); kill it after `timeout` seconds."""
        ...

    async def read_file(self, path: str) -> str:
        """The text of `path` on the host (`FileNotFoundError` if it does not exist)."""
        ...

    async def read_tail(self, path: str, *, max_bytes: int) -> str:
        """The last `max_bytes` bytes of `path` on the host, decoded leniently (`FileNotFoundError` if
        it does not exist): a log is read from its end, whatever its size."""
        ...

    async def write_file_atomic(self, path: str, text: str) -> None:
        """Replace `path` atomically: temp file in the same directory, fsync, rename; keep mode/owner."""
        ...

    async def exists(self, path: str) -> bool:
        """True if `path` exists on the host."""
        ...

    async def close(self) -> None:
        """Release the connection (idempotent)."""
        ...


def check_result(argv: list[str], result: CommandResult, check: bool) -> CommandResult:
    """`result`, or `CommandError` when `check` is set and the command failed."""
    if check and not result.ok:
        raise CommandError(argv, result)
    return result
