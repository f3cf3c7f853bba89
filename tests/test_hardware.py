"""GPU facts from real nvidia-smi output samples, directly and through LocalTransport."""

from __future__ import annotations

import asyncio
import os
import shlex
import stat
from pathlib import Path

import pytest

from tools.deploy.remote import LocalTransport
from tools.research.target.hardware import HardwareError, parse_nvidia_smi, read_hardware, sm_arch

SAMPLES = Path(__file__).parent / "data" / "nvidia-smi"


def _sample(name: str) -> tuple[str, str]:
    return (SAMPLES / f"{name}.query.csv").read_text(), (SAMPLES / f"{name}.topo.txt").read_text()


def test_h100_nvlink_box():
    hw = parse_nvidia_smi(*_sample("h100-nvlink"))
    assert hw.count == 8 and hw.sm_archs == ["sm90"] and hw.driver == "535.104.05"
    assert hw.gpus[3].name == "NVIDIA H100 80GB HBM3" and hw.gpus[3].memory_mib == 81559
    assert hw.interconnect == "nvlink"
    assert hw.links["GPU0"]["GPU7"] == "NV18" and "NIC0" not in hw.links["GPU0"]
    assert hw.summary() == "8x NVIDIA H100 80GB HBM3 (sm90, 81559 MiB), nvlink, driver 535.104.05"


def test_blackwell_workstation_pcie_box():
    hw = parse_nvidia_smi(*_sample("rtx6000-pcie"))
    assert hw.count == 4 and hw.sm_archs == ["sm120"]
    assert hw.gpus[0].compute_capability == "12.0"
    assert hw.interconnect == "pcie"
    assert hw.links["GPU2"] == {"GPU0": "SYS", "GPU1": "SYS", "GPU3": "NODE"}


def test_single_gpu_and_partial_nvlink():
    assert parse_nvidia_smi(*_sample("l4-single")).interconnect == "none"
    query, topo = _sample("rtx6000-pcie")
    mixed = topo.replace("GPU0\t X \tNODE", "GPU0\t X \tNV4").replace("GPU1\tNODE\t X ", "GPU1\tNV4\t X ")
    assert parse_nvidia_smi(query, mixed).interconnect == "mixed"
    assert parse_nvidia_smi(query, "").interconnect == "unknown"


def test_sm_names_and_bad_output():
    assert [sm_arch(c) for c in ("8.0", "8.6", "9.0", "10.0", "12.0")] == [
        "sm80",
        "sm86",
        "sm90",
        "sm100",
        "sm120",
    ]
    with pytest.raises(HardwareError, match="unexpected nvidia-smi line"):
        parse_nvidia_smi("0, NVIDIA H100, lots, 9.0, 535\n")
    with pytest.raises(HardwareError, match="not a compute capability"):
        sm_arch("Hopper")


def _fake_nvidia_smi(bin_dir: Path, sample: str) -> Path:
    query, topo = (SAMPLES / f"{sample}.query.csv"), (SAMPLES / f"{sample}.topo.txt")
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = topo ]; then exec cat {shlex.quote(str(topo))}; fi\n'
        '[ "$1" = "--query-gpu=index,name,memory.total,compute_cap,driver_version" ] || exit 9\n'
        '[ "$2" = "--format=csv,noheader,nounits" ] || exit 9\n'
        f"exec cat {shlex.quote(str(query))}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_read_hardware_through_local_transport(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path, "rtx6000-pcie")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    hw = asyncio.run(read_hardware(LocalTransport()))
    assert hw.count == 4 and hw.sm_archs == ["sm120"] and hw.interconnect == "pcie"


def test_missing_or_failing_nvidia_smi(tmp_path):
    with pytest.raises(HardwareError, match="not found on the host"):
        asyncio.run(read_hardware(LocalTransport(), str(tmp_path / "no-nvidia-smi")))
    broken = tmp_path / "broken-smi"
    broken.write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate' >&2\nexit 9\n"
    )
    broken.chmod(0o755)
    with pytest.raises(HardwareError, match="failed \\(exit 9\\): NVIDIA-SMI has failed"):
        asyncio.run(read_hardware(LocalTransport(), str(broken)))
