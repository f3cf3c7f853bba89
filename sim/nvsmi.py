"""A fake `nvidia-smi` for the simulated host: a small Python script with the scenario's GPUs baked in."""

from __future__ import annotations

import json

from sim.scenario import Hardware

_SCRIPT = r'''#!{python}
"""Simulated nvidia-smi (optagent sim): answers --query-gpu and topo -m like the real tool."""
import sys

HW = {hw}
UNITS = {{"memory.total": " [MiB]", "memory.used": " [MiB]", "memory.free": " [MiB]", "power.limit": " [W]"}}


def value(field, i):
    cc = HW["sm"]
    return {{
        "index": str(i), "name": HW["name"], "memory.total": str(HW["mem"]), "memory.used": "0",
        "memory.free": str(HW["mem"]), "compute_cap": f"{{cc // 10}}.{{cc % 10}}",
        "driver_version": HW["driver"], "uuid": f"GPU-5a1f00d{{i}}-0000-4000-8000-00000000000{{i}}",
        "pci.bus_id": f"00000000:{{0x18 + 0x10 * i:02X}}:00.0", "utilization.gpu": "0", "power.limit": "600.00",
    }}.get(field)


def query(args):
    fields = [f.strip() for f in args["--query-gpu"].split(",") if f.strip()]
    fmt = [f.strip() for f in args.get("--format", "csv").split(",")]
    if "csv" not in fmt:
        print("Only CSV output is supported by this simulated nvidia-smi.", file=sys.stderr)
        return 2
    bad = [f for f in fields if value(f, 0) is None]
    if bad:
        print(f'Field "{{bad[0]}}" is not a valid field to query.', file=sys.stderr)
        return 2
    if "noheader" not in fmt:
        print(", ".join(f + ("" if "nounits" in fmt else UNITS.get(f, "")) for f in fields))
    for i in range(HW["count"]):
        vals = [value(f, i) + ("" if "nounits" in fmt else UNITS.get(f, "").replace(" [", " ").rstrip("]")) for f in fields]
        print(", ".join(vals))
    return 0


def link(i, j):
    if i == j:
        return "X"
    if HW["link"] == "nvlink":
        return "NV18"
    return "PHB" if i // 2 == j // 2 else "SYS"


def topo():
    n = HW["count"]
    print("\t" + "\t".join(f"GPU{{j}}" for j in range(n)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID")
    for i in range(n):
        cells = "\t".join(f" {{link(i, j)}} " if link(i, j) == "X" else link(i, j) for j in range(n))
        print(f"GPU{{i}}\t{{cells}}\t0-63\t0\t\tN/A")
    print()
    print("Legend:")
    print()
    for key, text in [
        ("X   ", "Self"),
        ("SYS ", "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)"),
        ("NODE", "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node"),
        ("PHB ", "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"),
        ("PXB ", "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)"),
        ("PIX ", "Connection traversing at most a single PCIe bridge"),
        ("NV# ", "Connection traversing a bonded set of # NVLinks"),
    ]:
        print(f"  {{key}} = {{text}}")
    return 0


def main(argv):
    if argv[:2] == ["topo", "-m"] or argv[:2] == ["topo", "--matrix"]:
        return topo()
    args = {{}}
    for a in argv:
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            args[k] = v
    if "--query-gpu" in args:
        return query(args)
    if argv:
        print(f"Invalid combination of input arguments: {{' '.join(argv)}}", file=sys.stderr)
        return 2
    print(f"NVIDIA-SMI {{HW['driver']}}    Driver Version: {{HW['driver']}}    CUDA Version: 13.0")
    for i in range(HW["count"]):
        print(f"|   {{i}}  {{HW['name']}}   {{HW['mem']}}MiB |")
    return 0


sys.exit(main(sys.argv[1:]))
'''


def render_nvidia_smi(hw: Hardware, *, python: str) -> str:
    """The text of the fake `nvidia-smi` script for `hw`, run by `python`."""
    data = {
        "name": hw.gpu_name,
        "count": hw.count,
        "mem": hw.memory_mib,
        "sm": hw.sm,
        "driver": hw.driver_version,
        "link": hw.interconnect.kind,
    }
    return _SCRIPT.format(python=python, hw=json.dumps(data))
