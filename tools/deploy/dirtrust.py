"""Trusting a directory optagent keeps state in: owned by us or root, writable by nobody else.

The host's run directory holds the PID file (optagent kills that process group), the log, the lock
and the known-good unit the dead-man's switch installs as root. If another local user could create
or write that directory first, they could plant any of those. So every directory on the resolved
path must be owned by the user optagent runs as or by root, and none may be writable by group or
others, except a sticky ancestor like `/tmp` (whose entries only their owner can rename); the
directory itself must not be a symlink. New directories are created 0700.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tools.deploy.remote import Transport

__all__ = [
    "REMOTE_WRITABLE_SCRIPT",
    "DirEntry",
    "UntrustedDirError",
    "check_chain",
    "check_local_dir",
    "remote_probe_script",
    "trusted_dirs",
    "unwritable_dirs",
    "unwritable_local",
]


class UntrustedDirError(Exception):
    """A state or run directory that another user could have planted or can still write."""


@dataclass(frozen=True)
class DirEntry:
    """One directory of a resolved path: its owner and permission bits."""

    path: str
    uid: int
    mode: int
    gid: int = -1


def check_chain(what: str, given: str, chain: list[DirEntry], *, me: int, my_gid: int = -2) -> None:
    """Raise `UntrustedDirError` unless `chain` (the directory first, then each parent up to `/`) is safe.

    `me` is the uid optagent acts as on that machine; root (0) is always trusted. A parent writable
    by `my_gid` only (a user-private group, as umask 002 makes them) is not shared with other users.
    """
    for i, entry in enumerate(chain):
        owner_ok = entry.uid in (me, 0)
        group_shared = entry.mode & stat.S_IWGRP and (i == 0 or entry.gid != my_gid)
        shared = entry.mode & stat.S_IWOTH or group_shared
        sticky = entry.mode & stat.S_ISVTX
        if not owner_ok:
            raise UntrustedDirError(
                f"{what} {given}: {entry.path} is owned by uid {entry.uid}, not by uid {me} or root; "
                f"another user may have planted it. Remove it or choose a root-owned path"
            )
        # The directory itself may never be shared; an ancestor only when sticky (like /tmp).
        if shared and (i == 0 or not sticky):
            raise UntrustedDirError(
                f"{what} {given}: {entry.path} is writable by group or others (mode {entry.mode & 0o7777:o}); "
                f"run `chmod go-w {entry.path}` or choose another path"
            )


def check_local_dir(path: Path, *, what: str = "state directory") -> None:
    """Create `path` 0700 if missing, then check it and its parents (`UntrustedDirError` if unsafe)."""
    path = Path(path).expanduser()
    if path.is_symlink():
        raise UntrustedDirError(f"{what} {path} is a symlink; refusing to follow it")
    if not path.exists():
        old = os.umask(0o077)  # parents made here are private too
        try:
            path.mkdir(parents=True, exist_ok=True)
        finally:
            os.umask(old)
    real = path.resolve()
    chain: list[DirEntry] = []
    for p in [real, *real.parents]:
        st = os.lstat(p)
        chain.append(DirEntry(str(p), st.st_uid, st.st_mode, st.st_gid))
    check_chain(what, str(path), chain, me=os.geteuid(), my_gid=os.getegid())


def remote_probe_script() -> str:
    """A `sh -c` script: `$1` run dir (created 0700), `$2` unit path. Prints `uid=N gid=G`, then for the run dir
    and the unit's directory a `dir <tag> <resolved path>` line followed by `uid gid mode path` lines up to `/`.

    Exit 3: the run dir is a symlink; 4: it cannot be created; 5: the unit's directory does not exist.
    """
    return (
        'echo "uid=$(id -u) gid=$(id -g)"; '
        '[ -L "$1" ] && { echo "run dir $1 is a symlink" >&2; exit 3; }; '
        'if [ ! -d "$1" ]; then (umask 077 && mkdir -p "$1") || exit 4; fi; '
        'chain() { q=$2; echo "dir $1 $q"; while :; do stat -c \'%u %g %f %n\' "$q" || exit 6; '
        '[ "$q" = / ] && break; q=$(dirname "$q"); done; }; '
        'r=$(cd "$1" && pwd -P) || exit 4; chain run "$r"; '
        'u=$(cd "$(dirname "$2")" 2>/dev/null && pwd -P) || exit 5; chain unit "$u"'
    )


def parse_probe(output: str) -> tuple[int, int, dict[str, tuple[str, list[DirEntry]]]]:
    """(remote uid, remote gid, {tag: (resolved path, chain)}) from `remote_probe_script` output."""
    me, gid, chains, tag = -1, -2, {}, ""
    for line in output.splitlines():
        if line.startswith("uid="):
            ids = dict(part.split("=", 1) for part in line.split())
            me, gid = int(ids["uid"]), int(ids.get("gid", -2))
        elif line.startswith("dir "):
            _, tag, path = line.split(" ", 2)
            chains[tag] = (path, [])
        elif line.strip() and tag:
            uid, group, mode_hex, path = line.split(" ", 3)
            chains[tag][1].append(DirEntry(path, int(uid), int(mode_hex, 16), int(group)))
    return me, gid, chains


def unwritable_local(dirs: list[Path]) -> list[str]:
    """The directories among `dirs` where a file cannot be created and removed, with the reason.

    A real probe file rather than `os.access`: root passes `access()` on a read-only mount or an
    immutable directory and then fails at the write.
    """
    bad = []
    for d in dirs:
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=d, prefix=".optagent-probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            bad.append(f"{d} ({e.strerror or e})")
    return bad


REMOTE_WRITABLE_SCRIPT = (
    'for d in "$@"; do [ -d "$d" ] || continue; t="$d/.optagent-probe.$$"; '
    'if ( : > "$t" ) 2>/dev/null && rm -f "$t"; then :; else echo "$d"; fi; done'
)
"""`sh -c` script: prints each existing argument directory in which a file cannot be created and removed
(a missing one is made later inside a directory this checks)."""


async def trusted_dirs(
    transport: Transport, *, run_dir: str, remote_unit: str, state_dir: Path
) -> tuple[str, str]:
    """Check the local state dir, create the host's run dir 0700, and refuse any another user could
    plant or write; returns the resolved run dir and the resolved directory of the unit file."""
    check_local_dir(state_dir)
    run_dir = run_dir.rstrip("/") or "/"  # `[ -L dir/ ]` would look through a symlink
    result = await transport.run(["sh", "-c", remote_probe_script(), "sh", run_dir, remote_unit])
    why = {
        3: "is a symlink; refusing to follow it",
        4: "cannot be created or entered (as root: `install -d -m 700 -o USER DIR` for the SSH user)",
    }
    if result.returncode in why:
        raise UntrustedDirError(f"run directory {run_dir} on the host {why[result.returncode]}")
    if result.returncode == 5:
        raise UntrustedDirError(f"the directory of {remote_unit} does not exist on the host")
    me, gid, chains = parse_probe(result.stdout)
    if not result.ok or me < 0 or set(chains) != {"run", "unit"}:
        raise UntrustedDirError(
            f"cannot inspect {run_dir} or the directory of {remote_unit}: {result.stderr.strip()[-300:]}"
        )
    check_chain("run directory", run_dir, chains["run"][1], me=me, my_gid=gid)
    check_chain("unit directory of", remote_unit, chains["unit"][1], me=me, my_gid=gid)
    return chains["run"][0], chains["unit"][0]


async def unwritable_dirs(transport: Transport, local: list[Path], remote: list[str]) -> list[str]:
    """The local and host directories (of those given) where a file cannot be created, with why."""
    bad = unwritable_local(local)
    result = await transport.run(["sh", "-c", REMOTE_WRITABLE_SCRIPT, "sh", *remote])
    return bad + [f"{d} on the host" for d in result.stdout.splitlines() if d]
