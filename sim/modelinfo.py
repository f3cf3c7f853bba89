"""Model facts the performance model needs, read from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUNDLED_MODELS = Path(__file__).with_name("models")


class ModelConfigError(Exception):
    """A config.json that is missing or lacks a field the simulator needs."""


@dataclass(frozen=True)
class ModelInfo:
    """Sizes of one model, in parameters and bytes (BF16 weights)."""

    name: str
    architecture: str
    hidden: int
    layers: int
    full_attn_layers: int
    linear_attn_layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    num_experts: int
    experts_per_tok: int
    expert_params: int
    """Parameters of one routed expert in one layer."""
    dense_params_per_layer: int
    """Attention + shared expert / dense MLP + router of one average layer."""
    lm_head_params: int
    linear_state_bytes_per_layer: int
    """Recurrent state of one request in one linear-attention layer (fp32)."""
    mtp_layers: int
    max_context: int
    eos_token_id: int

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def total_params(self) -> int:
        experts = self.layers * self.num_experts * self.expert_params
        return self.layers * self.dense_params_per_layer + experts + 2 * self.lm_head_params

    @property
    def active_params(self) -> int:
        experts = self.layers * self.experts_per_tok * self.expert_params
        return self.layers * self.dense_params_per_layer + experts + self.lm_head_params


def _need(cfg: dict[str, Any], key: str, path: str) -> Any:
    if key not in cfg:
        raise ModelConfigError(f"{path}: config.json has no {key!r}")
    return cfg[key]


def model_info(config: dict[str, Any], *, name: str = "model", path: str = "config.json") -> ModelInfo:
    """Derive `ModelInfo` from a config dict (plain or with a nested `text_config`)."""
    arch = (config.get("architectures") or ["unknown"])[0]
    cfg = config.get("text_config") or config
    hidden = int(_need(cfg, "hidden_size", path))
    layers = int(_need(cfg, "num_hidden_layers", path))
    q_heads = int(_need(cfg, "num_attention_heads", path))
    kv_heads = int(cfg.get("num_key_value_heads", q_heads))
    head_dim = int(cfg.get("head_dim") or hidden // q_heads)
    vocab = int(_need(cfg, "vocab_size", path))
    kinds = cfg.get("layer_types") or ["full_attention"] * layers
    linear = sum(1 for k in kinds if k == "linear_attention")
    full = layers - linear
    gate = 2 if cfg.get("attn_output_gate") else 1
    full_attn = (
        hidden * q_heads * head_dim * gate + 2 * hidden * kv_heads * head_dim + q_heads * head_dim * hidden
    )
    lk, lv = int(cfg.get("linear_key_head_dim", 128)), int(cfg.get("linear_value_head_dim", 128))
    lkh, lvh = int(cfg.get("linear_num_key_heads", 16)), int(cfg.get("linear_num_value_heads", 32))
    lin_attn = hidden * (2 * lkh * lk + 3 * lvh * lv) + lvh * lv * hidden
    attn = (full * full_attn + linear * lin_attn) // layers
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0)
    if experts:
        topk = int(_need(cfg, "num_experts_per_tok", path))
        expert = 3 * hidden * int(_need(cfg, "moe_intermediate_size", path))
        shared_inter = int(cfg.get("shared_expert_intermediate_size") or 0)
        mlp = 3 * hidden * shared_inter + hidden * experts
    else:
        topk, expert = 0, 0
        mlp = 3 * hidden * int(_need(cfg, "intermediate_size", path))
    mtp = int(cfg.get("mtp_num_hidden_layers") or cfg.get("num_nextn_predict_layers") or 0)
    eos = cfg.get("eos_token_id", config.get("eos_token_id", 2))
    return ModelInfo(
        name=name,
        architecture=arch,
        hidden=hidden,
        layers=layers,
        full_attn_layers=full,
        linear_attn_layers=linear,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=vocab,
        num_experts=experts,
        experts_per_tok=topk,
        expert_params=expert,
        dense_params_per_layer=attn + mlp,
        lm_head_params=vocab * hidden,
        linear_state_bytes_per_layer=lvh * lk * lv * 4,
        mtp_layers=mtp,
        max_context=int(cfg.get("max_position_embeddings", 32768)),
        eos_token_id=int(eos[0] if isinstance(eos, list) else eos),
    )


def load_model_info(model_path: str) -> ModelInfo:
    """Read `config.json` in `model_path`; a bare bundled name (`Qwen3-30B-A3B`) also works."""
    path = Path(model_path)
    candidates = [path / "config.json", BUNDLED_MODELS / path.name / "config.json"]
    for cfg_path in candidates:
        if cfg_path.is_file():
            try:
                config = json.loads(cfg_path.read_text())
            except json.JSONDecodeError as e:
                raise ModelConfigError(f"{cfg_path}: not valid JSON: {e}") from e
            return model_info(config, name=path.name, path=str(cfg_path))
    raise ModelConfigError(
        f"Can't load the configuration of '{model_path}'. It is not a local folder with a "
        "config.json, and the simulator has no bundled model of that name."
    )
