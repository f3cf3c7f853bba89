"""Files optagent writes on this machine: never through a link, only where nobody else can reach in.

Transcripts, reports, plots, exports, benchmark results, state files, the local unit copy and the
config file all go through here. A file is written under a new temp name in its own directory,
created with O_CREAT | O_EXCL | O_NOFOLLOW (nothing planted at that name is followed or reused),
fsynced, then renamed over its name: a symlink or file another user planted there is replaced,
never written through. An append-only file (a transcript) is opened with O_NOFOLLOW and kept only
if it is a regular file of ours with one link.

Directories are held to the rule the host's run directory is held to (`tools.deploy.dirtrust`, as
OpenSSH's StrictModes): the path is resolved one component at a time, every directory of the
resolved path is owned by the user optagent runs as or by root and is writable by group or others
only when sticky (like /tmp, whose entries only their owner may rename or remove), and every
symlink met on the way belongs to that user or root and sits in such a directory. A shared group
directory (`root:users 2775`) is refused with what to run: any member could replace what optagent
wrote or plant what it reads next.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

__all__ = [
    "DirEntry",
    "UntrustedDirError",
    "UntrustedFileError",
    "check_chain",
    "open_append",
    "trusted_dir",
    "write_bytes",
    "write_text",
]

MAX_LINKS = 40
"""Symlinks followed resolving one path, as the kernel's own limit."""


class UntrustedDirError(OSError):
    """A directory another user could have planted, or can still write."""


class UntrustedFileError(OSError):
    """A file optagent would append to that is not plainly its own (a symlink, a fifo, another
    user's file, a file with other hard links)."""


@dataclass(frozen=True)
class DirEntry:
    """One directory of a resolved path: its owner and permission bits."""

    path: str
    uid: int
    mode: int
    gid: int = -1


def check_chain(what: str, given: str, chain: list[DirEntry], *, me: int, sticky_first: bool = False) -> None:
    """Raise `UntrustedDirError` unless `chain` (the directory first, then each parent up to `/`) is safe.

    `me` is the uid optagent acts as on that machine; root (0) is always trusted. As with OpenSSH's
    StrictModes a directory writable by its group is refused, even a group that seems private: who
    else is in it is not visible from here. `sticky_first`: the first directory may be sticky like an
    ancestor (it holds only what is checked on its own: a symlink, or files written by rename).
    """
    for i, entry in enumerate(chain):
        owner_ok = entry.uid in (me, 0)
        shared = entry.mode & (stat.S_IWOTH | stat.S_IWGRP)
        sticky = entry.mode & stat.S_ISVTX
        if not owner_ok:
            raise UntrustedDirError(
                f"{what} {given}: {entry.path} is owned by uid {entry.uid}, not by uid {me} or root; "
                f"another user may have planted it. Remove it or choose a root-owned path"
            )
        # The directory itself may never be shared; an ancestor only when sticky (like /tmp).
        if shared and ((i == 0 and not sticky_first) or not sticky):
            fix = f"`chmod go-w {entry.path}`" + (
                f" (or `chmod +t {entry.path}`)" if i == 0 and sticky_first else ""
            )
            raise UntrustedDirError(
                f"{what} {given}: {entry.path} is writable by group or others (mode {entry.mode & 0o7777:o}); "
                f"run {fix} or choose another path"
            )


def _chain(real: str) -> list[DirEntry]:
    out, path = [], real
    while True:
        st = os.lstat(path)
        out.append(DirEntry(path, st.st_uid, st.st_mode, st.st_gid))
        if path == "/":
            return out
        path = os.path.dirname(path)


def _resolve(path: Path, what: str) -> str:
    """The physical path of the existing directory `path`, checking each symlink met on the way as
    the kernel follows it (`FileNotFoundError` at the first missing component)."""
    me, text = os.geteuid(), os.fspath(path)
    cur = "/" if text.startswith("/") else os.getcwd()  # getcwd() is already physical
    rest, hops = text, 0
    while rest:
        part, _, rest = rest.partition("/")
        if part in ("", "."):
            continue
        if part == "..":
            cur = os.path.dirname(cur)
            continue
        step = os.path.join(cur, part)
        st = os.lstat(step)
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > MAX_LINKS:
                raise UntrustedDirError(f"{what} {path}: more than {MAX_LINKS} symlinks on the way")
            if st.st_uid not in (me, 0):  # whoever may replace the link decides where it leads
                raise UntrustedDirError(
                    f"{what} {path}: the symlink {step} on the way is owned by uid {st.st_uid}, not by "
                    f"uid {me} or root; another user may have planted it. Give the resolved path instead"
                )
            check_chain(
                f"{what} {path}: the directory of the symlink", step, _chain(cur), me=me, sticky_first=True
            )
            target = os.readlink(step)
            cur = "/" if target.startswith("/") else cur
            rest = f"{target}/{rest}" if rest else target
        elif stat.S_ISDIR(st.st_mode):
            cur = step
        else:
            raise NotADirectoryError(errno.ENOTDIR, f"{what} {path}: {step} is not a directory")
    return cur


def trusted_dir(
    path: Path | str,
    *,
    what: str = "directory",
    create: bool = True,
    mode: int = 0o777,
    private: bool = False,
) -> Path:
    """The resolved directory `path` (made when missing, it and its missing parents with `mode`
    less the umask), after checking it as the module docstring says; `UntrustedDirError` (an
    `OSError`) names what is wrong and the fix. `private`: `path` itself may not be writable by
    anyone else even when sticky (another user could make a name in it first)."""
    path = Path(path).expanduser()
    try:
        real = _resolve(path, what)
    except FileNotFoundError:
        if not create or path.parent == path:
            raise
        parent = trusted_dir(path.parent, what=what, mode=mode)  # checked before anything is made inside it
        with contextlib.suppress(FileExistsError):
            os.mkdir(parent / path.name, mode)
        real = _resolve(path, what)
    check_chain(what, str(path), _chain(real), me=os.geteuid(), sticky_first=not private)
    return Path(real)


def _open_dir(path: Path, what: str) -> int:
    # Every directory on the resolved path is ours or root's, and none is a symlink: nobody else can
    # swap one between the check and this open, so the descriptor is the directory checked.
    real = trusted_dir(path, what=what)
    return os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _umask() -> int:
    """The process umask, read without setting it (`os.umask` would change it for every thread)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def _name(path: Path) -> str:
    if path.name in ("", ".", ".."):
        raise IsADirectoryError(errno.EISDIR, f"{path} names a directory, not a file")
    return path.name


def write_bytes(path: Path | str, data: bytes, *, mode: int | None = None) -> Path:
    """Replace `path` with `data` atomically (readers see the old file or the new one, whole).

    An existing regular file's mode is kept, and its owner too unless the directory is shared (a
    sticky one, like /tmp: there another user's file at that name is a plant, not theirs to keep);
    a new file gets `mode`, else 0666 less the umask, as `open()` would give it."""
    path = Path(path).expanduser()
    name = _name(path)
    dfd = _open_dir(path.parent, f"writing {name} into directory")
    try:
        shared = os.fstat(dfd).st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        try:
            old = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        keep = old is not None and stat.S_ISREG(old.st_mode)
        final = old.st_mode & 0o777 if keep and old else (mode if mode is not None else 0o666 & ~_umask())
        tmp = f".{name[:100]}.{secrets.token_hex(6)}.optagent-tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fchmod(f.fileno(), final)
                if keep and old and not shared and (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                    with contextlib.suppress(PermissionError):
                        os.fchown(f.fileno(), old.st_uid, old.st_gid)
                os.fsync(f.fileno())
            try:
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except PermissionError:
                if old is None or old.st_uid == os.geteuid():
                    raise
                raise UntrustedFileError(  # a sticky directory: only the entry's owner may replace it
                    f"{path} is owned by uid {old.st_uid}, not by uid {os.geteuid()}, in a shared "
                    "directory; another user may have planted it: check and remove it, then retry"
                ) from None
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return path


def write_text(path: Path | str, text: str, *, mode: int | None = None) -> Path:
    """`write_bytes` of `text` in UTF-8."""
    return write_bytes(path, text.encode("utf-8"), mode=mode)


def _not_ours(st: os.stat_result) -> str | None:
    """Why a file to append to is not plainly optagent's (None when it is)."""
    me = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):
        return "is a fifo or socket"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid not in (me, 0):
        return f"is owned by uid {st.st_uid}, not by uid {me}"
    return f"has {st.st_nlink} hard links" if st.st_nlink != 1 else None


def open_append(path: Path | str) -> TextIO:
    """`path` opened to append UTF-8 text (created when missing), refusing a symlink, a fifo or
    device, another user's file or one with other hard links: `UntrustedFileError` says which."""
    path = Path(path).expanduser()
    name = _name(path)
    dfd = _open_dir(path.parent, f"writing {name} into directory")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        try:
            fd = os.open(name, flags, 0o666, dir_fd=dfd)  # O_NONBLOCK: a planted fifo never hangs the open
            why = _not_ours(os.fstat(fd))
        except OSError:  # ELOOP, ENXIO, or the kernel's own refusal in a sticky directory (EACCES)
            try:
                why = _not_ours(os.stat(name, dir_fd=dfd, follow_symlinks=False))
            except OSError:
                why = None
            if why is None:
                raise
            fd = -1
    finally:
        os.close(dfd)
    if why is not None:
        if fd >= 0:
            os.close(fd)
        raise UntrustedFileError(
            f"{path} {why}; another user may have planted it: check and remove it, then retry"
        )
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise
