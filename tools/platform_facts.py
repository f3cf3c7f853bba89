"""Platform predicates of SGLang's code as hardware facts (issue 10, item 2).

`is_sm90_supported()`, `_is_sm100_supported`, `get_platform().is_sm90`, `is_blackwell()`,
`is_cuda()`, `is_hip()`, `is_npu()`, `is_flashinfer_available()`: the name decides, the facts
(`gpu.sm`, `gpu.vendor`, `software.flashinfer`) answer; a missing fact is unknown, never a guess.
`smNN` means the SM major version (`is_sm100_supported` is true on SM100 and SM103).
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
"""The third truth value (re-exported by `tools.guard_eval`)."""


def platform(name: str, facts: dict[str, Any], out: Any) -> Any:
    """A platform predicate (`is_sm90_supported`, `_is_cuda`, `is_hip`, ...) as a hardware fact;
    None when `name` is not a platform predicate."""
    n = name.lstrip("_").lower()
    if not n.startswith("is_"):
        return None
    n = n[3:].removesuffix("_supported").removesuffix("_available").removesuffix("_device")
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
