"""Attention backend and MoE runner defaults per GPU and checkpoint, as SGLang 0.5.23 resolves them."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from sim.offline import offline_throughput, plan_for
from sim.perf import PerfModel
from sim.plan import StartupError
from sim.scenario import load_scenario
from tests.test_sim_quant import SHARED


def _on_sm(scenario: str, sm: int, count: int | None = None):  # type: ignore[no-untyped-def]
    """The scenario moved to another GPU generation (same memory and speeds)."""
    scn = load_scenario(scenario)
    hw = scn.hardware.model_copy(update={"sm": sm, "count": count or scn.hardware.count})
    return scn.model_copy(update={"hardware": hw})


def _without(scenario: str, flag: str) -> list[str]:
    """The scenario's baseline flags without `flag` and its value."""
    flags = list(load_scenario(scenario).launch.flags)
    i = flags.index(flag)
    return flags[:i] + flags[i + 2 :]


@pytest.mark.parametrize(
    ("sm", "backend"),
    [(120, "flashinfer"), (90, "fa3"), (100, "trtllm_mha")],  # SM100 hybrid: _qwen3_5_hybrid_overrides
)
def test_default_attention_backend_of_the_hybrid_seed_model(sm: int, backend: str) -> None:
    flags = _without("seed", "--attention-backend")
    flags = flags[: flags.index("--speculative-algorithm")]  # no speculation
    assert plan_for(_on_sm("seed", sm), flags, replace_baseline=True)[2].attention_backend == backend
    if sm == 100:  # without the overlap schedule the mamba cache has no extra buffer: triton
        flags += ["--disable-overlap-schedule"]
        assert plan_for(_on_sm("seed", sm), flags, replace_baseline=True)[2].attention_backend == "triton"


def test_deepseek_v3_mla_defaults(tmp_path: Path) -> None:
    (tmp_path / "DeepSeek-V3").mkdir()
    shutil.copy(SHARED / "deepseek-ai--DeepSeek-V3_config.json", tmp_path / "DeepSeek-V3" / "config.json")
    base = _on_sm("h200-qwen30b", 90, count=8)
    scn = base.model_copy(
        update={"model": base.model.model_copy(update={"config": str(tmp_path / "DeepSeek-V3")})}
    )
    hopper = plan_for(scn, ["--tp-size", "8"], replace_baseline=True)[2]
    assert hopper.attention_backend == "fa3" and hopper.moe_runner == "triton"
    assert hopper.dense_speedup == 2.0  # block-FP8 W8A8 on Hopper tensor cores
    hw = scn.hardware.model_copy(update={"sm": 100})
    blackwell = plan_for(scn.model_copy(update={"hardware": hw}), ["--tp-size", "8"], replace_baseline=True)
    assert blackwell[2].attention_backend == "trtllm_mla"  # model_overrides/deepseek_v2.py
    # MLA caches one 576-wide latent per layer (BF16), the same on every TP rank.
    assert PerfModel(hopper, blackwell[1], scn).kv_bytes_per_token == 61 * 576 * 2


def test_default_attention_backend_of_dense_and_fp8_models() -> None:
    assert plan_for("rtx6000-qwen235b-fp8")[2].attention_backend == "flashinfer"  # SM120
    assert plan_for("h100x4-llama70b")[2].attention_backend == "fa3"  # Hopper, no spec
    assert plan_for(_on_sm("h100x4-llama70b", 100))[2].attention_backend == "trtllm_mha"
    assert plan_for("b200-gptoss120b")[2].attention_backend == "trtllm_mha"
    assert plan_for(_on_sm("b200-gptoss120b", 120))[2].attention_backend == "triton"  # gpt-oss override


@pytest.mark.parametrize(
    ("sm", "reported", "kernel"),
    [(100, "flashinfer_mxfp4", "flashinfer_mxfp4"), (120, "flashinfer_mxfp4", "flashinfer_mxfp4"),
     (90, "triton_kernel", "triton_kernel")],
)  # fmt: skip
def test_gpt_oss_moe_runner_follows_mxfp4_and_gpu(sm: int, reported: str, kernel: str) -> None:
    plan = plan_for(_on_sm("b200-gptoss120b", sm), ["--attention-backend", "triton"])[2]
    assert (plan.resolved["moe_runner_backend"], plan.moe_runner) == (reported, kernel)
    assert plan.resolved["dtype"] == "bfloat16"


def test_fused_moe_sum_only_where_the_triton_moe_runs() -> None:
    # gpt-oss on B200 runs flashinfer_mxfp4 (and has top-4 routing): the flag does nothing.
    assert not plan_for("b200-gptoss120b", ["--enable-fused-moe-sum-all-reduce"])[2].fused_moe_sum
    assert offline_throughput(
        "b200-gptoss120b", ["--enable-fused-moe-sum-all-reduce"], concurrency=8
    ) == offline_throughput("b200-gptoss120b", concurrency=8)
    # The FP8 Qwen3 MoE runs Triton fused_moe with block scales: active, and it helps.
    assert plan_for("rtx6000-qwen235b-fp8", ["--enable-fused-moe-sum-all-reduce"])[2].fused_moe_sum


def test_moe_runner_choices_by_checkpoint() -> None:
    # An explicit flashinfer_mxfp4 is fine on the MXFP4 checkpoint, refused on FP8 and BF16 ones.
    assert plan_for("b200-gptoss120b", ["--moe-runner-backend", "flashinfer_mxfp4"])[2].moe_runner == (
        "flashinfer_mxfp4"
    )
    for scenario in ("rtx6000-qwen235b-fp8", "h200-qwen30b"):
        with pytest.raises(StartupError, match="needs an MXFP4 checkpoint"):
            plan_for(scenario, ["--moe-runner-backend", "flashinfer_mxfp4"])
    # Qwen3 MoE on SM100: _qwen3_moe_family_overrides picks flashinfer_trtllm.
    on_b200 = plan_for(_on_sm("h200-qwen30b", 100), ["--tp-size", "2"], replace_baseline=True)[2]
    assert (on_b200.moe_runner, on_b200.attention_backend) == ("flashinfer_trtllm", "trtllm_mha")
    with pytest.raises(StartupError, match="does not match the quantization method"):
        plan_for("rtx6000-qwen235b-fp8", ["--quantization", "awq"])


def test_mxfp4_experts_run_faster_on_the_flashinfer_kernel() -> None:
    # Same bytes, but MXFP8 x MXFP4 tensor cores vs BF16 dequantization: matters once compute-bound.
    fast = offline_throughput("b200-gptoss120b", ["--cuda-graph-max-bs-decode", "64"], concurrency=64)
    slow = offline_throughput(
        "b200-gptoss120b",
        ["--cuda-graph-max-bs-decode", "64", "--moe-runner-backend", "triton_kernel"],
        concurrency=64,
    )
    assert fast > 1.02 * slow


def test_sliding_window_layers_do_not_grow_with_context() -> None:
    scn, model, plan = plan_for("b200-gptoss120b")
    perf = PerfModel(plan, model, scn)
    all_full = PerfModel(plan, replace(model, full_attn_layers=model.layers, sliding_attn_layers=0), scn)
    assert perf.kv_bytes_per_token == model.full_attn_layers * 2 * model.kv_heads * model.head_dim * 2
    assert perf.kv_bytes_per_token == all_full.kv_bytes_per_token / 2  # 18 of 36 layers slide

    def growth(p: PerfModel) -> float:  # extra time of one decode step at 100k vs 1k context
        return p.forward_s(1, 1, 100_000, layers=model.layers, graphed=True) - p.forward_s(
            1, 1, 1_000, layers=model.layers, graphed=True
        )

    assert growth(perf) == pytest.approx(growth(all_full) / 2, rel=0.05)
    # The sliding layers' pool holds swa_full_tokens_ratio (0.8) x the full pool's tokens.
    assert perf.kv_capacity_tokens() / all_full.kv_capacity_tokens() == pytest.approx(2 / 1.8, rel=0.01)
