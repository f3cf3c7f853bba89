"""Trusting a directory optagent keeps state in: owned by us or root, writable by nobody else.

The host's run directory holds the PID file (optagent kills that process group), the log, the lock
and the known-good unit the dead-man's switch installs as root. If another local user could create
or write that directory first, they could plant any of those. So, as OpenSSH's StrictModes does,
the path is resolved whole and every directory on it must be owned by the user optagent runs as or
by root and writable by neither group nor others; the one exception is a sticky ancestor like
`/tmp` (whose entries only their owner can rename). The directory itself must not be a symlink,
however the path spells it, and a symlink on the way must belong to us or root, in a trusted
directory. Every entry already inside the directory must be ours too: owned by us or root, a
regular file (or directory) with one link, writable by nobody else; anything else is named and
refused. New directories are created 0700.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tools.localfiles import DirEntry, UntrustedDirError, check_chain

if TYPE_CHECKING:
    from tools.deploy.remote import Transport

__all__ = [
    "REMOTE_WRITABLE_SCRIPT",
    "DirEntry",
    "FileEntry",
    "Probe",
    "UntrustedDirError",
    "check_chain",
    "check_entries",
    "foreign_entries",
    "check_local_dir",
    "remote_probe_script",
    "trusted_dirs",
    "unwritable_dirs",
    "unwritable_local",
]


@dataclass(frozen=True)
class FileEntry:
    """One entry inside a trusted directory: owner, mode (with the type bits) and link count."""

    path: str
    uid: int
    mode: int
    nlink: int = 1


def foreign_entries(entries: list[FileEntry], *, me: int) -> list[str]:
    """`name (why)` for each entry optagent cannot have made: a symlink, a device, fifo or socket,
    another user's file, a file writable by group or others, or a file with other hard links (the
    lock, made with `ln`, is the one file with two links for a moment)."""
    bad = []
    for e in entries:
        name, kind = e.path.rsplit("/", 1)[-1], stat.S_IFMT(e.mode)
        if kind == stat.S_IFLNK:
            why = "a symlink"
        elif e.uid not in (me, 0):
            why = f"owned by uid {e.uid}"
        elif kind not in (stat.S_IFREG, stat.S_IFDIR):
            why = "not a regular file"
        elif e.mode & (stat.S_IWGRP | stat.S_IWOTH):
            why = f"writable by group or others (mode {e.mode & 0o7777:o})"
        elif kind == stat.S_IFREG and e.nlink > 1 and ".lock" not in name:
            why = f"{e.nlink} hard links"
        else:
            continue
        bad.append(f"{e.path} ({why})")
    return bad


def check_entries(what: str, directory: str, entries: list[FileEntry], *, me: int) -> None:
    """Raise `UntrustedDirError` naming every entry of `directory` that `foreign_entries` rejects."""
    bad = foreign_entries(entries, me=me)
    if bad:
        raise UntrustedDirError(
            f"{what} {directory} holds entries optagent did not make: {'; '.join(bad)}. Another user may "
            "have planted them while the directory was writable; check and remove them, then retry "
            "(nothing was changed)"
        )


def _local_entries(directory: Path) -> list[FileEntry]:
    out = []
    for entry in os.scandir(directory):
        st = entry.stat(follow_symlinks=False)
        out.append(FileEntry(entry.path, st.st_uid, st.st_mode, st.st_nlink))
    return out


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
    check_chain(what, str(path), chain, me=os.geteuid())
    check_entries(what, str(path), _local_entries(real), me=os.geteuid())


def remote_probe_script() -> str:
    """A `sh -c` script: `$1` run dir (created 0700), `$2` unit path. Prints `uid=N gid=G`; for each symlink
    met resolving the run dir a `link N UID PATH` line and the chain of its directory (tag `link:N`); for
    the run dir and the unit's directory a `dir <tag> <resolved path>` line followed by `uid gid mode path`
    lines up to `/`; then `entries` and an `ent uid gid mode nlink path` line per entry of the run dir
    and of its `backups` directory.

    Exit 3: the run dir is a symlink; 4: it cannot be created; 5: the unit's directory does not exist.
    """
    return (
        'echo "uid=$(id -u) gid=$(id -g)"; '
        '[ -L "$1" ] && { echo "run dir $1 is a symlink" >&2; exit 3; }; '
        'if [ ! -d "$1" ]; then (umask 077 && mkdir -p "$1") || exit 4; fi; '
        'chain() { q=$2; echo "dir $1 $q"; while :; do stat -c \'%u %g %f %n\' "$q" || exit 6; '
        '[ "$q" = / ] && break; q=$(dirname "$q"); done; }; '
        # resolve $1 one component at a time, as the kernel does: every symlink met, also inside the
        # target of another, is printed with the chain of the (physical) directory that holds it
        'rest=$1; n=0; case "$rest" in /*) cur=/;; *) cur=$(pwd -P);; esac; '
        'while [ -n "$rest" ]; do c=${rest%%/*}; if [ "$c" = "$rest" ]; then rest=; else rest=${rest#*/}; fi; '
        'case "$c" in ""|.) continue;; ..) cur=$(dirname "$cur"); continue;; esac; p="${cur%/}/$c"; '
        'if [ -L "$p" ]; then n=$((n+1)); [ $n -le 40 ] || exit 6; echo "link $n $(stat -c %u "$p") $p"; '
        'chain "link:$n" "$cur"; t=$(readlink "$p"); case "$t" in /*) cur=/;; esac; rest="$t${rest:+/$rest}"; '
        "else cur=$p; fi; done; "
        'r=$(cd "$1" && pwd -P) || exit 4; chain run "$r"; '
        'u=$(cd "$(dirname "$2")" 2>/dev/null && pwd -P) || exit 5; chain unit "$u"; echo entries; '
        'ents() { for f in "$1"/* "$1"/.[!.]* "$1"/..?*; do { [ -e "$f" ] || [ -L "$f" ]; } || continue; '
        's=$(stat -c \'%u %g %f %h %n\' "$f") && echo "ent $s"; done; }; ents "$r"; '
        '[ -d "$r/backups" ] && [ ! -L "$r/backups" ] && ents "$r/backups"; exit 0'
    )


@dataclass
class Probe:
    """What `remote_probe_script` printed."""

    me: int = -1
    gid: int = -2
    chains: dict[str, tuple[str, list[DirEntry]]] = field(default_factory=dict)
    links: list[tuple[str, int, str]] = field(default_factory=list)
    """(tag of its directory's chain, owner uid, path) of each symlink met resolving the run dir."""
    entries: list[FileEntry] = field(default_factory=list)
    garbled: list[str] = field(default_factory=list)


def parse_probe(output: str) -> Probe:
    """The uid, chains, symlinks and run-dir entries in `remote_probe_script` output."""
    probe, tag, in_entries = Probe(), "", False
    for line in output.splitlines():
        try:
            if line.startswith("uid="):
                ids = dict(part.split("=", 1) for part in line.split())
                probe.me, probe.gid = int(ids["uid"]), int(ids.get("gid", -2))
            elif line == "entries":
                in_entries = True
            elif in_entries:  # a name with a newline in it cannot be told apart: refused below
                _, uid, group, mode_hex, nlink, path = line.split(" ", 5)
                probe.entries.append(FileEntry(path, int(uid), int(mode_hex, 16), int(nlink)))
            elif line.startswith("link "):
                _, n, uid, path = line.split(" ", 3)
                probe.links.append((f"link:{n}", int(uid), path))
            elif line.startswith("dir "):
                _, tag, path = line.split(" ", 2)
                probe.chains[tag] = (path, [])
            elif line.strip() and tag:
                uid, group, mode_hex, path = line.split(" ", 3)
                probe.chains[tag][1].append(DirEntry(path, int(uid), int(mode_hex, 16), int(group)))
        except ValueError:
            probe.garbled.append(line)
    return probe


def unwritable_local(dirs: list[Path], *, need: int = 0) -> list[str]:
    """The directories among `dirs` where a file of `need` bytes cannot be written and removed, with why.

    A real probe file rather than `os.access`: root passes `access()` on a read-only mount or an
    immutable directory and then fails at the write; and real bytes, fsynced: an empty file is
    created even on a full disk.
    """
    bad = []
    for d in dirs:
        probe = None
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=d, prefix=".optagent-probe-")
            with os.fdopen(fd, "wb") as f:
                f.write(b"\0" * need)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            bad.append(f"{d} ({e.strerror or e})")
        finally:
            if probe is not None:
                with contextlib.suppress(OSError):
                    os.unlink(probe)
    return bad


REMOTE_WRITABLE_SCRIPT = (
    'n=$1; shift; for d in "$@"; do [ -d "$d" ] || continue; t="$d/.optagent-probe.$$"; '
    'if ( set -C; head -c "$n" /dev/zero > "$t" && { sync "$t" 2>/dev/null || :; } && [ "$(wc -c < "$t")" -eq "$n" ] ) '
    '2>/dev/null; then rm -f "$t"; else rm -f "$t"; echo "$d"; fi; done'
)
"""`sh -c` script: `$1` a byte count, then directories; prints each existing one in which a file of that
many bytes cannot be written and removed (a missing one is made later inside a directory this checks)."""


async def trusted_dirs(
    transport: Transport, *, run_dir: str, remote_unit: str, state_dir: Path
) -> tuple[str, str]:
    """Check the local state dir, create the host's run dir 0700, and refuse any another user could
    plant or write; returns the resolved run dir and the resolved directory of the unit file."""
    check_local_dir(state_dir)
    if ".." in run_dir.split("/"):
        raise UntrustedDirError(f"run directory {run_dir}: give a path without `..`")
    # `[ -L dir/ ]` and `[ -L dir/. ]` would look through a symlink
    run_dir = posixpath.normpath(run_dir) if run_dir.strip("/") else "/"
    result = await transport.run(["sh", "-c", remote_probe_script(), "sh", run_dir, remote_unit])
    why = {
        3: "is a symlink; refusing to follow it",
        4: "cannot be created or entered (as root: `install -d -m 700 -o USER DIR` for the SSH user)",
    }
    if result.returncode in why:
        raise UntrustedDirError(f"run directory {run_dir} on the host {why[result.returncode]}")
    if result.returncode == 5:
        raise UntrustedDirError(f"the directory of {remote_unit} does not exist on the host")
    probe = parse_probe(result.stdout)
    me, chains = probe.me, probe.chains
    if not result.ok or me < 0 or not {"run", "unit"} <= set(chains):
        raise UntrustedDirError(
            f"cannot inspect {run_dir} or the directory of {remote_unit}: {result.stderr.strip()[-300:]}"
        )
    for tag, uid, link in probe.links:  # whoever may replace a symlink on the way decides where it leads
        if uid not in (me, 0):
            raise UntrustedDirError(
                f"run directory {run_dir}: the symlink {link} on the way is owned by uid {uid}, not by uid "
                f"{me} or root; another user may have planted it. Give the resolved path instead"
            )
        where = f"run directory {run_dir}: the directory of the symlink"
        check_chain(where, link, chains[tag][1], me=me, sticky_first=True)
    check_chain("run directory", run_dir, chains["run"][1], me=me)
    check_chain("unit directory of", remote_unit, chains["unit"][1], me=me)
    if probe.garbled:
        raise UntrustedDirError(
            f"run directory {run_dir} holds an entry whose name could not be read (a newline in it?): "
            f"{probe.garbled[0][:200]!r}; remove it, then retry (nothing was changed)"
        )
    check_entries("run directory", chains["run"][0], probe.entries, me=me)
    return chains["run"][0], chains["unit"][0]


async def unwritable_dirs(
    transport: Transport, local: list[Path], remote: list[str], *, need: int = 0
) -> list[str]:
    """The local and host directories (of those given) where `need` bytes cannot be written, with why."""
    bad = unwritable_local(local, need=need)
    result = await transport.run(["sh", "-c", REMOTE_WRITABLE_SCRIPT, "sh", str(need), *remote])
    return bad + [f"{d} on the host" for d in result.stdout.splitlines() if d]
