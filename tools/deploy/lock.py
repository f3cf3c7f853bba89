"""The lock on the target host: one optagent at a time changes a service.

The lock is a file created atomically with `ln` (fails if it exists) holding who took it: host
name, PID and process start time, and the identity of the PID space that PID belongs to (the
kernel's boot id, the machine id, the PID namespace's inode from /proc/self/ns/pid). Its holder
renews a lease while it works: every `lease_s / 3` seconds it touches the file, so the file's
modification time, read with the host's own clock, says when the holder was last seen.

A lock is broken only when its holder is provably gone: it was taken in this very PID namespace
(same boot, machine and namespace, and a /proc that shows this process as itself) and /proc has no
process with its PID and start time. A holder in another container, on another machine or from
before a reboot cannot be looked up from here, whatever its host name says: such a lock is never
broken. Optagent refuses, saying who holds it, since when, when its lease was last renewed, and
how to remove it by hand once it is known to be gone. A stale lock is broken safely: renamed to a
unique name, checked to be the one examined, and restored if it was not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass

from tools.deploy.remote import Transport

__all__ = ["LEASE_S", "HostLock", "LockOwner", "LockedError", "pid_space", "process_start_time"]

log = logging.getLogger(__name__)

LEASE_S = 30.0
"""How long one renewal of the lease is good for; the holder renews three times as often."""


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


def _first_line(path: str) -> str:
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return ""


def pid_space() -> dict[str, str]:
    """Where this process's PIDs mean something: boot id, machine id and PID namespace ('' where
    unreadable). The namespace is '' too when /proc is not this namespace's own (a /proc mounted
    from outside a container would show other processes under the same numbers)."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
        own_proc = os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        namespace, own_proc = "", False
    return {
        "boot_id": _first_line("/proc/sys/kernel/random/boot_id"),
        "machine_id": _first_line("/etc/machine-id"),
        "pid_ns": namespace if own_proc else "",
    }


@dataclass(frozen=True)
class LockOwner:
    """Who holds a lock (as written in the lock file)."""

    host: str
    pid: int
    start: str | None
    token: str
    since: float
    command: str = ""
    boot_id: str = ""
    machine_id: str = ""
    pid_ns: str = ""
    lease_s: float = 0.0
    """How long one renewal is good for; 0: written by an optagent that renews no lease."""

    def where(self) -> str:
        """Whether this process can look the owner's PID up here, or why not ('': it can)."""
        mine = pid_space()
        if not (self.boot_id and self.pid_ns):
            return "it recorded no PID namespace (an older optagent, or /proc unreadable there)"
        if not mine["pid_ns"]:
            return "this machine's /proc cannot tell this process's PID namespace"
        if self.boot_id != mine["boot_id"]:
            if self.machine_id and self.machine_id == mine["machine_id"]:
                return "it ran before a reboot, or on another machine with the same machine id"
            return "it runs on another machine"
        if self.pid_ns != mine["pid_ns"] or self.machine_id != mine["machine_id"]:
            return "it runs in another PID namespace on this machine (another container?)"
        return ""

    def alive(self) -> bool | None:
        """True/False for an owner in this very PID namespace; None when its PID cannot be looked
        up from here (another machine, boot or PID namespace): then it may well be running."""
        if self.where():
            return None
        return process_start_time(self.pid) == self.start and self.start is not None

    def describe(self) -> str:
        """One line for messages."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on {self.host} since {when}" + (f" ({self.command})" if self.command else "")


@dataclass(frozen=True)
class LockState:
    """A lock as read on the host: its owner and how long ago (host clock) it was last renewed."""

    owner: LockOwner
    renewed_ago: float | None = None


_CREATE = 'set -C; (umask 077 && printf "%s" "$1" > "$2") && ln "$2" "$3"; rc=$?; rm -f "$2"; exit $rc'
"""`set -C`: the temp file is created with O_EXCL, never written through a link planted at its name."""
_BREAK = 'mv -f "$1" "$2" && cat "$2"'
_RESTORE = 'ln "$1" "$2" 2>/dev/null; rm -f "$1"'
_READ = (
    '[ -e "$1" ] || exit 3; m=$(stat -c %Y -- "$1" 2>/dev/null) || exit 3; '
    'echo "$m $(date +%s)"; head -c 65536 -- "$1" || exit 3'
)
"""The lock's modification time and the host's clock (one line), then its content; exit 3: no lock."""
_RENEW = 'grep -qF -- "$1" "$2" 2>/dev/null || exit 3; touch -c -- "$2"'
_RELEASE = 'grep -qF -- "$1" "$2" 2>/dev/null && rm -f "$2"; exit 0'


class HostLock:
    """`<run_dir>/<service>.lock` on the host."""

    def __init__(
        self, transport: Transport, path: str, *, command: str = "", lease_s: float = LEASE_S
    ) -> None:
        self.transport, self.path, self.command, self.lease_s = transport, path, command, lease_s
        self.owner: LockOwner | None = None
        self.lost = False
        """True once a renewal found the lock gone or someone else's: this process no longer holds it."""
        self._renewing: asyncio.Task[None] | None = None

    async def state(self) -> LockState | None:
        """The lock as it is on the host, or None if it is free (a shell command: no SFTP needed)."""
        result = await self.transport.run(["sh", "-c", _READ, "sh", self.path])
        if result.returncode == 3:
            return None
        head, _, body = result.stdout.partition("\n") if result.ok else ("", "", "")
        try:
            mtime, now = (float(x) for x in head.split())
            ago: float | None = max(0.0, now - mtime)
        except ValueError:
            ago = None
        return LockState(_parse(body), ago)

    async def holder(self) -> LockOwner | None:
        """The current owner, or None if the lock is free."""
        state = await self.state()
        return None if state is None else state.owner

    async def acquire(self) -> LockOwner:
        """Take the lock, breaking it only if its owner is provably a dead process (module docstring);
        then renew its lease in the background until `release()`."""
        me = LockOwner(
            socket.gethostname(),
            os.getpid(),
            process_start_time(os.getpid()),
            uuid.uuid4().hex,
            time.time(),
            self.command,
            **pid_space(),
            lease_s=self.lease_s,
        )
        text = json.dumps(asdict(me))
        for _ in range(3):
            tmp = f"{self.path}.{me.token}.tmp"
            created = await self.transport.run(["sh", "-c", _CREATE, "sh", text, tmp, self.path])
            if created.ok:
                self.owner, self.lost = me, False
                self._renewing = asyncio.create_task(self._renew())
                return me
            state = await self.state()
            if state is None:
                directory = tmp.rsplit("/", 1)[0] or "/"
                if not (await self.transport.run(["test", "-d", directory])).ok or _denied(created.stderr):
                    raise LockedError(f"cannot create the lock {self.path}: {created.stderr.strip()[-300:]}")
                continue  # released in between
            alive = state.owner.alive()
            if alive is None:
                raise LockedError(self._uncertain(state))
            if alive:
                raise LockedError(
                    f"the target is locked by another optagent ({state.owner.describe()}): "
                    "wait for it to finish, or stop it (Ctrl-C rolls its change back), then run this again"
                )
            await self._break(state.owner)
        raise LockedError(f"could not take the lock {self.path} (it keeps changing hands)")

    def _uncertain(self, state: LockState) -> str:
        """Why a lock whose holder cannot be seen from here is not broken, and how to break it by hand."""
        owner = state.owner
        if owner.token == "unreadable":
            return (
                f"the target's lock {self.path} cannot be read as optagent's; if no optagent is working on "
                f"this target, remove it by hand on the host (`rm {self.path}`), then run this again"
            )
        ago, lease = state.renewed_ago, owner.lease_s
        if lease and ago is not None and ago <= lease:
            return (
                f"the target is locked by another optagent ({owner.describe()}{_renewed(state)}, so it is "
                f"running; {owner.where()}): wait for it to finish, or stop it where it runs, then run this again"
            )
        seen = (
            f"its lease ran out {_ago(ago - lease)} ago" if lease and ago is not None
            else f"it renews no lease; its lock was last touched {_ago(ago)} ago" if ago is not None
            else "its lease cannot be read"
        )  # fmt: skip
        return (
            f"the target is locked by another optagent ({owner.describe()}) and {seen}; whether it is "
            f"gone cannot be told from here ({owner.where()}), so the lock is not broken. If no optagent "
            f"is working on this target, remove the lock by hand on the host (`rm {self.path}`), then "
            "run this again"
        )

    async def _renew(self) -> None:
        """Touch the lock every lease_s / 3 while this process holds it (the holder's heartbeat)."""
        assert self.owner is not None
        token = f'"token": "{self.owner.token}"'
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                result = await self.transport.run(
                    ["sh", "-c", _RENEW, "sh", token, self.path], timeout=self.lease_s / 3
                )
            except Exception as e:  # a lost connection: the next renewal tries again
                log.info("could not renew the lock %s: %s", self.path, e)
                continue
            if result.returncode == 3:
                self.lost = True
                log.warning("the lock %s is no longer this process's: it was removed or broken", self.path)
                return

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
        """Stop renewing and release the lock if this process holds it."""
        if self._renewing is not None:
            self._renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._renewing
            self._renewing = None
        if self.owner is None:
            return
        token = f'"token": "{self.owner.token}"'  # in one shell command: works without SFTP
        await self.transport.run(["sh", "-c", _RELEASE, "sh", token, self.path])
        self.owner = None


def _ago(seconds: float | None) -> str:
    s = max(0.0, seconds or 0.0)
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _renewed(state: LockState) -> str:
    return (
        f"; lease renewed {_ago(state.renewed_ago)} ago"
        if state.owner.lease_s and state.renewed_ago is not None
        else ""
    )


def _denied(stderr: str) -> bool:
    """True when the shell could not write the lock at all (not a lost race with another optagent)."""
    return any(
        m in stderr
        for m in ("Permission denied", "Read-only file system", "Operation not permitted", "No space")
    )


def _parse(text: str) -> LockOwner:
    try:
        data = json.loads(text)
        return LockOwner(**data)
    except (ValueError, TypeError, RecursionError):
        # Unreadable content: treat as held by an unknown process on an unknown host.
        return LockOwner("unknown", -1, None, "unreadable", 0.0)
