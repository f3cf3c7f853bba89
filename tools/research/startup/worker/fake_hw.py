"""Fake ``torch`` and ``pynvml`` that answer hardware questions from given facts.

Only what SGLang asks about the machine is faithful: ``torch.cuda`` device
count, capability, name, memory; ``torch.version``; dtypes and ``finfo``;
NVML device queries.  Everything else in these modules is a permissive
stand-in (see :mod:`standins`), so importing SGLang's kernels-facing modules
does not fail.  Attributes that would make SGLang believe it runs on another
vendor's platform (``torch.npu``, ``torch.hpu``, ``torch.musa``...) are absent,
as they are on a CUDA build of PyTorch.

The finder that serves these modules is in ``fake_finder.py``.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

from .fake_cpu import CpuHost, build_torch_cpu, check_count, check_text
from .standins import STANDIN_MARK, StandIn, StandInModule


@dataclass(frozen=True)
class Hardware:
    """The facts a deployment's GPUs answer; on a CPU deployment (`cpu`, count 0) its host's."""

    sm: int  # compute capability as major*10+minor, e.g. 90
    count: int
    memory_mib: int
    name: str
    cuda_version: str = "12.9"
    torch_version: str = "2.9.1"
    triton_version: str = "3.5.1"
    multi_processor_count: int = 132
    cpu: CpuHost | None = None

    def __post_init__(self) -> None:
        for name in ("sm", "count", "memory_mib", "multi_processor_count"):
            check_count(f"gpu.{name}", getattr(self, name))
        for name in ("name", "cuda_version", "torch_version", "triton_version"):
            check_text(f"gpu.{name}", getattr(self, name), empty=name == "name")

    @classmethod
    def from_dict(cls, hw: dict[str, Any]) -> Hardware:
        """The facts of `hw`; ValueError for a value that is no fact of its kind (see `check_text`)."""
        known = {k: hw[k] for k in cls.__dataclass_fields__ if k in hw}
        if known.get("cpu") is not None:
            known["cpu"] = CpuHost.from_dict(known["cpu"])
        return cls(**known)

    @property
    def capability(self) -> tuple[int, int]:
        return self.sm // 10, self.sm % 10

    @property
    def total_bytes(self) -> int:
        return self.memory_mib * 2**20


# Names absent from a CUDA build of torch; `hasattr(torch, x)` must be False.
_ABSENT_TORCH_ATTRS = frozenset({"npu", "hpu", "musa", "mlu", "sail", "_sail"})


class _FakeModule(StandInModule):
    """A stand-in module that refuses a fixed set of attribute names."""

    absent: frozenset[str] = frozenset()

    def __getattr__(self, name: str) -> Any:
        if name in self.absent:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        return super().__getattr__(name)


class DType:
    """A torch dtype: compared by identity, printed and named like torch's (`torch.bfloat16`, of
    type `torch.dtype`), so a resolved value or a ModelConfig attribute holding one is rendered as
    the real one is (`resolution.to_json`, `model_config_facts`), never as a record of its fields."""

    __slots__ = ("name", "itemsize", "is_floating_point")

    def __init__(self, name: str, itemsize: int, is_floating_point: bool = True) -> None:
        self.name, self.itemsize, self.is_floating_point = name, itemsize, is_floating_point

    def __repr__(self) -> str:
        return f"torch.{self.name}"


DType.__name__ = DType.__qualname__ = "dtype"
DType.__module__ = "torch"


_DTYPES = [
    DType("float32", 4),
    DType("float64", 8),
    DType("float16", 2),
    DType("bfloat16", 2),
    DType("float8_e4m3fn", 1),
    DType("float8_e4m3fnuz", 1),
    DType("float8_e5m2", 1),
    DType("float8_e5m2fnuz", 1),
    DType("float8_e8m0fnu", 1),
    DType("float4_e2m1fn_x2", 1),
    DType("int8", 1, False),
    DType("uint8", 1, False),
    DType("int16", 2, False),
    DType("int32", 4, False),
    DType("int64", 8, False),
    DType("bool", 1, False),
]
_FINFO_MAX = {
    "float32": 3.4028234663852886e38,
    "float64": 1.7976931348623157e308,
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
    "float8_e4m3fn": 448.0,
    "float8_e4m3fnuz": 240.0,
    "float8_e5m2": 57344.0,
    "float8_e5m2fnuz": 57344.0,
}
_ALIASES = {"float": "float32", "half": "float16", "double": "float64", "int": "int32", "long": "int64"}


class finfo:
    """torch.finfo for the dtypes SGLang reads limits of."""

    def __init__(self, dtype: DType) -> None:
        self.max = _FINFO_MAX.get(dtype.name, 1.0)
        self.min = -self.max
        self.bits = dtype.itemsize * 8
        self.dtype = dtype.name


@dataclass(frozen=True)
class DeviceProperties:
    """Subset of torch.cuda's _CudaDeviceProperties."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    gcnArchName: str = "NVIDIA"


class _Library(StandIn):
    """torch.library.Library: custom-op registration, only its name is real."""

    def __init__(self, ns: str, kind: str = "DEF", dispatch_key: str = "") -> None:
        self.ns = ns
        self.m = types.SimpleNamespace(name=ns)


def _build_cuda(hw: Hardware) -> types.ModuleType:
    cuda = _FakeModule("torch.cuda")
    setattr(cuda, STANDIN_MARK, True)
    cuda.__path__ = []
    props = DeviceProperties(hw.name, *hw.capability, hw.total_bytes, hw.multi_processor_count)

    def _index(device: Any = None) -> int:
        if device is None:
            return 0
        if isinstance(device, int):
            return device
        text = str(getattr(device, "index", None) or device)
        return int(text.rsplit(":", 1)[-1]) if ":" in text else 0

    def _check(device: Any = None) -> int:
        idx = _index(device)
        if not 0 <= idx < hw.count:
            raise AssertionError("Invalid device id")
        return idx

    cuda.is_available = lambda: hw.count > 0
    cuda.device_count = lambda: hw.count
    cuda.is_initialized = lambda: False
    cuda.current_device = lambda: 0
    cuda.set_device = lambda device: None
    cuda.synchronize = lambda device=None: None
    cuda.empty_cache = lambda: None

    def get_device_capability(device: Any = None) -> tuple[int, int]:
        _check(device)
        return hw.capability

    def get_device_name(device: Any = None) -> str:
        _check(device)
        return hw.name

    def get_device_properties(device: Any = None) -> DeviceProperties:
        _check(device)
        return props

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        _check(device)
        return hw.total_bytes, hw.total_bytes  # (free, total) of an idle GPU

    cuda.get_device_capability = get_device_capability
    cuda.get_device_name = get_device_name
    cuda.get_device_properties = get_device_properties
    cuda.mem_get_info = mem_get_info
    cuda.is_bf16_supported = lambda including_emulation=True: hw.sm >= 80
    cuda.get_arch_list = lambda: [f"sm_{hw.sm}"]
    cuda.memory_allocated = lambda device=None: 0
    cuda.memory_reserved = lambda device=None: 0
    cuda._get_nvml_device_index = _check
    return cuda


def build_torch(hw: Hardware) -> dict[str, types.ModuleType]:
    """Return ``{module name: module}`` for the fake torch package."""
    torch = _FakeModule("torch")
    torch.absent = _ABSENT_TORCH_ATTRS
    setattr(torch, STANDIN_MARK, True)
    torch.__path__ = []
    torch.__version__ = hw.torch_version

    version = types.ModuleType("torch.version")
    version.cuda = hw.cuda_version
    version.hip = None
    version.__version__ = hw.torch_version
    version.git_version = "0" * 40

    cuda = _build_cuda(hw)
    torch.version, torch.cuda = version, cuda
    for dtype in _DTYPES:
        setattr(torch, dtype.name, dtype)
    for alias, target in _ALIASES.items():
        setattr(torch, alias, getattr(torch, target))
    torch.dtype = DType
    torch.finfo = finfo

    library = _FakeModule("torch.library")
    library.__path__ = []
    library.Library = _Library
    torch.library = library

    mods: dict[str, types.ModuleType] = {
        "torch": torch,
        "torch.version": version,
        "torch.cuda": cuda,
        "torch.library": library,
    }
    if hw.cpu is not None:  # SGLang's CPU engine asks torch.cpu about its host
        torch.cpu = mods["torch.cpu"] = build_torch_cpu(hw.cpu)
    for name in ("xpu", "mps"):  # present on CUDA builds, but unavailable
        sub = _FakeModule(f"torch.{name}")
        sub.__path__ = []
        sub.is_available = lambda: False
        sub.device_count = lambda: 0
        setattr(torch, name, sub)
        mods[f"torch.{name}"] = sub
    return mods


@dataclass(frozen=True)
class GPUTarget:
    """triton.backends.compiler.GPUTarget."""

    backend: str
    arch: int
    warp_size: int


def build_triton(hw: Hardware) -> dict[str, types.ModuleType]:
    """triton, whose active driver reports the fake GPU as its target."""
    triton = _FakeModule("triton")
    setattr(triton, STANDIN_MARK, True)
    triton.__path__ = []
    triton.__version__ = hw.triton_version
    runtime = _FakeModule("triton.runtime")
    runtime.__path__ = []
    target = GPUTarget("cuda", hw.sm, 32)
    active = types.SimpleNamespace(get_current_target=lambda: target, get_current_device=lambda: 0)
    runtime.driver = types.SimpleNamespace(active=active)
    triton.runtime = runtime
    return {"triton": triton, "triton.runtime": runtime}


def build_pynvml(hw: Hardware) -> types.ModuleType:
    """A pynvml (nvidia-ml-py) answering device queries from ``hw``."""
    nvml = _FakeModule("pynvml")
    setattr(nvml, STANDIN_MARK, True)

    class NVMLError(Exception):
        pass

    @dataclass
    class Memory:
        total: int
        free: int
        used: int = 0

    def handle(index: int) -> int:
        if not 0 <= index < hw.count:
            raise NVMLError("Invalid Argument")
        return index

    nvml.NVMLError = NVMLError
    nvml.nvmlInit = lambda: None
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: hw.count
    nvml.nvmlDeviceGetHandleByIndex = handle
    nvml.nvmlDeviceGetCudaComputeCapability = lambda h: hw.capability
    nvml.nvmlDeviceGetName = lambda h: hw.name
    nvml.nvmlDeviceGetMemoryInfo = lambda h: Memory(hw.total_bytes, hw.total_bytes)
    return nvml


NVIDIA_SMI = """#!/bin/sh
# Fake nvidia-smi: answers --query-gpu=<field> from the files of nvidia-smi.facts beside it, read as
# data (never run as code).
case "$*" in
    *--query-gpu=memory.total*) key=memory.total ;;
    *--query-gpu=compute_cap*) key=compute_cap ;;
    *--query-gpu=name*) key=name ;;
    *--query-gpu=driver_version*) key=driver_version ;;
    *--query-gpu=count*) key=count ;;
    *) echo "fake nvidia-smi: unsupported query: $*" >&2; exit 9 ;;
esac
facts="${0%/*}/nvidia-smi.facts"
IFS= read -r value < "$facts/$key"
IFS= read -r count < "$facts/count"
i=0
while [ "$i" -lt "$count" ]; do printf '%s\\n' "$value"; i=$((i+1)); done
"""
"""The fake `nvidia-smi`: one text for every deployment; the facts are files it reads."""


def nvidia_smi_answers(hw: Hardware) -> dict[str, str]:
    """What the fake `nvidia-smi` answers per query field (one line per GPU)."""
    major, minor = hw.capability
    return {
        "memory.total": str(hw.memory_mib),
        "compute_cap": f"{major}.{minor}",
        "name": hw.name,
        "driver_version": "570.00.00",
        "count": str(hw.count),
    }
