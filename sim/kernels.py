"""Which attention backend and MoE runner SGLang 0.5.23 picks for a model on a GPU, or why it refuses.

Defaults follow `arg_groups/model_override_base.py get_default_attn_backend` and the per-model
override registry (`arg_groups/model_overrides/gpt_oss.py`, `qwen3_moe.py`, `qwen3_5.py`,
`deepseek_v2.py`); the MoE kernel that runs under `auto` follows the quantization method
(`layers/quantization/`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from sim.modelinfo import ModelInfo

_MLA_ONLY = {"flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla", "dsa", "nsa", "qsa", "dsv4"}
_MLA_ONLY |= {"compressed", "minicpm_flashattn", "minicpm_flashinfer", "llada2_cfg_flashinfer"}
_NON_CUDA = {"aiter", "wave", "intel_amx", "ascend", "intel_xpu", "hpc_ops"}
_GPT_OSS_BACKENDS = ["triton", "trtllm_mha", "fa3", "fa4", "ascend", "intel_amx", "intel_xpu", "aiter"]
_QWEN3_MOE_FAMILY = {"Qwen3MoeForCausalLM", "Qwen3VLMoeForConditionalGeneration", "Qwen3NextForCausalLM"}
_QWEN3_MOE_FAMILY |= {"Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration"}
_SM100 = (100, 103)


class KernelError(Exception):
    """SGLang refuses the combination; `after_load` when it fails only once weights are loaded."""

    def __init__(self, message: str, *, after_load: bool = False) -> None:
        super().__init__(message)
        self.after_load = after_load


@dataclass(frozen=True)
class MoeChoice:
    """The MoE runner: what `/get_server_info` reports and the kernel that really runs."""

    reported: str
    """`moe_runner_backend` after resolution ("auto" unless an override or the user set it)."""
    kernel: str
    """The fused-MoE implementation in use ("triton", "flashinfer_mxfp4", "marlin", ...)."""


def _default_attention(args: argparse.Namespace, sm: int, model: ModelInfo) -> str:
    spec_topk_one = args.speculative_algorithm is None or (args.speculative_eagle_topk or 1) == 1
    if model.architecture == "GptOssForCausalLM":  # _gpt_oss_overrides
        return {100: "trtllm_mha", 103: "trtllm_mha", 90: "fa3"}.get(sm, "triton")
    if model.linear_attn_layers and sm in _SM100:  # _qwen3_5_hybrid_overrides
        # trtllm_mha unless the mamba radix cache runs without its extra buffer (overlap schedule
        # off, page size 1: overrides.py _mamba_radix_cache_resolution) with radix on and no spec.
        no_extra_buffer = args.disable_overlap_schedule and (args.page_size or 1) == 1
        plain = no_extra_buffer and not args.disable_radix_cache and args.speculative_algorithm is None
        trtllm_ok = spec_topk_one and (args.speculative_algorithm is None or args.speculative_eagle_topk)
        return "trtllm_mha" if trtllm_ok and not plain else "triton"
    if model.mla_kv_dim:
        if model.architecture == "DeepseekV3ForCausalLM" and sm in _SM100:
            return "trtllm_mla"  # model_overrides/deepseek_v2.py (DeepSeek V3/R1)
        return {90: "fa3", 100: "flashinfer", 103: "flashinfer"}.get(sm, "triton")
    if sm == 90 and spec_topk_one:
        return "fa3"  # flashinfer 0.6.1 regressed on Hopper (sglang#17411)
    if sm in _SM100 and spec_topk_one and (args.speculative_algorithm is None or args.speculative_eagle_topk):
        return "trtllm_mha"
    # SM120 and the rest: flashinfer, except for models with attention sinks.
    return "triton" if model.attention_sinks else "flashinfer"


def attention_backend(args: argparse.Namespace, sm: int, model: ModelInfo) -> str:
    """The resolved `--attention-backend`, or `KernelError` with SGLang's reason."""
    backend = args.attention_backend or _default_attention(args, sm, model)
    if backend in _MLA_ONLY and not model.mla_kv_dim:
        raise KernelError(f"Attention backend {backend} only supports MLA / sparse-attention models.")
    if backend in _NON_CUDA:
        raise KernelError(f"Attention backend {backend} is not available on a CUDA platform.")
    if model.architecture == "GptOssForCausalLM" and backend not in _GPT_OSS_BACKENDS:
        # arg_groups/model_hook.py handle_model_specific_adjustments
        raise KernelError(
            f"AssertionError: GptOssForCausalLM requires one of {_GPT_OSS_BACKENDS} attention backend, "
            f"but got the following backends\n- Prefill: {backend}\n- Decode: {backend}"
        )
    if backend == "fa3" and sm not in (80, 86, 89, 90):
        # layers/attention/attention_registry.py create_flashattention_v3_backend
        raise KernelError(
            "AssertionError: FlashAttention v3 Backend requires SM>=80 and SM<=90. "
            "Please use `--attention-backend flashinfer`.",
            after_load=True,
        )
    if backend == "fa4" and sm not in _SM100:
        raise KernelError("FlashAttention v4 backend requires an SM100-family GPU.", after_load=True)
    if backend == "trtllm_mha" and sm not in (90, 100, 103, 120):
        raise KernelError(
            "ValueError: TRTLLM MHA backend for decode is only supported on Hopper (SM90), "
            "Blackwell (SM100) and (SM120) GPUs. Please use a different decode backend."
        )
    return backend


def _auto_moe(args: argparse.Namespace, sm: int, model: ModelInfo, driver: tuple[int, ...]) -> MoeChoice:
    method = model.quant.method
    if model.architecture == "GptOssForCausalLM":  # _gpt_oss_overrides
        if method == "mxfp4" and sm in (*_SM100, 120):
            return MoeChoice("flashinfer_mxfp4", "flashinfer_mxfp4")
        if args.quantization is None and args.ep_size == 1:
            if sm >= 100 and driver >= (595,):
                return MoeChoice("triton", "triton")  # triton_kernels segfaults on Blackwell, driver 595+
            return MoeChoice("triton_kernel", "triton_kernel")
    if model.architecture in _QWEN3_MOE_FAMILY and sm in _SM100 and method in (None, "fp8", "modelopt_fp4"):
        return MoeChoice("flashinfer_trtllm", "flashinfer_trtllm")  # _qwen3_moe_family_overrides
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin", "moe_wna16"):
        return MoeChoice("auto", "marlin")  # int4 MoE runs the Marlin W4A16 kernels
    if method == "mxfp4":
        return MoeChoice("auto", "triton_kernel")
    return MoeChoice("auto", "triton")  # BF16 and FP8 (W8A8 block scales) use Triton fused_moe


def moe_runner(args: argparse.Namespace, sm: int, model: ModelInfo, driver: str = "580") -> MoeChoice:
    """The resolved MoE runner, or `KernelError` when the runner cannot serve this checkpoint/GPU."""
    runner = args.moe_runner_backend
    if not model.is_moe:
        return MoeChoice(runner, "none")
    version = tuple(int(p) for p in driver.split(".") if p.isdigit())
    if runner == "auto":
        return _auto_moe(args, sm, model, version)
    method = model.quant.method
    if runner.startswith("lora_"):
        raise KernelError(f"--moe-runner-backend {runner} requires --enable-lora.")
    if runner == "flashinfer_mxfp4":
        if method != "mxfp4":
            raise KernelError(
                "--moe-runner-backend flashinfer_mxfp4 needs an MXFP4 checkpoint "
                f"(quantization_config.quant_method is {method or 'absent: BF16'})."
            )
        if sm not in (90, *_SM100, 120):
            # layers/quantization/mxfp4.py Mxfp4MoEMethod.__init__
            raise KernelError(
                "NotImplementedError: moe_runner_backend=flashinfer_mxfp4 requires SM90, SM100, or SM120.",
                after_load=True,
            )
        return MoeChoice(runner, runner)
    if runner in {"deep_gemm", "marlin", "experimental_sgl_marlin", "humming"} and method is None:
        raise KernelError(f"--moe-runner-backend {runner} requires a quantized checkpoint (fp8/fp4/int4).")
    if runner in {"triton", "triton_kernel", "deep_gemm", "marlin", "experimental_sgl_marlin", "humming"}:
        return MoeChoice(runner, runner)
    if runner in ("flashinfer_trtllm", "flashinfer_trtllm_routed") and method not in (
        None,
        "fp8",
        "modelopt",
    ):
        raise KernelError(
            f"AssertionError: Invalid quantization '{method}'. FlashInfer TRTLLM MOE supports only: "
            "'modelopt_fp4', 'nvfp4_online', 'fp8', 'modelopt_fp8', 'modelopt_mixed', "
            "'compressed-tensors', or bfloat16 (None)."
        )
    if sm not in _SM100:
        raise KernelError(
            f"--moe-runner-backend {runner} requires an SM100-family (Blackwell B200/GB200) GPU."
        )
    return MoeChoice(runner, runner)
