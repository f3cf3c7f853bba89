"""How the resolver worker is started: as isolated as this machine allows, said by its level.

The worker runs code of an SGLang tree (a wheel from the index, or a checkout the user names), so
it is kept from everything else, in levels, the strongest this machine has:

* `bubblewrap` (`bwrap` of Debian's `bubblewrap`, when it works here): new user, PID, IPC, UTS,
  cgroup and network namespaces (no network at all), every capability dropped, uid `nobody`. Its
  filesystem is a tmpfs holding read-only binds of what it reads: `/usr` and
  the `/bin`, `/lib*` links, the dynamic linker's cache, the Python the venv runs on, the venv, the
  SGLang tree, the worker's own code and the served model configs; `/tmp` (its HOME and scratch)
  is a private tmpfs. Nothing else of this machine (the optagent cache, the project, a home
  folder) is there to read or write.
* `unshare` (`unshare -rn` of util-linux): new user and network namespaces (no network); the
  filesystem is this machine's, so the Landlock rules below are what keep it to the same paths.
* `landlock`: no namespaces; Landlock alone keeps the worker's reads, writes and TCP to the same
  paths and none.
* `hook`: the worker's audit hook alone (`worker/sandbox.py`); Python code can get round it.

At every level the worker ends when its parent does: its stdin closes and it exits (under
bubblewrap, every process of its PID namespace with it). Not bubblewrap's `--die-with-parent`:
that signal comes when the *thread* that started it ends, which kills a worker started from a
thread pool (research runs in threads) while the process that owns it lives on.

At every level the worker applies, before it reads the tree, resource limits (`LIMITS`) and, where
the kernel has it (Linux 5.13+, `worker/landlock.py`) and the level is not `hook`, Landlock rules:
it may read and run only the paths it is given, write only its scratch folder and `/dev/null`, and
(Landlock ABI 4+) bind or connect no TCP socket. Then its audit hook refuses network, other
programs, `ctypes`, forks and writes outside its scratch folder.

A worker the kernel does not keep from writing outside its scratch folder (no bubblewrap and no
Landlock: `unshare` alone, `hook`) could write into the optagent cache, where this process later
reads the flag index (pickles): it is not started (`UnconfinedWrites`, saying what to install)
unless the user accepts it.

`OPTAGENT_RESOLVER_ISOLATION` (`bubblewrap`, `unshare`, `landlock`, `hook`) caps the level: a
machine where a stronger one misbehaves, and the tests of each level. A cap of `unshare` or `hook`
also accepts a worker whose writes nothing but the audit hook confines.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import resource
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

LEVELS = ("bubblewrap", "unshare", "landlock", "hook")
"""Strongest first."""
ENV = "OPTAGENT_RESOLVER_ISOLATION"
ACCEPTS_UNCONFINED = ("unshare", "hook")
"""Caps of `$OPTAGENT_RESOLVER_ISOLATION` that accept a worker whose writes the kernel leaves free:
the user asked for a level that does not promise to confine them."""
NOBODY = "65534"
LIMITS = {
    "RLIMIT_AS": 4 << 30,  # a resolution takes ~250 MB of address space
    "RLIMIT_CPU": 600,  # seconds of CPU for the worker's life (each request forks: its own 600)
    "RLIMIT_FSIZE": 64 << 20,  # no file it may write is bigger
    "RLIMIT_NOFILE": 512,
    "RLIMIT_CORE": 0,
}
"""Resource limits the worker sets on itself (soft and hard) before it reads the tree."""
NPROC_MARGIN = 8192  # threads count: servers the user starts later (SGLang: ~100 each) must not starve it
"""RLIMIT_NPROC counts every process of the user: the worker gets this many above today's count
(the kernel does not apply it to root; there the audit hook's fork rule bounds the worker)."""
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_LINKER = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d")
_LANDLOCK_CREATE_RULESET = 444  # the same number on every architecture Linux has Landlock on


def base_python(venv: Path) -> Path:
    """The prefix of the Python a venv runs on (its `pyvenv.cfg` `home`, or this one's)."""
    cfg = venv / "pyvenv.cfg"
    if cfg.is_file():
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                return Path(value.strip()).resolve().parent
    return Path(sys.base_prefix).resolve()


def read_paths(venv: Path, *others: Path) -> list[Path]:
    """What the worker reads: the system's programs and libraries, the venv's Python, the venv and
    `others` (the tree, the worker's code, the served model configs), resolved, without repeats."""
    system = [Path(p) for p in (*_SYSTEM, *_LINKER) if os.path.lexists(p)]
    system = [p if str(p) in _SYSTEM and p.is_symlink() else p.resolve() for p in system]
    return list(dict.fromkeys([*system, *(Path(p).resolve() for p in (base_python(venv), venv, *others))]))


def landlock_abi() -> int:
    """The Landlock ABI version of this kernel, 0 without Landlock."""
    if platform.system() != "Linux":
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(ctypes.c_long(_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(abi), 0)


def bwrap_prefix(paths: Iterable[Path]) -> list[str]:
    """The `bwrap` command line the worker runs under, binding `paths` read-only."""
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--uid", NOBODY, "--gid", NOBODY]
    argv += ["--cap-drop", "ALL", "--new-session"]
    argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]  # /tmp first: binds may lie in it
    for path in paths:
        if path.is_symlink() and str(path) in _SYSTEM:  # /bin -> usr/bin on a merged /usr
            argv += ["--symlink", os.readlink(path), str(path)]
        else:
            argv += ["--ro-bind", str(path), str(path)]
    return [*argv, "--chdir", "/tmp", "--"]


UNSHARE_PREFIX = ["unshare", "--user", "--map-root-user", "--net", "--"]


@functools.cache
def _runs(argv: tuple[str, ...]) -> bool:
    try:
        done = subprocess.run([*argv, "/bin/true"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def available() -> list[str]:
    """The levels this machine has, strongest first (`hook` always)."""
    out = []
    if _runs(tuple(bwrap_prefix(read_paths(Path(sys.prefix))))):
        out.append("bubblewrap")
    if _runs(tuple(UNSHARE_PREFIX)):
        out.append("unshare")
    if landlock_abi() > 0:
        out.append("landlock")
    return [*out, "hook"]


class UnconfinedWrites(ValueError):
    """The strongest level here leaves the worker's writes to the audit hook alone, and the user did
    not accept that: SGLang's code could write into the cache this process reads."""


def confines_writes(lvl: str, landlock: int) -> bool:
    """Whether the kernel keeps a worker at level `lvl`, on a kernel of Landlock ABI `landlock` (0:
    none), from writing outside its scratch folder. Under bubblewrap the cache is not in its
    filesystem; Landlock (any ABI; the worker applies it at every level but `hook`) lets it write
    only its scratch (ABI 1 and 2 leave truncate(2) free: it could empty a file, not write one).
    `unshare` alone and `hook` leave writes to the audit hook, which Python code can get round."""
    return lvl == "bubblewrap" or (lvl != "hook" and landlock > 0)


def choose(cap: str, have: list[str], landlock: int) -> str:
    """The strongest level of `have` (`available()`), at most `cap` (empty: no cap), on a kernel of
    Landlock ABI `landlock`. ValueError for an unknown cap; `UnconfinedWrites` when that level's
    writes are not confined and `cap` is not one of `ACCEPTS_UNCONFINED`."""
    cap = cap.strip()
    if cap and cap not in LEVELS:
        raise ValueError(f"${ENV} is {cap!r}: one of {', '.join(LEVELS)}")
    allowed = LEVELS[LEVELS.index(cap or LEVELS[0]) :]
    lvl = next(lv for lv in have if lv in allowed)
    if not confines_writes(lvl, landlock) and cap not in ACCEPTS_UNCONFINED:
        raise UnconfinedWrites(
            "this machine has neither bubblewrap nor Landlock: SGLang's code would run isolated "
            f"by {describe(lvl, landlock)}, free to write into the optagent cache this process "
            "reads; install Debian's `bubblewrap` (apt-get install "
            "bubblewrap) or use a kernel with Landlock (Linux 5.13+), or set "
            f"{ENV}=hook to run it anyway"
        )
    return lvl


def level() -> str:
    """The level the worker runs at here (`choose` on this machine, capped by
    `$OPTAGENT_RESOLVER_ISOLATION`)."""
    return choose(os.environ.get(ENV, ""), available(), landlock_abi())


def limits() -> dict[str, int]:
    """`LIMITS`, and RLIMIT_NPROC: the user's processes now plus `NPROC_MARGIN`."""
    uid = os.getuid()
    count = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            real = next(line for line in status.read_text().splitlines() if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        count += int(real.split()[1]) == uid
    nproc = count + NPROC_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if hard != resource.RLIM_INFINITY:
        nproc = min(nproc, hard)
    return {**LIMITS, "RLIMIT_NPROC": nproc}


def describe(lvl: str, landlock: int) -> str:
    """One line naming what isolates a worker at level `lvl` with Landlock ABI `landlock` (0: none)."""
    parts = {"bubblewrap": ["bubblewrap"], "unshare": ["unshare -rn"]}.get(lvl, [])
    if landlock:
        parts.append(f"Landlock ABI {landlock}")
    return " + ".join([*parts, "audit hook"]) if parts else "the audit hook only"
