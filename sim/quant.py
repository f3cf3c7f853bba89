"""Checkpoint quantization read from `config.json`'s `quantization_config`: bytes per weight and KV.

SGLang 0.5.23 reads the same block (`configs/model_config.py`, `utils/common.py
get_quantization_config`): `quant_method` picks the weight format, `kv_cache_quant_algo` /
`kv_cache_scheme` make `--kv-cache-dtype auto` an FP8 cache (`mem_cache/kv_cache_dtype.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BF16 = 2.0


class QuantConfigError(ValueError):
    """A `quantization_config` the simulator cannot size."""


@dataclass(frozen=True)
class Quant:
    """How one checkpoint stores its weights."""

    method: str | None
    """`quant_method` of the checkpoint (None = plain BF16)."""
    dense_bytes: float
    """Bytes per parameter of the attention and dense-MLP linear layers."""
    expert_bytes: float
    """Bytes per parameter of the routed experts."""
    weight_only: bool
    """True when activations stay BF16 (int4 AWQ/GPTQ): compute runs at the BF16 rate."""
    kv_fp8: bool
    """The checkpoint ships an FP8 KV-cache scale, so `--kv-cache-dtype auto` resolves to FP8."""


PLAIN = Quant(None, BF16, BF16, True, False)


def _int4_bytes(bits: int, group: int) -> float:
    """Packed `bits`-bit weights plus one fp16 scale and one packed zero point per group."""
    group = group if group > 0 else 4096  # per-channel
    return bits / 8 + (2 + bits / 8) / group


def _kv_fp8(qc: dict[str, Any]) -> bool:
    algo = qc.get("kv_cache_quant_algo")
    scheme = qc.get("kv_cache_scheme")
    if algo is None and isinstance(scheme, dict):
        algo = "FP8" if scheme.get("type") == "float" and scheme.get("num_bits") == 8 else None
    return isinstance(algo, str) and algo.upper() == "FP8"


def _compressed_tensors(qc: dict[str, Any]) -> tuple[float, bool]:
    """(bytes per weight, weight-only) of the first `config_groups` entry."""
    for group in (qc.get("config_groups") or {}).values():
        weights = (group or {}).get("weights") or {}
        bits = int(weights.get("num_bits", 8))
        acts = (group or {}).get("input_activations")
        if weights.get("type") == "float" or bits == 8:
            return bits / 8, acts is None
        return _int4_bytes(bits, int(weights.get("group_size") or 128)), acts is None
    return 1.0, False


def parse_quant(config: dict[str, Any], where: str = "config.json") -> Quant:
    """The `Quant` of a config dict (top level or nested `text_config`)."""
    qc = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")
    if not qc:
        return PLAIN
    if not isinstance(qc, dict):
        raise QuantConfigError(f"{where}: quantization_config must be an object")
    method = str(qc.get("quant_method") or "").lower()
    kv = _kv_fp8(qc)
    if method in ("fp8", "w8a8_fp8", "fbgemm_fp8"):
        # Block-wise (128x128) or per-channel fp32 scales: < 0.1% on top of one byte per weight.
        return Quant(method, 1.0, 1.0, False, kv)
    if method == "mxfp4":
        # e2m1 values + one e8m0 scale per 32: 4.25 bits. SGLang's Mxfp4Config quantizes the MoE
        # experts only; attention, router, embeddings and lm_head stay BF16 (gpt-oss lists them
        # in modules_to_not_convert).
        return Quant(method, BF16, 4.25 / 8, False, kv)
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin", "moe_wna16"):
        bits = int(qc.get("bits") or qc.get("w_bit") or 4)
        group = int(qc.get("group_size") or qc.get("q_group_size") or 128)
        per_param = _int4_bytes(bits, group)
        return Quant(method, per_param, per_param, True, kv)
    if method in ("modelopt", "modelopt_fp8", "modelopt_fp4"):
        algo = str(qc.get("quant_algo") or ("NVFP4" if method == "modelopt_fp4" else "FP8")).upper()
        per_param = 0.5 + 1 / 16 if "FP4" in algo else 1.0  # NVFP4: fp8 scale per 16 values
        return Quant(method, per_param, per_param, False, kv)
    if method == "compressed-tensors":
        per_param, weight_only = _compressed_tensors(qc)
        return Quant(method, per_param, per_param, weight_only, kv)
    raise QuantConfigError(
        f"{where}: quantization_config.quant_method {method or '(none)'!r} is not simulated "
        "(fp8, mxfp4, awq, gptq, modelopt, compressed-tensors are)"
    )


def compute_speedup(quant: Quant, *, sm: int, moe_kernel: str, experts: bool) -> float:
    """Tensor-core rate of a quantized GEMM relative to BF16 on this GPU and kernel."""
    if quant.method is None or quant.weight_only:
        return 1.0
    if experts and quant.method == "mxfp4":
        # flashinfer_mxfp4 on SM100/SM120 runs MXFP8 activations x MXFP4 weights (fp8 rate);
        # triton_kernel and the SM90 paths dequantize to BF16 (layers/quantization/mxfp4.py).
        return 2.0 if moe_kernel == "flashinfer_mxfp4" and sm in (100, 103, 120) else 1.0
    if not experts and quant.dense_bytes >= BF16:
        return 1.0
    if quant.dense_bytes < 1.0 and sm in (100, 103, 120):
        return 4.0  # NVFP4 tensor cores
    return 2.0 if sm >= 89 else 1.0  # FP8 tensor cores from Ada/Hopper on; Ampere runs W8A16
