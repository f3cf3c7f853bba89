"""The host of a CPU deployment (SGLang's CPU engine, ``--device cpu``), answered from its facts.

What SGLang 0.5.23 asks of the machine while it resolves a CPU server's arguments, and nothing else:

* ``torch.cpu.is_available()`` (True) and ``torch.cpu._is_amx_tile_supported()`` (the host's
  ``amx_tile`` flag), read by ``is_host_cpu_x86``/``is_host_cpu_arm64`` and at the import of
  ``utils/common.py`` (:202-217, :366);
* ``platform.machine()``: the host's ``uname -m``;
* ``psutil.virtual_memory().total`` and ``psutil.Process().cpu_affinity()`` (common.py:921, :4498);
* ``lscpu -p=CPU,Core,Socket,Node`` (common.py:4459): one CPU per allowed CPU, spread over the
  NUMA nodes SGLang counts on the host, so ``len(get_cpu_ids_by_node())`` is that count;
* ``/sys/fs/cgroup/memory.max`` (common.py:922): the host's limit, or ``max``.

Any other question to ``psutil.virtual_memory()`` or ``psutil.Process()`` raises here (an answer
through this file is never SGLang's refusal: ``errors.py``); the research machine's own cgroup,
meminfo and NUMA files are denied (``sandbox.py``).
"""

from __future__ import annotations

import builtins
import os
import platform
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .standins import STANDIN_MARK, StandInModule

HOST_FILES = ("/sys/fs/cgroup/memory.max",)
"""Host files SGLang reads while it resolves a CPU server, served from the facts."""
DENIED_PREFIXES = ("/sys/fs/cgroup/", "/proc/meminfo", "/sys/devices/system/node/")
"""The research machine's own memory and NUMA files: never an answer about the host."""


@dataclass(frozen=True)
class CpuHost:
    """The facts of the CPU host (`tools.research.target.cpu.CpuFacts`, all known)."""

    arch: str
    count: int
    memory_mib: float
    memory_max: int | str  # bytes, or "max"
    numa_nodes: int
    amx: bool

    def __post_init__(self) -> None:
        check_text("cpu.arch", self.arch)
        for name in ("count", "numa_nodes"):
            check_count(f"cpu.{name}", getattr(self, name))
        if (
            isinstance(self.memory_mib, bool)
            or not isinstance(self.memory_mib, (int, float))
            or self.memory_mib < 0
        ):
            raise ValueError(f"cpu.memory_mib {self.memory_mib!r} is no memory size")
        if self.memory_max != "max":
            check_count("cpu.memory_max", self.memory_max)
        if not isinstance(self.amx, bool):
            raise ValueError(f"cpu.amx {self.amx!r} is not true or false")

    @classmethod
    def from_dict(cls, facts: dict[str, Any]) -> CpuHost:
        return cls(**{k: facts[k] for k in cls.__dataclass_fields__})

    @property
    def total_bytes(self) -> int:
        """MemTotal in bytes, as psutil reads it (MiB given exactly, fractions included)."""
        return round(self.memory_mib * 2**20)

    @property
    def cpus(self) -> list[int]:
        """The CPU ids the fakes report: one per CPU the server may run on."""
        return list(range(max(self.count, self.numa_nodes)))


class _Answers:
    """An object answering only the attributes it was given; anything else is no fact here."""

    def __init__(self, what: str, **answers: Any) -> None:
        self._what = what
        vars(self).update(answers)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"{self._what}.{name} is not a fact of the host known to the resolver")


def build_torch_cpu(host: CpuHost) -> types.ModuleType:
    """``torch.cpu`` of a host that runs SGLang's CPU engine."""
    cpu = StandInModule("torch.cpu")
    setattr(cpu, STANDIN_MARK, True)
    cpu.__path__ = []
    cpu.is_available = lambda: True
    cpu.device_count = lambda: 1
    cpu.current_device = lambda: "cpu"
    cpu.set_device = lambda device: None
    cpu.synchronize = lambda device=None: None
    cpu._is_amx_tile_supported = lambda: host.amx
    return cpu


def build_psutil(host: CpuHost) -> types.ModuleType:
    """A psutil answering the host's total memory and the CPUs the server may run on."""
    psutil = StandInModule("psutil")
    setattr(psutil, STANDIN_MARK, True)

    def virtual_memory() -> _Answers:
        return _Answers("psutil.virtual_memory()", total=host.total_bytes)

    def process(pid: int | None = None) -> _Answers:
        return _Answers("psutil.Process()", cpu_affinity=lambda cpus=None: list(host.cpus))

    psutil.virtual_memory = virtual_memory
    psutil.Process = process
    return psutil


LSCPU = """#!/bin/sh
# Fake lscpu: the CPU topology of the host's facts, for `lscpu -p=CPU,Core,Socket,Node` only, printed
# from the file lscpu.facts beside it (data, never run as code).
case "$*" in
    *-p=CPU,Core,Socket,Node*) while IFS= read -r line; do printf '%s\\n' "$line"; done < "${0%/*}/lscpu.facts" ;;
    *) echo "fake lscpu: unsupported: $*" >&2; exit 9 ;;
esac
"""
"""The fake `lscpu` (shell builtins only: PATH holds no other program); the topology is a file."""


def lscpu_rows(host: CpuHost) -> str:
    """What `lscpu -p=CPU,Core,Socket,Node` prints for the host's NUMA count."""
    cpus = host.cpus
    rows = [f"{cpu},{cpu},0,{cpu * host.numa_nodes // len(cpus)}" for cpu in cpus] if host.numa_nodes else []
    return "".join(f"{row}\n" for row in ["# CPU,Core,Socket,Node", *rows])


def check_count(name: str, value: Any) -> None:
    """ValueError unless `value` is a whole number >= 0 (a count, a size, an SM)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} {value!r} is not a whole number")


def check_text(name: str, value: Any, *, empty: bool = True) -> None:
    """ValueError unless `value` is one line of printable text (at most 200 characters): a name
    the fakes print as data, never a line break or a control character."""
    if not isinstance(value, str) or len(value) > 200 or not value.isprintable() or (not value and not empty):
        raise ValueError(f"{name} {value!r} is not one line of printable text")


def host_file_texts(host: CpuHost) -> dict[str, str]:
    """What each of `HOST_FILES` says on the host."""
    return {"/sys/fs/cgroup/memory.max": f"{host.memory_max}\n"}


def install(host: CpuHost, scratch: Path) -> Path:
    """Make this process answer as the host: ``platform.machine()``, and ``open()`` of `HOST_FILES`
    served from copies in `scratch`; return the fake ``lscpu`` written into ``scratch/bin``."""
    platform.machine = lambda: host.arch
    copies: dict[str, str] = {}
    for i, (path, text) in enumerate(host_file_texts(host).items()):
        copy = scratch / f"host-file-{i}"
        copy.write_text(text)
        copies[path] = str(copy)
    real_open = builtins.open

    def open_as_host(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, (str, os.PathLike)) and os.fspath(file) in copies:
            file = copies[os.fspath(file)]
        return real_open(file, *args, **kwargs)

    builtins.open = open_as_host
    lscpu = scratch / "bin" / "lscpu"
    lscpu.parent.mkdir(parents=True, exist_ok=True)
    (scratch / "bin" / "lscpu.facts").write_text(lscpu_rows(host))
    lscpu.write_text(LSCPU)
    lscpu.chmod(0o755)
    return lscpu
