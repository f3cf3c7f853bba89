"""The target's GPUs and how they are linked, read from `nvidia-smi` through a transport."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

QUERY = ["--query-gpu=index,name,memory.total,compute_cap,driver_version", "--format=csv,noheader,nounits"]


class HardwareError(Exception):
    """nvidia-smi is missing, failed, or printed something unreadable."""


@dataclass
class GPU:
    """One GPU: `compute_capability` like "9.0", `sm` like "sm90" (SGLang's naming)."""

    index: int
    name: str
    memory_mib: int
    compute_capability: str
    sm: str


@dataclass
class HardwareFacts:
    """GPUs, driver, and the interconnect: `nvlink`, `pcie`, `mixed` (some pairs NVLink) or `none`."""

    gpus: list[GPU]
    interconnect: str
    driver: str | None
    links: dict[str, dict[str, str]] = field(default_factory=dict)
    """`nvidia-smi topo -m` matrix: links["GPU0"]["GPU1"] == "NV18" | "PIX" | "SYS" ..."""

    @property
    def count(self) -> int:
        """Number of GPUs."""
        return len(self.gpus)

    @property
    def sm_archs(self) -> list[str]:
        """Distinct SM architectures, e.g. ["sm120"]."""
        return sorted({g.sm for g in self.gpus})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (with count and sm_archs)."""
        return {**asdict(self), "count": self.count, "sm_archs": self.sm_archs}

    def summary(self) -> str:
        """One line: `8x NVIDIA H100 80GB HBM3 (sm90, 81559 MiB), NVLink, driver 535.104.05`."""
        if not self.gpus:
            return "no GPUs"
        names = sorted({g.name for g in self.gpus})
        first = self.gpus[0]
        return (
            f"{self.count}x {' / '.join(names)} ({', '.join(self.sm_archs)}, {first.memory_mib} MiB), "
            f"{self.interconnect}, driver {self.driver}"
        )


def sm_arch(compute_capability: str) -> str:
    """ "9.0" → "sm90", "12.0" → "sm120", "8.6" → "sm86"."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", compute_capability)
    if not m:
        raise HardwareError(f"not a compute capability: {compute_capability!r}")
    return f"sm{m.group(1)}{m.group(2)}"


def parse_nvidia_smi(query_csv: str, topo: str = "") -> HardwareFacts:
    """Parse the `--query-gpu` CSV (index, name, memory.total, compute_cap, driver) and `topo -m`."""
    gpus, drivers = [], set()
    for row in query_csv.strip().splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) < 5:
            raise HardwareError(f"unexpected nvidia-smi line: {row!r}")
        index, name, memory, cap, driver = cells[0], ", ".join(cells[1:-3]), cells[-3], cells[-2], cells[-1]
        try:
            gpus.append(GPU(int(index), name, int(float(memory)), cap, sm_arch(cap)))
        except ValueError as e:
            raise HardwareError(f"unexpected nvidia-smi line: {row!r}") from e
        drivers.add(driver)
    links = parse_topology(topo)
    return HardwareFacts(gpus, _interconnect(links, len(gpus)), ", ".join(sorted(drivers)) or None, links)


def parse_topology(topo: str) -> dict[str, dict[str, str]]:
    """The GPU-to-GPU part of the `nvidia-smi topo -m` matrix."""
    lines = [ln for ln in topo.splitlines() if ln.strip()]
    header = next((ln for ln in lines if re.match(r"^\s+GPU0\b", ln)), None)
    if header is None:
        return {}
    columns = [c for c in re.split(r"\t+|\s{2,}", header.strip()) if c]
    gpu_cols = [c for c in columns if re.fullmatch(r"GPU\d+", c)]
    links: dict[str, dict[str, str]] = {}
    for ln in lines:
        m = re.match(r"^(GPU\d+)\s+(.*)$", ln)
        if not m:
            continue
        cells = re.split(r"\s+", m.group(2).strip())
        links[m.group(1)] = {
            col: cell for col, cell in zip(gpu_cols, cells, strict=False) if col != m.group(1)
        }
    return links


def _interconnect(links: dict[str, dict[str, str]], count: int) -> str:
    pairs = [v for row in links.values() for v in row.values()]
    if count < 2 or not pairs:
        return "none" if count < 2 else "unknown"
    nvlink = [p.startswith("NV") for p in pairs]
    return "nvlink" if all(nvlink) else "mixed" if any(nvlink) else "pcie"


async def read_hardware(
    transport: Any, nvidia_smi: str = "nvidia-smi", *, timeout: float = 60
) -> HardwareFacts:
    """Run nvidia-smi on the host (query and `topo -m`) and parse both."""
    query = await transport.run([nvidia_smi, *QUERY], timeout=timeout)
    if query.returncode != 0:
        detail = (query.stderr or query.stdout).strip()[-300:]
        if query.returncode == 127 or "not found" in detail or "No such file" in detail:
            raise HardwareError(
                f"{nvidia_smi} not found on the host: no NVIDIA driver, or set target.nvidia_smi"
            )
        raise HardwareError(f"{nvidia_smi} failed (exit {query.returncode}): {detail}")
    topo = await transport.run([nvidia_smi, "topo", "-m"], timeout=timeout)
    return parse_nvidia_smi(query.stdout, topo.stdout if topo.returncode == 0 else "")
