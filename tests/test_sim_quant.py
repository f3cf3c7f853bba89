"""Real model configs load, and quantized checkpoints change memory, speed and kernels as physics says."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sim.modelinfo import ModelConfigError, load_model_info, model_info
from sim.offline import offline_throughput, plan_for
from sim.perf import PerfModel
from sim.plan import StartupError
from sim.scenario import Scenario, load_scenario

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "model-configs"
CONFIGS = sorted(SHARED.glob("*_config.json"))
# Published sizes (total, active) in billions for the names that do not carry them.
PUBLISHED = {"DeepSeek-V3": (671, 37), "Mixtral-8x7B-v0.1": (46.7, 12.9), "gpt-oss-120b": (117, 5.1)}


def _published(name: str) -> tuple[float, float | None]:
    for key, sizes in PUBLISHED.items():
        if key in name:
            return sizes
    total = re.search(r"-(\d+(?:\.\d+)?)B", name)
    active = re.search(r"-A(\d+(?:\.\d+)?)B", name)
    assert total, f"no size in {name}"
    return float(total.group(1)), float(active.group(1)) if active else None


def test_the_shared_config_folder_is_there() -> None:
    assert len(CONFIGS) >= 12, f"expected the shared model configs in {SHARED}"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name.split("_")[0])
def test_every_shared_config_loads_with_its_published_size(path: Path) -> None:
    info = model_info(json.loads(path.read_text()), name=path.stem, path=str(path))
    total, active = _published(path.stem)
    assert info.total_params / 1e9 == pytest.approx(total, rel=0.06)
    if active is not None:
        assert info.active_params / 1e9 == pytest.approx(active, rel=0.12)
    assert 0 < info.full_attn_layers <= info.layers


def test_layer_kinds_of_real_configs() -> None:
    gpt = model_info(json.loads((SHARED / "openai--gpt-oss-120b_config.json").read_text()))
    assert (gpt.full_attn_layers, gpt.sliding_attn_layers, gpt.sliding_window) == (18, 18, 128)
    assert (gpt.num_experts, gpt.experts_per_tok, gpt.quant.method) == (128, 4, "mxfp4")
    ds = model_info(json.loads((SHARED / "deepseek-ai--DeepSeek-V3_config.json").read_text()))
    assert ds.mla_kv_dim == 512 + 64 and ds.moe_layers == 61 - 3 and ds.quant.method == "fp8"


def _variant(tmp_path: Path, scenario: str, edit: Callable[[dict[str, Any]], None]) -> Scenario:
    """`scenario` with its model's config.json changed by `edit` (a copy in tmp_path)."""
    scn = load_scenario(scenario)
    config = json.loads((scn.model_dir / "config.json").read_text())
    edit(config)
    model_dir = tmp_path / f"{scn.model_dir.name}-{len(list(tmp_path.iterdir()))}"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(config))
    return scn.model_copy(update={"model": scn.model.model_copy(update={"config": str(model_dir)})})


def _fp8(config: dict[str, Any]) -> None:
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}


def _awq(config: dict[str, Any]) -> None:
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}


def _bf16(config: dict[str, Any]) -> None:
    config.pop("quantization_config", None)


def test_mxfp4_is_what_lets_gpt_oss_start_on_one_b200(tmp_path: Path) -> None:
    _, model, plan = plan_for("b200-gptoss120b")
    # The published checkpoint is ~65 GB: experts at 4.25 bits, attention/embeddings in BF16.
    assert plan.weight_bytes_per_gpu / 1e9 == pytest.approx(65, rel=0.05)
    assert plan.weight_bytes_per_gpu < 0.3 * model.total_params * 2
    with pytest.raises(StartupError, match="Not enough memory"):
        plan_for(_variant(tmp_path, "b200-gptoss120b", _bf16))


def test_fp8_and_int4_weights_scale_memory_and_speed(tmp_path: Path) -> None:
    bf16 = plan_for("h200-qwen30b")
    fp8 = plan_for(_variant(tmp_path, "h200-qwen30b", _fp8))
    awq = plan_for(_variant(tmp_path, "h200-qwen30b", _awq))
    # Memory: one byte (FP8) / ~half a byte (int4 + group scales) per quantized weight, BF16 lm_head.
    assert 0.5 < fp8[2].weight_bytes_per_gpu / bf16[2].weight_bytes_per_gpu < 0.53
    assert 0.26 < awq[2].weight_bytes_per_gpu / bf16[2].weight_bytes_per_gpu < 0.30
    assert fp8[2].kv_budget_bytes > bf16[2].kv_budget_bytes

    dense = plan_for("h100-llama8b")
    dense_fp8 = plan_for(_variant(tmp_path, "h100-llama8b", _fp8))
    dense_awq = plan_for(_variant(tmp_path, "h100-llama8b", _awq))

    def decode_s(p: tuple[Scenario, Any, Any]) -> float:
        return PerfModel(p[2], p[1], p[0]).decode_cost(1, 1024).seconds

    def prefill_s(p: tuple[Scenario, Any, Any]) -> float:  # 8k tokens: tensor-core bound
        return PerfModel(p[2], p[1], p[0]).prefill_s(8192, 8, 0)

    # Batch-1 decode of a dense 8B model is weight reads: FP8 reads ~0.57x the bytes (BF16 lm_head
    # and embeddings), int4 less still; step overhead and launches do not shrink.
    assert 1.4 < decode_s(dense) / decode_s(dense_fp8) < 1.0 / 0.565
    assert decode_s(dense_awq) < decode_s(dense_fp8)
    # A 3B-active MoE on two GPUs spends most of a step on fixed costs: FP8 gains less there.
    assert 1.0 < decode_s(bf16) / decode_s(fp8) < decode_s(dense) / decode_s(dense_fp8)
    # Prefill: W8A8 FP8 runs the FP8 tensor cores (2x); W4A16 int4 dequantizes to BF16 (no gain).
    # On one GPU the GEMMs are nearly all of it; with TP 2 the all-reduces of 8k tokens are not.
    assert 1.6 < prefill_s(dense) / prefill_s(dense_fp8) < 2.05
    assert 1.3 < prefill_s(bf16) / prefill_s(fp8) < prefill_s(dense) / prefill_s(dense_fp8)
    assert prefill_s(awq) == pytest.approx(prefill_s(bf16), rel=0.05)
    c1 = offline_throughput(dense_fp8[0], concurrency=1)
    assert c1 > 1.3 * offline_throughput("h100-llama8b", concurrency=1)


def test_checkpoint_fp8_kv_scale_makes_auto_kv_fp8(tmp_path: Path) -> None:
    def fp8_kv(config: dict[str, Any]) -> None:
        _fp8(config)
        config["quantization_config"]["kv_cache_quant_algo"] = "FP8"

    scn, model, plan = plan_for(_variant(tmp_path, "h100-llama8b", fp8_kv))
    assert plan.kv_dtype_bytes == 1 and plan.lossy is None  # the checkpoint's own calibration
    assert plan_for(scn, ["--kv-cache-dtype", "fp8_e4m3"])[2].lossy is None  # the same cache
    bf16_kv = plan_for(scn, ["--kv-cache-dtype", "bfloat16"])[2]
    assert bf16_kv.kv_dtype_bytes == 2 and bf16_kv.kv_budget_bytes == plan.kv_budget_bytes
    fp8_tokens = PerfModel(plan, model, scn).kv_capacity_tokens()
    assert fp8_tokens == pytest.approx(2 * PerfModel(bf16_kv, model, scn).kv_capacity_tokens(), abs=2)
    _, _, explicit = plan_for("h100-llama8b", ["--kv-cache-dtype", "fp8_e4m3"])
    assert explicit.lossy == "drift"


def test_unknown_quant_method_is_a_clear_error(tmp_path: Path) -> None:
    config = json.loads((load_scenario("h100-llama8b").model_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitnet"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match="'bitnet' is not simulated"):
        load_model_info(str(tmp_path))
