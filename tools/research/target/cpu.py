"""The host's CPU and memory as SGLang's CPU engine reads them at start-up, read through a transport.

SGLang 0.5.23 sizes a CPU server from the host (`sglang/srt/utils/common.py`): `platform.machine()`
(`is_host_cpu_x86`/`is_host_cpu_arm64`, :202-217), `torch.cpu._is_amx_tile_supported()` (:366),
and `get_cpu_memory_capacity()` (:911-927): `psutil.virtual_memory().total` (MemTotal), capped by
`/sys/fs/cgroup/memory.max`, divided by the NUMA nodes that hold a physical CPU the process may run
on (`lscpu -p=CPU,Core,Socket,Node` and the process's CPU affinity, :4456-4525). One shell call
reads the same files and runs the same `lscpu` on the host; nothing is read on this machine.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Any

SCRIPT = r"""
s() { printf '\n@@%s\n' "$1"; }
s arch; uname -m
s meminfo; grep '^MemTotal:' /proc/meminfo
s memory.max; cat /sys/fs/cgroup/memory.max 2>&1
s allowed; grep '^Cpus_allowed_list:' /proc/self/status
s lscpu; lscpu -p=CPU,Core,Socket,Node 2>&1
s flags; grep -m1 -E '^(flags|Features)[[:space:]]*:' /proc/cpuinfo
"""
FIELDS = ("arch", "count", "memory_mib", "memory_max", "numa_nodes", "amx")


@dataclass
class CpuFacts:
    """What SGLang's CPU engine reads of its host; a field it could not be read for is None, with the
    reason in `unknown`."""

    arch: str | None = None
    """`uname -m`: x86_64, aarch64 (SGLang's `platform.machine()`)."""
    count: int | None = None
    """CPUs the server's processes may run on (`Cpus_allowed_list`)."""
    memory_mib: int | float | None = None
    """MemTotal in MiB, exactly as psutil reads it (kB x 1024 bytes): a fraction when not whole."""
    memory_max: int | str | None = None
    """`/sys/fs/cgroup/memory.max` in bytes, or "max" when it sets no limit (the file says max, or
    there is none or it cannot be read: SGLang reads all three as no limit, common.py:883-893)."""
    numa_nodes: int | None = None
    """NUMA nodes holding a physical CPU the process may run on, counted as SGLang counts them."""
    amx: bool | None = None
    """`amx_tile` among the CPU's flags (what `torch.cpu._is_amx_tile_supported()` answers)."""
    unknown: dict[str, str] = field(default_factory=dict)
    """Field -> why it could not be read."""

    def known(self) -> dict[str, Any]:
        """The fields read, by name."""
        return {k: v for k, v in asdict(self).items() if k in FIELDS and v is not None}

    def summary(self) -> str:
        """One line: `x86_64, 2 CPUs, 24105 MiB, 1 NUMA node, AMX`."""
        mem = f"{self.memory_mib:.0f} MiB" if self.memory_mib is not None else "memory ?"
        limit = (
            "" if self.memory_max in (None, "max") else f" (cgroup limit {int(self.memory_max) >> 20} MiB)"
        )
        return (
            f"{self.arch or '?'}, {self.count if self.count is not None else '?'} CPUs, {mem}{limit}, "
            f"{self.numa_nodes if self.numa_nodes is not None else '?'} NUMA node(s)"
            + ({True: ", AMX", False: ", no AMX"}.get(self.amx, ""))  # type: ignore[arg-type]
        )


def _sections(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("@@"):
            name = line[2:].strip()
            out[name] = ""
        elif name is not None:
            out[name] += line + "\n"
    return {k: v.strip() for k, v in out.items()}


def parse_cpu_list(text: str) -> set[int]:
    """`0-3,8,10-11` -> {0, 1, 2, 3, 8, 10, 11} (the kernel's list format)."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def numa_nodes_of(lscpu: str, allowed: set[int]) -> int:
    """The NUMA nodes SGLang counts (`len(get_cpu_ids_by_node())`, common.py:4456-4525): per node the
    first CPU seen of each (core, socket), those the process may run on, nodes left with any."""
    first: dict[int, dict[tuple[int, int], int]] = {}
    for line in lscpu.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        parts = line.strip().split(",")
        if len(parts) != 4:
            continue  # SGLang skips a malformed line too
        cpu = int(parts[0])
        core, socket, node = (int(p) if p else 0 for p in parts[1:])
        first.setdefault(node, {}).setdefault((core, socket), cpu)
    return sum(1 for cores in first.values() if set(cores.values()) & allowed)


def parse_cpu_facts(text: str) -> CpuFacts:
    """The facts from the output of `SCRIPT` (sections `@@name`)."""
    sec = _sections(text)
    facts = CpuFacts()
    facts.arch = sec.get("arch") or None
    if facts.arch is None or " " in facts.arch:
        facts.arch, facts.unknown["arch"] = None, f"uname -m printed {sec.get('arch')!r}"
    words = sec.get("meminfo", "").split()
    if len(words) == 3 and words[1].isdigit() and words[2] == "kB":
        kib = int(words[1])
        facts.memory_mib = kib // 1024 if kib % 1024 == 0 else kib / 1024
    else:
        facts.unknown["memory_mib"] = f"no MemTotal in /proc/meminfo: {sec.get('meminfo', '')[:120]!r}"
    limit = sec.get("memory.max", "")
    if limit.isdigit():
        facts.memory_max = int(limit)
    elif limit == "max" or "No such file" in limit or "Permission denied" in limit:
        facts.memory_max = "max"
    else:
        facts.unknown["memory_max"] = f"/sys/fs/cgroup/memory.max read {limit[:120]!r}"
    allowed_line = sec.get("allowed", "").partition(":")[2].strip()
    allowed: set[int] | None = None
    with contextlib.suppress(ValueError):
        allowed = parse_cpu_list(allowed_line) if allowed_line else None
    if allowed:
        facts.count = len(allowed)
    else:
        facts.unknown["count"] = "no Cpus_allowed_list in /proc/self/status"
    lscpu = sec.get("lscpu", "")
    if allowed and any(ln and ln[0].isdigit() for ln in lscpu.splitlines()):
        facts.numa_nodes = numa_nodes_of(lscpu, allowed)
    elif allowed:
        reason = lscpu.splitlines()[-1] if lscpu else "no output"
        facts.unknown["numa_nodes"] = (
            f"lscpu -p=CPU,Core,Socket,Node failed on the host ({reason[:120]}); "
            "SGLang's CPU engine runs it at start-up (common.py:4459)"
        )
    else:
        facts.unknown["numa_nodes"] = "the CPUs the server may run on are unknown"
    flags = sec.get("flags", "")
    if flags:
        facts.amx = "amx_tile" in flags.partition(":")[2].split()
    else:
        facts.unknown["amx"] = "no flags line in /proc/cpuinfo"
    return facts


async def read_cpu(transport: Any, *, timeout: float = 60) -> CpuFacts:
    """Read the host's CPU facts through `transport` in one shell call (see the module docstring)."""
    result = await transport.run(["sh", "-c", SCRIPT], timeout=timeout)
    facts = parse_cpu_facts(result.stdout)
    if result.returncode != 0 and not facts.known():
        detail = (result.stderr or result.stdout).strip()[-200:]
        facts.unknown = {k: f"sh failed on the host (exit {result.returncode}): {detail}" for k in FIELDS}
    return facts
