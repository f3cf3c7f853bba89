"""Platform predicates of SGLang's code as hardware facts (issue 10, item 2).

`is_sm90_supported()`, `_is_sm100_supported`, `get_platform().is_sm90`, `is_blackwell()`,
`is_cuda()`, `is_hip()`, `is_npu()`, `is_flashinfer_available()`: the name decides, the facts
(`gpu.sm`, `gpu.vendor`, `software.flashinfer`, `software.cuda` for `is_hopper_with_cuda_12_3`)
answer; a missing fact is unknown, never a guess.
`smNN` means the SM major version (`is_sm100_supported` is true on SM100 and SM103). World sizes
(`world_size`, `tp_group.world_size`, `get_tensor_model_parallel_world_size()`) are topology facts:
1 on a single rank (tp = pp = dp = 1), the TP size where the name clearly is the TP size.
On SGLang's CPU engine (no GPU, `--device cpu`: `cpu_engine`) the host answers: `is_cpu()` from
the unit's `SGLANG_USE_CPU_ENGINE` and `cpu.arch`, the host-CPU and AMX predicates from `cpu.*`,
and what asks for a GPU device (`is_cuda`, the SM and FlashInfer checks, XPU/HPU/NPU/MPS) is false;
what the host's torch build decides (`is_hip`, `is_musa`, `is_cuda_alike`) stays unknown.
"""

from __future__ import annotations

import re
from typing import Any

_SM = re.compile(r"^sm_?(\d{2,3})(_or_(?:newer|later|above))?$")
_OTHER_VENDORS = ("hip", "rocm", "npu", "xpu", "cpu", "mps", "musa", "hpu", "gfx95", "gfx942", "aiter")


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()
"""The third truth value (re-exported by `tools.research.guard_eval`)."""


def platform(name: str, facts: dict[str, Any], out: Any) -> Any:
    """A platform predicate (`is_sm90_supported`, `_is_cuda`, `is_hip`, ...) as a hardware fact;
    None when `name` is not a platform predicate."""
    n = name.lstrip("_").lower()
    if not n.startswith("is_"):
        return None
    n = n[3:].removesuffix("_supported").removesuffix("_available").removesuffix("_device")
    if cpu_engine(facts):
        return _on_cpu(n, facts, out)
    if m := _WITH_CUDA.match(n):  # `is_hopper_with_cuda_12_3`: the GPU and the CUDA it runs
        gpu = platform(f"is_{m.group(1)}", facts, out)
        return gpu if gpu is not True else _cuda_at_least(facts, (int(m.group(2)), int(m.group(3))), out)
    sm = facts.get("gpu.sm")
    vendor = facts.get("gpu.vendor") or ("nvidia" if sm is not None else None)
    m = _SM.match(n)
    if m:
        if sm is None:
            out.missing.append("gpu.sm")
            return UNKNOWN
        want = int(m.group(1)) // 10
        out.used.append(f"gpu.sm = {sm}")
        return sm // 10 >= want if m.group(2) else sm // 10 == want
    if n in ("blackwell", "hopper"):
        if sm is None:
            out.missing.append("gpu.sm")
            return UNKNOWN
        out.used.append(f"gpu.sm = {sm}")
        return sm >= 100 if n == "blackwell" else sm // 10 == 9
    if n in ("cuda", "cuda_alike", "nvidia"):
        if vendor is None:
            out.missing.append("gpu.vendor")
            return UNKNOWN
        out.used.append(f"gpu vendor = {vendor}")
        return vendor == "nvidia"
    if n in _OTHER_VENDORS:
        if vendor is None:
            out.missing.append("gpu.vendor")
            return UNKNOWN
        out.used.append(f"gpu vendor = {vendor}")
        return False if vendor == "nvidia" else UNKNOWN
    if n == "flashinfer":
        if "software.flashinfer" in facts:
            return bool(facts["software.flashinfer"])
        out.missing.append("software.flashinfer")
        return UNKNOWN
    return None


def cpu_engine(facts: dict[str, Any]) -> bool:
    """Whether the deployment runs SGLang's CPU engine: no GPU, and `--device cpu` in its unit."""
    return facts.get("gpu.count") == 0 and facts.get("flag.device") == "cpu"


# 0.5.23 sglang/srt/utils/common.py: is_host_cpu_x86 :202-208, is_host_cpu_arm64 :211-217
_HOST_ARCH = {"host_cpu_x86": ("x86_64", "amd64", "i386", "i686"), "host_cpu_arm64": ("aarch64", "arm64")}
# Predicates that ask torch for a device of their kind (`torch.cuda.is_available()`, the SM
# checks through `is_cuda()`, FlashInfer's `is_cuda()`, `torch.xpu/hpu/npu/mps`): no such device
_NEEDS_A_DEVICE = ("cuda", "nvidia", "blackwell", "hopper", "flashinfer", "xpu", "hpu", "npu", "mps")


def _on_cpu(n: str, facts: dict[str, Any], out: Any) -> Any:
    """A platform predicate on SGLang's CPU engine; None when `n` is none (see the module doc)."""
    if n in _HOST_ARCH or n == "cpu":
        arch = facts.get("cpu.arch")
        if arch is None:
            out.missing.append("cpu.arch")
            return UNKNOWN
        out.used.append(f"cpu.arch = {arch}")
        on_arch = str(arch).lower() in (_HOST_ARCH.get(n) or sum(_HOST_ARCH.values(), ()))
        if n != "cpu" or not on_arch:
            return on_arch
        # is_cpu() :221-225: only with SGLANG_USE_CPU_ENGINE=1 (the unit's, or set elsewhere: unknown)
        engine = facts.get("env.SGLANG_USE_CPU_ENGINE")
        if engine is None:
            out.missing.append("env.SGLANG_USE_CPU_ENGINE")
            return UNKNOWN
        out.used.append(f"SGLANG_USE_CPU_ENGINE={engine}")
        return engine == "1"
    if n == "cpu_amx":  # cpu_has_amx_support() :371-372: AMX tiles and sgl_kernel's CPU ops
        if facts.get("cpu.amx") is False:
            out.used.append("cpu.amx = False")
            return False
        out.missing.append("sgl_kernel CPU ops" if facts.get("cpu.amx") else "cpu.amx")
        return UNKNOWN
    if n in _NEEDS_A_DEVICE or _SM.match(n) or _WITH_CUDA.match(n):
        out.used.append("no GPU (SGLang's CPU engine)")
        return False
    if n in _OTHER_VENDORS or n == "cuda_alike":  # the host's torch build decides (torch.version.*)
        out.missing.append("the host's torch build")
        return UNKNOWN
    return None


_WITH_CUDA = re.compile(r"^(\w+?)_with_cuda_(\d+)_(\d+)$")


def _cuda_at_least(facts: dict[str, Any], want: tuple[int, int], out: Any) -> Any:
    cuda = facts.get("software.cuda")
    if not isinstance(cuda, str) or not re.match(r"\d+\.\d+", cuda):
        out.missing.append("software.cuda")
        return UNKNOWN
    out.used.append(f"CUDA {cuda}")
    major, minor = (int(x) for x in cuda.split(".")[:2])
    return (major, minor) >= want


_TP_SIZE = re.compile(r"^(tp_size|tp_world_size|get_tensor_model_parallel_world_size)$")
_TP_GROUP = re.compile(r"(^|\.)(tp_group|get_tp_group\(\))$")
_WORLD = re.compile(r"^(get_)?(\w+_)?(world_size|tp_size)$")
_NOT_THE_SIZE = re.compile(r"^(get_)?(max|min|expected|target|new|old|orig|prev|default)_")
"""`max_world_size` is a limit, `expected_world_size` a caller's claim: not the running size."""


PARALLEL_SIZES = ("tp_size", "pp_size", "dp_size")
"""The server arguments whose product is the number of ranks (`single_rank`)."""


def single_rank(facts: dict[str, Any]) -> bool | None:
    """Whether the deployment runs one rank (tp = pp = dp = 1); None when a size is not known."""
    sizes = [facts.get(f"server.{k}") for k in PARALLEL_SIZES]
    if any(s is None for s in sizes):
        return None
    return all(s == 1 for s in sizes)


def topology(name: str, facts: dict[str, Any], out: Any, *, receiver: str = "") -> Any:
    """A world size in the code (`world_size`, `tp_group.world_size`, `self.tp_size`,
    `get_tensor_model_parallel_world_size()`) as a deployment fact; None when `name` is none.

    On one rank every group's size is 1. Otherwise only names that are clearly the tensor-parallel
    size are `server.tp_size`; any other world size (it may span pipeline or data-parallel ranks, or
    be a subgroup's) stays unknown."""
    if not _WORLD.match(name) or _NOT_THE_SIZE.match(name):
        return None
    tp = bool(_TP_SIZE.match(name)) and receiver in ("", "self")
    tp |= name == "world_size" and bool(_TP_GROUP.search(receiver))
    if single_rank(facts):
        out.used.append("tp_size = pp_size = dp_size = 1 (one rank)")
        return 1
    if tp and "server.tp_size" in facts:
        out.used.append(f"server.tp_size = {facts['server.tp_size']!r}")
        return facts["server.tp_size"]
    if tp:
        out.missing.append("server.tp_size")
    else:
        out.runtime.append(name)
    return UNKNOWN
