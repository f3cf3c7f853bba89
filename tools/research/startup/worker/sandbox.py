"""Keep SGLang's start-up probes inside the resolver process.

* Subprocesses: ``PATH`` holds only a directory with a fake ``nvidia-smi``
  answering from the hardware facts; an audit hook refuses to start any other
  program (as if it were not installed: ``FileNotFoundError``).
* Network: an audit hook refuses every connect / name lookup (``OSError``).
* Files: HOME and the Hugging Face caches point into a throw-away directory
  and the hubs are set offline, so nothing is downloaded or read from the
  user's caches.
* A CPU host (``hw.cpu``): ``lscpu``, ``platform.machine()`` and the cgroup
  limit answer from its facts (``fake_cpu.py``); this machine's own cgroup,
  meminfo and NUMA files are refused (``PermissionError``).
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any

from . import fake_cpu
from .fake_hw import Hardware, nvidia_smi_script

_NETWORK_EVENTS = frozenset(
    {
        "socket.connect",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
        "socket.sendto",
        "socket.sendmsg",
    }
)
_EXEC_EVENTS = frozenset({"os.system", "os.exec", "os.posix_spawn", "os.spawn"})

#: Every refused probe, as (event, detail), for the report.
DENIED: list[tuple[str, str]] = []


def _program_of(args: Any) -> str:
    """Best-effort program path from a ``subprocess.Popen`` audit event."""
    executable, argv = args[0], args[1]
    if executable:
        return os.fsdecode(executable)
    if isinstance(argv, (list, tuple)) and argv:
        return os.fsdecode(argv[0])
    return os.fsdecode(argv)


def install(hw: Hardware, scratch: Path) -> None:
    """Set the environment and install the audit hook (irreversible)."""
    bin_dir = scratch / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(nvidia_smi_script(hw))
    smi.chmod(0o755)
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

    def hook(event: str, args: Any) -> None:
        if event == "open" and denied_files and isinstance(args[0], (str, bytes)):
            path = os.fsdecode(args[0])
            if path.startswith(denied_files):
                DENIED.append((event, path[:120]))
                raise PermissionError(errno.EACCES, "this machine's file is no fact of the host", path)
        elif event in _NETWORK_EVENTS:
            DENIED.append((event, repr(args)[:120]))
            raise OSError(errno.ENETUNREACH, "network disabled by the resolver")
        if event == "subprocess.Popen":
            program = _program_of(args)
            if program not in allowed:
                DENIED.append((event, program[:120]))
                raise FileNotFoundError(errno.ENOENT, "not available to the resolver", program)
        elif event in _EXEC_EVENTS:
            DENIED.append((event, repr(args)[:120]))
            raise PermissionError(errno.EPERM, f"{event} disabled by the resolver")

    sys.addaudithook(hook)
