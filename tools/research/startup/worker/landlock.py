"""Landlock (Linux 5.13+): the kernel keeps this process and every child it makes to the paths it
is given, irreversibly. Read and run only under `read`; read, write, create and remove only under
`write`; `/dev/null` written, `/dev/urandom` and `/dev/zero` read; with Landlock ABI 4+ no TCP
socket bound or connected; with ABI 6+ no signal and no abstract unix socket outside its own
processes. Applied by `sandbox.install` before the SGLang tree is read (it uses ctypes, which the
audit hook refuses afterwards)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_VERSION = 1
_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_MAKE = sum(1 << bit for bit in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
REFER, TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
_NET_TCP = (1 << 0) | (1 << 1)  # bind, connect (ABI 4)
_SCOPES = (1 << 0) | (1 << 1)  # abstract unix sockets, signals (ABI 6)
_DEVICES = {"/dev/null": READ_FILE | WRITE_FILE | TRUNCATE, "/dev/urandom": READ_FILE, "/dev/zero": READ_FILE}


class _Ruleset(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _syscall(libc: ctypes.CDLL, number: int, *args: object) -> int:
    """syscall(2), every integer passed as a long (it is variadic)."""
    longs = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    result = libc.syscall(ctypes.c_long(number), *longs)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock syscall {number}: {os.strerror(err)}")
    return int(result)


def restrict(read: list[Path], write: list[Path]) -> int:
    """Apply the rules (see the module docstring); return the Landlock ABI used, 0 when this kernel
    has none (nothing applied). A path that does not exist is left out."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    try:
        abi = _syscall(libc, _CREATE_RULESET, None, 0, _VERSION)
    except OSError:  # ENOSYS: no Landlock in this kernel; EOPNOTSUPP: not enabled at boot
        return 0
    files = EXECUTE | READ_FILE | WRITE_FILE | (TRUNCATE if abi >= 3 else 0)
    fs = files | READ_DIR | _MAKE | (REFER if abi >= 2 else 0)
    ruleset = _Ruleset(fs, _NET_TCP if abi >= 4 else 0, _SCOPES if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    fd = _syscall(libc, _CREATE_RULESET, ctypes.byref(ruleset), size, 0)
    try:
        rules = [(p, EXECUTE | READ_FILE | READ_DIR) for p in read]
        rules += [(p, fs) for p in write] + [(Path(d), a) for d, a in _DEVICES.items()]
        for path, allowed in rules:
            try:
                parent = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not path.is_dir():
                    allowed &= files  # a file's rule holds only a file's rights
                rule = _PathBeneath(allowed & fs, parent)
                _syscall(libc, _ADD_RULE, fd, _PATH_BENEATH, ctypes.byref(rule), 0)
            finally:
                os.close(parent)
        ulongs = [ctypes.c_ulong(a) for a in (_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)]
        if libc.prctl(*ulongs) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        _syscall(libc, _RESTRICT_SELF, fd, 0)
    finally:
        os.close(fd)
    return abi
