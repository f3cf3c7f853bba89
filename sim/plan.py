"""What a launch command resolves to on a scenario's hardware, following SGLang 0.5.23's own rules.

`resolve_plan` turns parsed flags into a `Plan` (the settings that really take effect) or raises
`StartupError` with the message SGLang would stop with. Each rule cites where SGLang decides it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from sim.kernels import KernelError, attention_backend, moe_runner
from sim.modelinfo import ModelInfo
from sim.quant import compute_speedup
from sim.scenario import Scenario
from sim.serverinfo import resolved_server_args


class StartupError(Exception):
    """The server refuses to start; `after_load` is True when it fails only after loading weights."""

    def __init__(self, message: str, *, after_load: bool = False) -> None:
        super().__init__(message)
        self.after_load = after_load


# layers/attention/*: relative efficiency of each backend's decode kernel at reading the KV cache.
ATTN_EFFICIENCY = {"fa3": 1.0, "fa4": 1.05, "flashinfer": 0.95, "trtllm_mha": 1.0, "triton": 0.82}
ATTN_EFFICIENCY |= {"torch_native": 0.15, "flex_attention": 0.5}
# arg_groups/overrides.py `_FLASHINFER_ALLREDUCE_FUSION_ARCHS` (auto-enabled on SM90/SM100, TP > 1).
AR_FUSION_ARCHS = {"Qwen3MoeForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5MoeForConditionalGeneration"}
AR_FUSION_ARCHS |= {"Qwen3_5ForConditionalGeneration", "DeepseekV3ForCausalLM", "GptOssForCausalLM"}
_SPEC_ALGOS = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO", "FROZEN_KV_MTP"}

Lossy = Literal["drift", "garbage"] | None


@dataclass(frozen=True)
class Plan:
    """The settings in force once the server has resolved its arguments."""

    tp: int
    attention_backend: str
    moe_runner: str
    """The MoE kernel that runs ("none" for a dense model); see `sim.kernels.MoeChoice`."""
    spec_steps: int
    """Speculative draft steps (0 = no speculative decoding)."""
    spec_topk: int
    spec_draft_tokens: int
    cuda_graph_max_bs: int
    """Largest decode batch replayed from a CUDA graph (0 = CUDA graphs disabled)."""
    chunked_prefill: int
    max_running: int | None
    mem_fraction_static: float
    kv_dtype_bytes: float
    fused_moe_sum: bool
    ar_fusion: bool
    torch_compile_max_bs: int
    """Batches up to this size run torch.compile'd kernels (0 = off)."""
    mixed_chunk: bool
    conservativeness: float
    radix_cache: bool
    """Prefix reuse across requests (off with `--disable-radix-cache`)."""
    schedule_policy: str
    """`--schedule-policy`: "lpm" orders the queue by cached prefix (`sim.scheduler`); the rest run as fcfs."""
    weight_bytes_per_gpu: float
    kv_budget_bytes: float
    activation_headroom_tokens: int
    """Tokens one forward pass may carry before the activations run out of memory."""
    lossy: Lossy
    hangs_in_warmup: bool
    extra_startup_s: float
    dense_speedup: float = 1.0
    """Tensor-core rate of the attention/dense GEMMs relative to BF16 (FP8 weights: 2x)."""
    expert_speedup: float = 1.0
    """Same for the routed experts (MXFP4 on flashinfer_mxfp4 runs MXFP8 activations: 2x)."""
    dense_weight_bytes: float = 2.0
    expert_weight_bytes: float = 2.0
    resolved: dict[str, Any] = field(default_factory=dict)
    """Server args SGLang resolves at start-up (reported at the top level of `/get_server_info`)."""


def _gpu_mem_defaults(mem_mib: int, tp: int) -> tuple[int, int]:
    """arg_groups/memory_hook.py `_handle_gpu_memory_settings`: (chunked_prefill_size, decode max_bs)."""
    gib = mem_mib / 1024
    if gib < 20:
        return 2048, 8
    if gib < 35:
        return 4096, 48 if tp < 4 else 160
    if gib < 60:
        return 4096, 32 if tp < 4 else 160
    if gib < 160:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def _speculative(args: argparse.Namespace, model: ModelInfo) -> tuple[int, int, int]:
    algo = args.speculative_algorithm
    if algo is None:
        return 0, 1, 1
    if algo.upper() not in _SPEC_ALGOS:
        raise StartupError(f"ValueError: Unknown speculative algorithm name: {algo}")
    if algo.upper() in {"EAGLE", "NEXTN"} and not model.mtp_layers and not args.speculative_draft_model_path:
        raise StartupError(f"{algo} needs --speculative-draft-model-path: this model has no MTP layers.")
    steps = args.speculative_num_steps or 3
    topk = args.speculative_eagle_topk or 1
    draft = steps + 1 if topk == 1 else (args.speculative_num_draft_tokens or steps + 1)
    if steps < 1 or topk < 1:
        raise StartupError("speculative_num_steps and speculative_eagle_topk must be positive.")
    return steps, topk, draft


def _quant_compatible(requested: str, method: str) -> bool:
    """configs/model_config.py `_verify_quantization`: a CLI method the checkpoint's method allows."""
    return requested == method or requested.startswith(method) or method.startswith(requested)


def _weight_format(args: argparse.Namespace, model: ModelInfo) -> tuple[float, float, Lossy]:
    """(dense bytes/param, expert bytes/param, lossy) for the checkpoint and `--quantization`."""
    q, requested = model.quant, args.quantization
    if requested is None or requested == "unquant":
        return q.dense_bytes, q.expert_bytes, None
    if q.method is not None:
        if not _quant_compatible(requested, q.method):
            raise StartupError(
                "ValueError: Quantization method specified in the model config "
                f"({q.method}) does not match the quantization method specified in the "
                f"`quantization` argument ({requested})."
            )
        return q.dense_bytes, q.expert_bytes, None
    if requested in ("fp8", "w8a8_fp8"):
        return 1.0, 1.0, "drift"  # online FP8 quantization of a BF16 checkpoint: not bit-exact
    # Pre-quantized formats need their packed tensors (qweight/scales) in the checkpoint.
    raise StartupError(
        f"KeyError: --quantization {requested} needs a {requested}-quantized checkpoint; "
        f"{model.name} is BF16 (no 'qweight' tensors).",
        after_load=True,
    )


def _sized(model: ModelInfo, dense_bytes: float, expert_bytes: float) -> ModelInfo:
    """`model` with the weight format in force (online quantization changes it)."""
    if (dense_bytes, expert_bytes) == (model.quant.dense_bytes, model.quant.expert_bytes):
        return model
    return replace(model, quant=replace(model.quant, dense_bytes=dense_bytes, expert_bytes=expert_bytes))


def resolve_plan(args: argparse.Namespace, scenario: Scenario, model: ModelInfo) -> Plan:
    """Resolve parsed `launch_server` flags on the scenario's hardware, or raise `StartupError`.

    One piece because it follows SGLang's start-up in order: each refusal is raised where SGLang
    raises it (the first error a bad launch hits is SGLang's first), and each resolved value (chunk,
    max batch, memory fraction) feeds the memory budget below it.
    """
    hw, tp = scenario.hardware, args.tp_size
    if tp > hw.count:
        raise StartupError(
            f"RuntimeError: CUDA error: invalid device ordinal (--tp-size {tp} > {hw.count} GPUs)."
        )
    if model.q_heads % tp:
        raise StartupError(
            f"AssertionError: num_attention_heads ({model.q_heads}) must be divisible by tp_size {tp}."
        )
    try:
        backend = attention_backend(args, hw.sm, model)
        moe = moe_runner(args, hw.sm, model, hw.driver_version)
    except KernelError as e:
        raise StartupError(str(e), after_load=e.after_load) from e
    steps, topk, draft = _speculative(args, model)
    dense_bytes, expert_bytes, lossy = _weight_format(args, model)
    kv = args.kv_cache_dtype
    if kv == "nvfp4" and hw.sm not in (100, 103, 120):
        # arg_groups/kv_cache_hook.py
        raise StartupError("RuntimeError: --kv-cache-dtype=nvfp4 requires Blackwell SM100 or SM120.")
    if kv in {"fp4_mx_block16", "mxfp8"} and hw.sm not in (100, 103):
        raise StartupError(f"--kv-cache-dtype {kv} requires an SM100-family GPU.")
    if kv == "auto":
        # mem_cache/kv_cache_dtype.py: a checkpoint with an FP8 KV scale gets an FP8 cache
        kv_bytes = 1.0 if model.quant.kv_fp8 else 2.0
    else:
        kv_bytes = {"nvfp4": 0.5625, "fp4_mx_block16": 0.5625}.get(
            kv, 1.0 if kv.startswith(("fp8", "mxfp8")) else 2.0
        )
        if kv_bytes < (1.0 if model.quant.kv_fp8 else 2.0):
            lossy = "drift"  # fewer KV bits than the checkpoint's own cache: output drifts
    weight_scale = 2.0 if args.dtype in ("float", "float32") else 1.0
    if args.dtype in ("half", "float16") and model.architecture.startswith("Qwen3"):
        lossy = "garbage"  # Qwen3 activations overflow fp16; logits become NaN-driven noise
    chunk_default, max_bs_default = _gpu_mem_defaults(hw.memory_mib, tp)
    chunk = args.chunked_prefill_size or chunk_default
    chunk = chunk if chunk > 0 else 1 << 30
    graphs_off = args.disable_cuda_graph or args.disable_decode_cuda_graph
    graphs_off = graphs_off or args.cuda_graph_backend_decode == "disabled"
    max_bs = args.cuda_graph_max_bs_decode or max_bs_default
    if args.cuda_graph_max_bs_decode is None and args.max_running_requests:
        max_bs = min(max_bs, args.max_running_requests)
    mem = hw.memory_mib * 2**20
    reserved_mb = 512 + max(chunk if chunk < 1 << 30 else 16384, 2048) * 1.5 + tp / 8 * 1024 + max_bs * 2
    if mem / 2**20 > 60 * 1024:
        reserved_mb = max(reserved_mb, 10 * 1024)
    mfs = args.mem_fraction_static or round((mem / 2**20 - reserved_mb) / (mem / 2**20), 3)
    sized = _sized(model, dense_bytes, expert_bytes)
    weights = sized.weight_bytes(extra_dense_layers=model.mtp_layers, bf16_scale=weight_scale) / tp
    kv_budget = mfs * mem - weights
    if kv_budget < 1 * 2**30:
        # model_executor/pool_configurator.py
        raise StartupError(
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", after_load=True
        )
    graph_mb = 0 if graphs_off else max_bs * 2
    headroom_mb = (1 - mfs) * mem / 2**20 - graph_mb - 512 - tp / 8 * 1024
    headroom_tokens = int(headroom_mb / 1.0)  # the 1.5 MB/token reserve of memory_hook.py has slack
    if headroom_tokens < 64:
        raise StartupError(
            "torch.OutOfMemoryError: CUDA out of memory while capturing CUDA graphs.", after_load=True
        )
    ar_backend = args.flashinfer_allreduce_fusion_backend
    if ar_backend is None and args.enable_flashinfer_allreduce_fusion:
        ar_backend = "auto"  # arg_groups/serving_hook.py: deprecated alias
    if ar_backend is None and model.architecture in AR_FUSION_ARCHS and hw.sm in (90, 100) and tp > 1:
        ar_backend = "auto"  # arg_groups/overrides.py auto-enable
    if args.enforce_disable_flashinfer_allreduce_fusion:
        ar_backend = None
    ar_fusion = ar_backend is not None and tp > 1
    if ar_fusion and hw.sm not in (90, 100, 103):
        # layers/flashinfer_comm_fusion.py _resolve_backend, called from pre_initialize_workspaces
        raise StartupError(
            "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.", after_load=True
        )
    fused_moe_sum = (
        args.enable_fused_moe_sum_all_reduce and moe.kernel == "triton" and model.experts_per_tok > 2
    )
    compile_bs = (args.torch_compile_max_bs or 32) if args.enable_torch_compile else 0
    hangs = bool(compile_bs) and model.linear_attn_layers > 0
    return Plan(
        tp=tp,
        attention_backend=backend,
        moe_runner=moe.kernel,
        spec_steps=steps,
        spec_topk=topk,
        spec_draft_tokens=draft,
        cuda_graph_max_bs=0 if graphs_off else max_bs,
        chunked_prefill=chunk,
        max_running=args.max_running_requests,
        mem_fraction_static=mfs,
        kv_dtype_bytes=kv_bytes,
        fused_moe_sum=fused_moe_sum,
        ar_fusion=ar_fusion,
        torch_compile_max_bs=compile_bs,
        mixed_chunk=args.enable_mixed_chunk,
        conservativeness=args.schedule_conservativeness,
        radix_cache=not args.disable_radix_cache,
        schedule_policy=args.schedule_policy,
        weight_bytes_per_gpu=weights,
        kv_budget_bytes=kv_budget,
        activation_headroom_tokens=headroom_tokens,
        lossy=lossy,
        hangs_in_warmup=hangs,
        extra_startup_s=(120.0 if compile_bs else 0.0) + (0.0 if graphs_off else 0.1 * min(max_bs, 512)),
        dense_speedup=compute_speedup(sized.quant, sm=hw.sm, moe_kernel=moe.kernel, experts=False),
        expert_speedup=compute_speedup(sized.quant, sm=hw.sm, moe_kernel=moe.kernel, experts=True),
        dense_weight_bytes=dense_bytes,
        expert_weight_bytes=expert_bytes,
        resolved=resolved_server_args(
            args,
            model,
            sm=hw.sm,
            backend=backend,
            moe_reported=moe.reported,
            chunk=chunk,
            mfs=mfs,
            max_bs=0 if graphs_off else max_bs,
            spec=(steps, topk, draft),
            ar_backend=ar_backend if ar_fusion else None,
            compile_bs=compile_bs,
        ),  # fmt: skip
    )
