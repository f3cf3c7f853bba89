"""The lock on the target host: one optagent at a time changes a service.

The lock is a file created atomically with `ln` (fails if it exists) holding its owner's host, PID
and process start time. A lock whose owner ran on this machine and is gone is stale and is broken
safely: renamed to a unique name, checked to be the one examined, and restored if it was not.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass

from tools.deploy.remote import Transport

__all__ = ["HostLock", "LockedError", "LockOwner", "process_start_time"]


class LockedError(Exception):
    """Another optagent holds the target's lock."""


def process_start_time(pid: int) -> str | None:
    """The start time of a local process (from /proc), or None if it does not run."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


@dataclass(frozen=True)
class LockOwner:
    """Who holds a lock."""

    host: str
    pid: int
    start: str | None
    token: str
    since: float
    command: str = ""

    def alive(self) -> bool | None:
        """True/False for an owner on this machine; None when it ran elsewhere (cannot tell)."""
        if self.host != socket.gethostname():
            return None
        return process_start_time(self.pid) == self.start and self.start is not None

    def describe(self) -> str:
        """One line for messages."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on {self.host} since {when}" + (f" ({self.command})" if self.command else "")


_CREATE = 'set -C; (umask 077 && printf "%s" "$1" > "$2") && ln "$2" "$3"; rc=$?; rm -f "$2"; exit $rc'
"""`set -C`: the temp file is created with O_EXCL, never written through a link planted at its name."""
_BREAK = 'mv -f "$1" "$2" && cat "$2"'
_RESTORE = 'ln "$1" "$2" 2>/dev/null; rm -f "$1"'
_READ = '[ -e "$1" ] || exit 3; head -c 65536 "$1"'
_RELEASE = 'grep -qF -- "$1" "$2" 2>/dev/null && rm -f "$2"; exit 0'


class HostLock:
    """`<run_dir>/<service>.lock` on the host."""

    def __init__(self, transport: Transport, path: str, *, command: str = "") -> None:
        self.transport, self.path, self.command = transport, path, command
        self.owner: LockOwner | None = None

    async def holder(self) -> LockOwner | None:
        """The current owner, or None if the lock is free (a shell command: no SFTP needed)."""
        result = await self.transport.run(["sh", "-c", _READ, "sh", self.path])
        if result.returncode == 3:
            return None
        return _parse(result.stdout if result.ok else "")

    async def acquire(self) -> LockOwner:
        """Take the lock, breaking it if its owner is a dead process on this machine."""
        me = LockOwner(
            socket.gethostname(),
            os.getpid(),
            process_start_time(os.getpid()),
            uuid.uuid4().hex,
            time.time(),
            self.command,
        )
        text = json.dumps(me.__dict__)
        for _ in range(3):
            tmp = f"{self.path}.{me.token}.tmp"
            created = await self.transport.run(["sh", "-c", _CREATE, "sh", text, tmp, self.path])
            if created.ok:
                self.owner = me
                return me
            owner = await self.holder()
            if owner is None:
                directory = tmp.rsplit("/", 1)[0] or "/"
                if not (await self.transport.run(["test", "-d", directory])).ok or _denied(created.stderr):
                    raise LockedError(f"cannot create the lock {self.path}: {created.stderr.strip()[-300:]}")
                continue  # released in between
            alive = owner.alive()
            if alive is None:
                raise LockedError(
                    f"the target is locked by another optagent ({owner.describe()}): wait for it to "
                    f"finish and run this again; if that optagent is gone, remove {self.path}"
                )
            if alive:
                raise LockedError(
                    f"the target is locked by another optagent ({owner.describe()}): wait for it to "
                    "finish, or stop it (Ctrl-C rolls its change back), then run this again"
                )
            await self._break(owner)
        raise LockedError(f"could not take the lock {self.path} (it keeps changing hands)")

    async def _break(self, stale: LockOwner) -> None:
        aside = f"{self.path}.stale-{uuid.uuid4().hex[:8]}"
        result = await self.transport.run(["sh", "-c", _BREAK, "sh", self.path, aside])
        if not result.ok:
            return  # someone else broke or released it first
        taken = _parse(result.stdout)
        if taken is not None and taken.token != stale.token:
            await self.transport.run(
                ["sh", "-c", _RESTORE, "sh", aside, self.path]
            )  # a live lock: put it back
            return
        await self.transport.run(["rm", "-f", aside])

    async def release(self) -> None:
        """Release the lock if this process holds it."""
        if self.owner is None:
            return
        token = f'"token": "{self.owner.token}"'  # in one shell command: works without SFTP
        await self.transport.run(["sh", "-c", _RELEASE, "sh", token, self.path])
        self.owner = None


def _denied(stderr: str) -> bool:
    """True when the shell could not write the lock at all (not a lost race with another optagent)."""
    return any(
        m in stderr
        for m in ("Permission denied", "Read-only file system", "Operation not permitted", "No space")
    )


def _parse(text: str) -> LockOwner | None:
    try:
        data = json.loads(text)
        return LockOwner(**data)
    except (ValueError, TypeError, RecursionError):
        # Unreadable content: treat as held by an unknown process on an unknown host.
        return LockOwner("unknown", -1, None, "unreadable", 0.0)
