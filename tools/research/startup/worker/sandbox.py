"""Keep SGLang's start-up probes inside the resolver process.

What the kernel enforces (the namespaces of `bwrap` or `unshare` around the process, chosen by
`tools.research.startup.isolation`; resource limits and Landlock, applied here) is the boundary;
the audit hook below refuses the same things to Python code and says what it refused, but Python
code can get round an audit hook.

* Limits: `limit()` sets the address space, CPU time, file size, open files, processes and core
  dumps before the tree is read (soft and hard: the process cannot raise them again).
* Landlock (``landlock.py``): reads and runs only under the paths it is given, writes only under
  its scratch folder, no TCP (ABI 4+), no signals out (ABI 6+).
* Subprocesses: ``PATH`` holds only a directory with a fake ``nvidia-smi`` (and ``lscpu`` for a CPU
  host) whose facts are data files beside it; the hook refuses to start any other program (as if
  it were not installed: ``FileNotFoundError``), ``_posixsubprocess.fork_exec`` for any other
  program, ``os.fork`` except the worker's own fork per request, every ``os.exec*``, spawn and
  kill, and changing a resource limit.
* Network: every connect, bind, send and name lookup (``OSError``).
* ``ctypes``: loading a library, calling a foreign function, reading memory by address, once
  `arm()` is called (after the real packages are imported, before the tree is).
* Files: writing, creating, removing or renaming anything outside the scratch folder and
  ``/dev/null`` (``PermissionError``). HOME and the Hugging Face caches point into the scratch
  folder and the hubs are set offline, so nothing is downloaded or read from the user's caches.
* A CPU host (``hw.cpu``): ``lscpu``, ``platform.machine()`` and the cgroup limit answer from its
  facts (``fake_cpu.py``); this machine's own cgroup, meminfo and NUMA files are refused.
"""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import fake_cpu, landlock
from .fake_hw import NVIDIA_SMI, Hardware, nvidia_smi_answers

_NETWORK_EVENTS = frozenset(
    {
        "socket.bind",
        "socket.connect",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
        "socket.getnameinfo",
        "socket.sendto",
        "socket.sendmsg",
    }
)
_EXEC_EVENTS = frozenset(
    {
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.forkpty",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
    }
)
_CTYPES_EVENTS = frozenset(
    {
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.dlsym/handle",
        "ctypes.call_function",
        "ctypes.cdata",
        "ctypes.string_at",
        "ctypes.wstring_at",
        "ctypes.PyObj_FromPtr",
    }
)
_LIMIT_EVENTS = frozenset({"resource.setrlimit", "resource.prlimit"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {  # event -> positions of the paths it changes
    "os.mkdir": (0,),
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.rename": (0, 1),
    "os.link": (1,),
    "os.symlink": (1,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.truncate": (0,),
    "os.utime": (0,),
    "os.setxattr": (0,),
    "os.removexattr": (0,),
    "os.mkfifo": (0,),
    "os.mknod": (0,),
}
_REIMPORTS = frozenset({"_posixsubprocess", "_ctypes"})
"""Modules imported before the hook and never again (a fresh copy would lack the guards)."""

#: Every refused probe, as (event, detail), for the report.
DENIED: list[tuple[str, str]] = []
LANDLOCK_ABI = 0
"""The Landlock ABI `install` applied (0: none)."""
_FORK_CODE: list[Any] = []
_ARMED: list[bool] = []


def limit(limits: dict[str, int]) -> None:
    """Set each `RLIMIT_*` of `limits` as soft and hard limit (never above a hard limit in force)."""
    for name, value in limits.items():
        which = getattr(resource, name, None)
        if which is None:
            continue
        _, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))


def arm() -> None:
    """Refuse `ctypes` from now on: called once the real packages are imported (dill reads
    `ctypes.pythonapi` at import), before anything of the SGLang tree is."""
    _ARMED.append(True)


def allow_fork(code: Any) -> None:
    """The one code object (the worker's fork per request) allowed to call ``os.fork``."""
    _FORK_CODE.append(code)


def _program_of(args: Any) -> str:
    """Best-effort program path from a ``subprocess.Popen`` audit event."""
    executable, argv = args[0], args[1]
    if executable:
        return os.fsdecode(executable)
    if isinstance(argv, (list, tuple)) and argv:
        return os.fsdecode(argv[0])
    return os.fsdecode(argv)


def _path(value: Any) -> str | None:
    """A path argument of an audit event as text (None for a file descriptor)."""
    if isinstance(value, int):
        return None
    try:
        return os.fsdecode(os.fspath(value))
    except TypeError:
        return "<unreadable path>"


def _writes(args: Any) -> bool:
    """Whether an ``open`` event opens for writing (``open()``'s mode or ``os.open``'s flags)."""
    mode, flags = args[1], args[2]
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def _write_fake(bin_dir: Path, name: str, script: str, facts: dict[str, str] | None = None) -> Path:
    """A fake program (one fixed text) and, in ``<name>.facts/``, the answers it reads as data."""
    if facts is not None:
        folder = bin_dir / f"{name}.facts"
        folder.mkdir(exist_ok=True)
        for key, value in facts.items():
            (folder / key).write_text(value + "\n")
    program = bin_dir / name
    program.write_text(script)
    program.chmod(0o755)
    return program


def install(
    hw: Hardware, scratch: Path, *, read: list[Path] | None = None, use_landlock: bool = False
) -> None:
    """Set the environment, apply Landlock (`use_landlock`: reads under `read` and `scratch`,
    writes under `scratch`) and install the audit hook (irreversible). One piece because the steps
    must run in this order (fakes and environment, Landlock, `fork_exec` guard, hook) and the nested
    hook closes over what they set up: the programs allowed, the scratch folder, the worker's pid."""
    global LANDLOCK_ABI
    bin_dir = scratch / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = _write_fake(bin_dir, "nvidia-smi", NVIDIA_SMI, nvidia_smi_answers(hw))
    home = scratch / "home"
    home.mkdir(exist_ok=True)
    os.environ.update(
        {
            "PATH": str(bin_dir),
            "HOME": str(home),
            "HF_HOME": str(home / "hf"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "SGLANG_USE_MODELSCOPE": "false",
            "TMPDIR": str(scratch),
        }
    )
    allowed = {str(smi), "nvidia-smi"}
    denied_files: tuple[str, ...] = ()
    if hw.cpu is not None:
        allowed |= {str(fake_cpu.install(hw.cpu, scratch)), "lscpu"}
        denied_files = fake_cpu.DENIED_PREFIXES
    writable = (os.path.realpath(scratch) + os.sep, "/dev/null")
    programs = {os.fsencode(p) for p in allowed if os.sep in p}
    import _posixsubprocess
    import ctypes  # noqa: F401 - imported (and its library loaded) before the hook refuses dlopen

    if use_landlock:
        LANDLOCK_ABI = landlock.restrict([*(read or []), scratch], [scratch])
    fork_exec = _posixsubprocess.fork_exec

    def guarded_fork_exec(*args: Any) -> Any:
        executables = args[1] if len(args) > 1 else None
        if not executables or any(os.fsencode(e) not in programs for e in executables):
            DENIED.append(("_posixsubprocess.fork_exec", repr(executables)[:120]))
            raise PermissionError(errno.EPERM, "fork_exec disabled by the resolver")
        return fork_exec(*args)

    _posixsubprocess.fork_exec = guarded_fork_exec
    if hasattr(subprocess, "_fork_exec"):  # Python 3.12+ keeps its own reference
        subprocess._fork_exec = guarded_fork_exec
    worker_pid = os.getpid()

    def deny(event: str, detail: str, error: Exception) -> None:
        DENIED.append((event, detail[:120]))
        raise error

    def outside(path: str | None) -> bool:
        if path is None:
            return False
        real = os.path.realpath(path)
        return real != "/dev/null" and not (real + os.sep).startswith(writable[0])

    def hook(event: str, args: Any) -> None:
        if event == "open":
            path = _path(args[0])
            if denied_files and path is not None and path.startswith(denied_files):
                deny(
                    event,
                    path,
                    PermissionError(errno.EACCES, "this machine's file is no fact of the host", path),
                )
            if _writes(args) and outside(path):
                deny(
                    event,
                    str(path),
                    PermissionError(errno.EACCES, "writing outside its scratch folder", path),
                )
        elif event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                path = _path(args[i]) if i < len(args) else None
                if outside(path):
                    deny(
                        event, str(path), PermissionError(errno.EACCES, "changing files outside its scratch")
                    )
        elif event in _NETWORK_EVENTS:
            deny(event, repr(args), OSError(errno.ENETUNREACH, "network disabled by the resolver"))
        elif event == "subprocess.Popen":
            program = _program_of(args)
            if program not in allowed:
                deny(
                    event, program, FileNotFoundError(errno.ENOENT, "not available to the resolver", program)
                )
        elif event == "os.fork":
            if os.getpid() != worker_pid or sys._getframe(1).f_code not in _FORK_CODE:
                deny(event, "", PermissionError(errno.EPERM, "os.fork disabled by the resolver"))
        elif event in _EXEC_EVENTS or event in _LIMIT_EVENTS:
            deny(event, repr(args), PermissionError(errno.EPERM, f"{event} disabled by the resolver"))
        elif event in _CTYPES_EVENTS and _ARMED:
            deny(event, repr(args), OSError(errno.EPERM, f"{event} disabled by the resolver"))
        elif event == "import" and args[0] in _REIMPORTS:
            deny(event, str(args[0]), ImportError(f"{args[0]} is not imported again in the resolver"))

    sys.addaudithook(hook)
