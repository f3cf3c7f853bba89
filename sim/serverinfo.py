"""Server args as SGLang 0.5.23 reports them once resolved (`/get_server_info`, `internal_states`).

`ServerArgs.resolved_dict()` (server_args.py) puts the resolution result of every field at the
top level: defaults left `None` on the command line come back filled in (attention backend,
chunked prefill size, memory fraction, speculative settings, ...). `build_server_info`
(utils/common.py) adds the scheduler's `max_total_num_tokens`/`max_req_input_len`, and each
`internal_states` entry (managers/scheduler_components/internal_state.py) repeats the resolved args
plus live state (`effective_max_running_requests_per_dp`, `memory_usage`, `last_gen_throughput`).
"""

from __future__ import annotations

import argparse
from typing import Any

from sim.modelinfo import ModelInfo


def resolved_server_args(
    args: argparse.Namespace,
    model: ModelInfo,
    *,
    sm: int,
    backend: str,
    moe_reported: str,
    chunk: int,
    mfs: float,
    max_bs: int,
    spec: tuple[int, int, int],
    ar_backend: str | None,
    compile_bs: int,
) -> dict[str, Any]:
    """The fields start-up resolution changes, with the values SGLang would hold after it."""
    out: dict[str, Any] = {
        # a GPU host: get_device() -> "cuda", any index stripped (arg_groups/serving_hook.py:648-659)
        "device": (args.device or "cuda").split(":")[0],
        "attention_backend": backend,
        "sampling_backend": args.sampling_backend or "flashinfer",
        "moe_runner_backend": moe_reported if model.is_moe else args.moe_runner_backend,
        "chunked_prefill_size": chunk if chunk < 1 << 30 else -1,
        "mem_fraction_static": mfs,
        # trtllm_mha snaps the page size to 64 (arg_groups/overrides.py _mla_backend_page_constraints)
        "page_size": args.page_size or (64 if backend == "trtllm_mha" else 1),
        "flashinfer_allreduce_fusion_backend": ar_backend,
        "torch_compile_max_bs": compile_bs or args.torch_compile_max_bs,
        "cuda_graph_config": {
            "decode": {"backend": "full" if max_bs else "disabled", "max_bs": max_bs or None},
            "prefill": {"backend": "disabled"},
        },
    }
    if model.sliding_attn_layers:
        out["swa_full_tokens_ratio"] = args.swa_full_tokens_ratio or 0.8  # fields/schedule.py fallback
    if model.architecture == "GptOssForCausalLM" and model.quant.method == "mxfp4":
        out["dtype"] = "bfloat16"  # _gpt_oss_overrides: bf16 activations for the MXFP4 kernels
    if model.architecture.startswith(("Qwen3", "Qwen3_5")) and sm in (100, 103) and model.quant.method:
        out["quantization"] = args.quantization or model.quant.method  # _qwen3_moe_family_overrides
    if args.speculative_algorithm:
        steps, topk, draft = spec
        out |= {"speculative_num_steps": steps, "speculative_eagle_topk": topk}
        out["speculative_num_draft_tokens"] = draft
    return out


def server_info(
    args: argparse.Namespace, resolved: dict[str, Any], *, version: str, live: dict[str, Any]
) -> dict[str, Any]:
    """The `/get_server_info` body: resolved args at the top level, live state per DP rank."""
    top = {k: v for k, v in {**vars(args), **resolved}.items() if k != "config"}  # `--config` is no field
    sizes = {
        k: live[k] for k in ("max_total_num_tokens", "max_req_input_len")
    }  # the scheduler's, top level only
    state = {**top, **{k: v for k, v in live.items() if k not in sizes}}
    return {
        **top,
        "launch_command": None,
        **sizes,
        "internal_states": [state],
        "version": version,
        "frontend": "python",
    }
